"""The proxy's layers as the tree shows them (proxy/__init__.py, docs/architecture.md): every module imports only its
own layer and the ones below it, no API's package imports another API's, no API module imports backends/ or
transport/ (they are reached through engine/ and tools/), a tool imports no API, backends/'s rooms (search, pages,
state) import only downward too, and no modules import each other in a circle; and no module defines a name nothing
uses. Read from the source with ast, function-level imports
included; no network.

Run: tests/run.sh tests/test_layers.py
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROXY = ROOT / "proxy"
# Top to bottom: a module may import its own layer and any layer after it in this list.
LAYERS = ("http", "observe", "apis", "engine", "tools", "backends", "transport", "runtime", "core")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The proxy modules a file imports (`from proxy.x import y` counts proxy.x.y when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("proxy.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("proxy") and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return found - {"proxy"}


MODULES = {module_name(p): p for p in PROXY.rglob("*.py")}
GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def test_every_module_lives_in_a_layer():
    loose = sorted(m for m in MODULES if m != "proxy" and layer_of(m) not in LAYERS)
    assert not loose, f"modules outside the layer folders: {loose}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "proxy"))
def test_imports_point_down(module):
    mine = LAYERS.index(layer_of(module))
    upward = sorted(i for i in GRAPH[module] if LAYERS.index(layer_of(i)) < mine)
    assert not upward, f"{module} ({LAYERS[mine]}) imports a layer above it: {upward}"


def test_no_api_imports_another_api():
    def api(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "apis" else None
    crossing = sorted((m, i) for m in MODULES for i in GRAPH[m] if api(m) and api(i) and api(m) != api(i))
    assert not crossing, crossing


# Layers an API may not reach past: it sees the backends and the HTTP clients only through engine/ and tools/ (the
# tools' outcomes, Services, Exchange), so a change of backend or client never touches an API.
NOT_FROM_APIS = ("backends", "transport")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) == "apis"))
def test_apis_reach_backends_and_transport_only_through_engine_and_tools(module):
    reached = sorted(i for i in GRAPH[module] if layer_of(i) in NOT_FROM_APIS)
    assert not reached, f"{module} imports {reached}: use the façade in proxy/engine or proxy/tools"


# backends/ is three rooms, top to bottom: a room imports its own modules and those of the rooms after it (search
# reads the domain filters in pages and caches in state; pages caches in state; state stands on neither).
ROOMS = ("search", "pages", "state")


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "backends" else None


def test_every_backends_module_lives_in_a_room():
    loose = sorted(m for m in MODULES if layer_of(m) == "backends" and m != "proxy.backends" and room_of(m) not in ROOMS)
    assert not loose, f"backends modules outside the rooms {ROOMS}: {loose}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if room_of(m)))
def test_rooms_import_only_their_own_and_the_rooms_below(module):
    mine = ROOMS.index(room_of(module))
    upward = sorted(i for i in GRAPH[module] if room_of(i) and ROOMS.index(room_of(i)) < mine)
    assert not upward, f"{module} (backends/{ROOMS[mine]}/) imports a room above it: {upward}"


def test_no_import_cycles():
    """Depth-first search over the module graph; a back edge is a circle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str):
        state[m] = 1
        path.append(m)
        for n in sorted(GRAPH.get(m, ())):
            if state.get(n) == 1:
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)
    assert not cycles, cycles


def test_the_checks_see_what_they_check():
    """The graph is read at all: a known downward import is in it, so the tests above can fail."""
    assert "proxy.tools.registry" in GRAPH["proxy.tools.session"]
    assert "proxy.engine.exchange" in GRAPH["proxy.engine.loop"]
    assert "proxy.backends.state.cache" in GRAPH["proxy.backends.search.search"]  # a downward import between rooms
    assert len(MODULES) >= 40


# ---- nothing defined that nothing uses ------------------------------------------------------------------------

def python_sources() -> list[Path]:
    """Every Python file of the repository that may use the proxy's names: the package, the entry points, the
    stand-ins, the scripts, the tests (hidden folders and the tests' work folders aside)."""
    return [p for p in ROOT.rglob("*.py") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
            and "node_modules" not in p.parts]


def unused_top_level_names(sources: dict[Path, str], package: list[Path]) -> list[str]:
    """Each module-level function, class or constant of `package` whose name appears nowhere but where it is
    defined: dead code a reader would study for nothing. A name written once in all `sources` is its definition.
    Pure."""
    words: dict[str, int] = {}
    for text in sources.values():
        for word in re.findall(r"\b[A-Za-z_]\w*\b", text):
            words[word] = words.get(word, 0) + 1
    unused = []
    for path in package:
        for node in ast.parse(sources[path]).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                names = []
            unused += [f"{path.relative_to(ROOT)}:{name}" for name in names if words.get(name, 0) <= 1]
    return unused


