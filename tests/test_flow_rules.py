"""Two rules of a request's way through the proxy (docs/architecture.md, "One request's flow" and "The route table"),
read from the source with ast, no network:

- per-request state lives in the request's Flow (proxy/engine/flow.py): only the WSGI edge writes the environ (one
  key, the flow; and WholePath's fold of SCRIPT_NAME, which is WSGI's own), so no layer hands another a value
  under an environ key;
- which API a request belongs to decides its bytes only inside proxy/apis/: outside it nothing compares a string
  with an API's shape name or reads a route's `errors`, so a new API is its package's wire and one line in
  proxy/apis/wires.py, never an edit of the engine, the key check or the error module;
- what a route is for (answered by the model, metered) is a field of its Route (proxy/core/routes.py), not a
  comparison with its API label elsewhere.

Run: tests/run.sh tests/test_flow_rules.py
"""
from __future__ import annotations

import ast
from pathlib import Path

from proxy.core import routes

ROOT = Path(__file__).resolve().parent.parent
PROXY = ROOT / "proxy"
# The edge: the one wrapper that builds each request's flow, and the app's WholePath.
EDGE = {PROXY / "http" / "flow.py", PROXY / "http" / "app.py"}
# The wire names an 'if anthropic ... else openai' switch compares against.
SHAPE_NAMES = {"anthropic", "openai", "jsonrpc"}
API_LABELS = {r.api for r in (*routes.ROUTES, routes.RELAY)}


def _names_environ(node: ast.expr) -> bool:
    """`environ`, `self.environ`, `request.environ`, `self._environ`: a WSGI environ by its name."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lstrip("_") == "environ"


def environ_writes(source: str) -> list[int]:
    """The lines that store into an environ: `environ[k] = v` (alone, chained or augmented), and its
    setdefault/update/pop/clear. Pure."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        lines += [t.lineno for t in targets if isinstance(t, ast.Subscript) and _names_environ(t.value)]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _names_environ(node.func.value)
                and node.func.attr in ("setdefault", "update", "pop", "popitem", "clear")):
            lines.append(node.lineno)
    return sorted(lines)


def _shape_name(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower() in SHAPE_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_shape_name(e) for e in node.elts)
    return isinstance(node, ast.Attribute) and node.attr == "errors"  # a route's old `errors` field


def dialect_switches(source: str) -> list[int]:
    """The lines that compare with an API's shape name (`== "anthropic"`, `in ("openai", ...)`), read a route's
    `.errors` in a comparison, or match a shape name in a `match`. Pure."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_shape_name(o) for o in (node.left, *node.comparators)):
            lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and _shape_name(node.value):
            lines.append(node.value.lineno)
    return sorted(lines)


def _label(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in API_LABELS
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_label(e) for e in node.elts)


def label_switches(source: str) -> list[int]:
    """The lines that compare with a route's API label (`api != "proxy"`, `not in ("mcp", ...)`): what a route is
    for (answered by the model, metered) is the route table's to say. Pure."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Compare) and any(_label(o) for o in (node.left, *node.comparators)))


def found(rule, paths) -> dict[str, list[int]]:
    out = {}
    for path in paths:
        hits = rule(path.read_text())
        if hits:
            out[str(path.relative_to(ROOT))] = hits
    return out


def test_only_the_edge_writes_the_environ():
    assert found(environ_writes, sorted(set(PROXY.rglob("*.py")) - EDGE)) == {}


def test_the_edge_writes_the_environ_once_per_request():
    """The edge's own writes: the flow's one key, and WholePath's PATH_INFO and SCRIPT_NAME."""
    assert sum(len(v) for v in found(environ_writes, sorted(EDGE)).values()) == 3


def test_no_dialect_switch_outside_the_apis():
    outside = sorted(p for p in PROXY.rglob("*.py") if (PROXY / "apis") not in p.parents)
    assert found(dialect_switches, outside) == {}


def test_what_a_route_is_for_is_the_route_tables():
    """Outside proxy/apis/ and the table itself, nothing compares a route's API label: metering and reading the
    model's usage go by the route's own fields."""
    outside = sorted(p for p in PROXY.rglob("*.py")
                     if (PROXY / "apis") not in p.parents and p != PROXY / "core" / "routes.py")
    assert found(label_switches, outside) == {}


def test_the_rules_see_what_they_count():
    """The counters find each form they count, so the tests above can fail."""
    writes = ("environ['proxy.key'] = 'a'\n"
              "flow = request.environ[FLOW] = make()\n"
              "self._environ['x'] += 1\n"
              "ex.environ.setdefault('y', 0)\n"
              "value = environ['z']\n"
              "environ.get('w')\n"
              "other['k'] = 1\n")
    assert environ_writes(writes) == [1, 2, 3, 4]
    switches = ("if route_of(path).errors == 'anthropic': pass\n"
                "anthropic = kind == 'anthropic'\n"
                "x = 'rate_limit_error' if shape in ('openai', 'x') else 'y'\n"
                "if 'OpenAI' != api: pass\n"
                "if route.errors: pass\n"
                "if api == 'chat': pass\n"
                "match shape:\n    case 'jsonrpc': pass\n")
    assert dialect_switches(switches) == [1, 2, 3, 4, 8]
    labels = ("if route_of(path).api != 'proxy': pass\n"
              "ok = api_of(path) not in ('alpha_search', 'x')\n"
              "if role == 'assistant': pass\n")
    assert label_switches(labels) == [1, 2]