def test_no_module_defines_what_nothing_uses():
    sources = {p: p.read_text() for p in python_sources()}
    assert unused_top_level_names(sources, sorted(PROXY.rglob("*.py"))) == []


def test_the_unused_name_check_finds_one():
    module = ROOT / "proxy" / "made_up.py"
    sources = {module: 'PDF_TYPE = "application/pdf"\nUSED = 1\n\ndef is_pdf(b):\n    return USED\n'}
    assert unused_top_level_names(sources, [module]) == ["proxy/made_up.py:PDF_TYPE", "proxy/made_up.py:is_pdf"]


# ---- docs/architecture.md names the tree as it is ---------------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def named_paths(doc: str) -> list[str]:
    """Each module path the page names in backticks (`http/team.py`, `proxy/tools/base.py`, `proxy.http.app`), as
    written; paths inside the vLLM image (absolute) aside. Pure."""
    found = []
    for token in re.findall(r"`([^`\s]+)`", doc):
        path = re.fullmatch(r"([\w./-]+\.py)(?:[:.]\w+)*", token)
        if path and not path.group(1).startswith("/"):
            found.append(path.group(1))
        elif re.fullmatch(r"proxy(\.\w+)+", token):
            found.append(token)
    return found


def exists(name: str) -> bool:
    """Whether a path the page names is in the tree: from the repository, from proxy/ or from proxy/apis/ (the page
    names `http/team.py` and `chat/rules.py`), a bare file name anywhere; a dotted name when a prefix of it is a module
    (the rest its attributes)."""
    if name.endswith(".py"):
        if "/" not in name:
            return any(p.name == name for p in python_sources())
        return any((base / name).is_file() for base in (ROOT, PROXY, PROXY / "apis"))
    parts = name.split(".")
    return any(ROOT.joinpath(*parts[:k]).with_suffix(".py").is_file() or ROOT.joinpath(*parts[:k], "__init__.py").is_file()
               for k in range(len(parts), 1, -1))


def test_every_module_the_architecture_page_names_exists():
    names = named_paths(ARCHITECTURE.read_text())
    assert len(names) > 50  # the page names the tree throughout; a change of its style must not empty this test
    assert sorted({n for n in names if not exists(n)}) == []


def test_the_module_checks_see_a_missing_one():
    doc = "`http/team.py`, `engine/gone.py`, `proxy.http.app.create_app`, `proxy.nowhere`, `/opt/x/plugin.py`"
    assert named_paths(doc) == ["http/team.py", "engine/gone.py", "proxy.http.app.create_app", "proxy.nowhere"]
    assert [n for n in named_paths(doc) if not exists(n)] == ["engine/gone.py", "proxy.nowhere"]


def table_rows(doc: str, first: str, module: str) -> list[tuple[str, set[str]]]:
    """The rows of a table whose first column matches `first` (one group, the folder's name): each folder and the
    modules its second column names, as `module` finds them. Pure."""
    rows = []
    for line in doc.splitlines():
        row = re.match(rf"\| {first} \| (.*?) \| ", line)
        if row:
            rows.append((row.group(1), set(re.findall(module, row.group(2)))))
    return rows


def layer_rows(doc: str) -> list[tuple[str, set[str]]]:
    """The layers table's rows: each layer and the modules and sub-packages its second column names. Pure."""
    return table_rows(doc, r"`(\w+)/`", r"`(\w+(?:\.py|/))`")


def test_the_layers_table_lists_each_layer_in_order_with_exactly_its_modules():
    rows = layer_rows(ARCHITECTURE.read_text())
    assert tuple(layer for layer, _ in rows) == LAYERS
    for layer, named in rows:
        tree = {p.name + ("/" if p.is_dir() else "") for p in (PROXY / layer).iterdir()
                if p.name not in ("__init__.py", "__pycache__")}
        assert named == tree, f"{layer}/: the page names {sorted(named - tree)} the tree lacks, lacks {sorted(tree - named)}"


def room_rows(doc: str) -> list[tuple[str, set[str]]]:
    """The backends rooms table's rows (`backends/search/` ...): each room and the modules its second column names.
    Pure."""
    return table_rows(doc, r"`backends/(\w+)/`", r"`(\w+\.py)`")


def test_the_rooms_table_lists_each_backends_room_in_order_with_exactly_its_modules():
    rows = room_rows(ARCHITECTURE.read_text())
    assert tuple(room for room, _ in rows) == ROOMS
    for room, named in rows:
        tree = {p.name for p in (PROXY / "backends" / room).glob("*.py") if p.name != "__init__.py"}
        assert named == tree, f"backends/{room}/: the page names {sorted(named - tree)} the tree lacks, lacks {sorted(tree - named)}"
