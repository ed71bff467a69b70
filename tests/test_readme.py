"""The README's commands must stay true: every script, port, model name, path and variable
its quick start and verify sections use exists, and CI runs its one test command. The reference it links
(docs/configuration.md, docs/testing.md, ...) is held to the same: every proxy variable documented, the test
command CI runs. And the README stays the path a new user walks: at most 500 lines, every link of it and of
docs/ resolving, no internal issue numbers where a user reads.

Run: tests/run.sh tests/test_readme.py
"""
import os
import re
from pathlib import Path

import pytest
import yaml

from proxy.core.config import variables

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def section(title: str, page: str = "README.md") -> str:
    """One `## title` section of the README, or of a page under docs/ the README links."""
    text = README if page == "README.md" else (ROOT / page).read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


QUICK = "\n".join(shell_blocks(section("Quick start")))
VERIFY = "\n".join(shell_blocks(section("Verify")))


def published_port(service: str) -> str:
    (port,) = COMPOSE["services"][service]["ports"]
    return re.search(r"\$\{[A-Z_]+:-(\d+)\}:\d+$", port).group(1)


def test_quick_start_is_one_command_and_a_check():
    # The first run is `up` alone (the model service downloads); download-model.sh is mentioned, not required.
    commands = [line.split("#")[0].strip() for line in QUICK.splitlines() if line.strip()]
    assert commands == ["docker run --rm --gpus all ubuntu nvidia-smi", "docker compose up -d --wait"]
    assert os.access(ROOT / "download-model.sh", os.X_OK)
    assert "./download-model.sh" in section("Quick start")
    assert "docker compose run --rm --no-deps preflight" in section("Quick start")
    assert "docker compose logs -f model" in section("Quick start")


def test_cpu_trial_command_names_files_that_exist():
    text = section("CPU trial")
    (command,) = shell_blocks(text)
    files = re.findall(r"-f (\S+)", command)
    assert files == ["docker-compose.yaml", "compose.cpu.yaml"]
    assert all((ROOT / f).is_file() for f in files)
    cpu = (ROOT / "compose.cpu.yaml").read_text()  # raw: its !reset/!override tags are compose's, not YAML's
    assert f"**`{re.search(r'CPU_MODEL:-([^}]+)', cpu)[1]}`**" in text
    assert re.search(r"VLLM_CPU_IMAGE:-([^}]+)", cpu)[1] in text


# Each one-line failure before vLLM's boot has its row in Troubleshooting, worded as the code words it.
@pytest.mark.parametrize("source, phrase", [
    ("scripts/vllm_preflight.py", "no nvidia-smi in the container"),
    ("scripts/vllm_preflight.py", "nvidia-smi failed ("),
    ("scripts/vllm_preflight.py", "is older than "),
    ("scripts/vllm_preflight.py", "/dev/shm is "),
    ("scripts/vllm_preflight.py", "of memory available, under VLLM_CPU_KVCACHE_SPACE"),
    ("scripts/download_model.py", "cannot reach the hub"),
    ("scripts/download_model.py", "no download record"),
    ("scripts/download_model.py", "the cache is incomplete"),
    ("scripts/download_model.py", "is gated"),
    ("scripts/download_model.py", "refused access"),
    ("scripts/download_model.py", "a private or gated repo needs HF_TOKEN"),
    ("scripts/download_model.py", "not enough disk space in "),
])
def test_every_early_failure_has_a_troubleshooting_row(source, phrase):
    assert phrase in (ROOT / source).read_text()
    assert phrase.replace("(", "") in section("Troubleshooting").replace("(", ""), phrase


@pytest.mark.parametrize("port, service", [("18080", "vllm"), ("11433", "proxy")])
def test_verify_ports_are_the_published_ones(port, service):
    assert f"localhost:{port}" in VERIFY
    assert published_port(service) == port


def test_verify_uses_only_the_two_published_ports():
    assert set(re.findall(r"localhost:(\d+)", VERIFY)) == {"18080", "11433"}


def test_model_name_is_the_served_one():
    cmd = COMPOSE["services"]["vllm"]["command"]
    served = cmd[cmd.index("--served-model-name") + 1]
    assert served == "foundation"
    assert set(re.findall(r'"model": "([^"]+)"', VERIFY)) == {served}


def test_verify_proxy_health_is_the_proxys_own_route():
    from proxy.core.config import Config
    from proxy.http.app import create_app
    own = {p for p in re.findall(r"localhost:11433(/[\w/.-]+)", VERIFY) if p.startswith("/proxy/")}
    assert own == {"/proxy/health"}
    rules = {r.rule for r in create_app(Config()).url_map.iter_rules()}
    assert own <= rules  # the rest (/v1/...) is relayed to vLLM or handled per API


def test_container_names_in_the_readme_exist():
    names = {s["container_name"] for s in COMPOSE["services"].values()}
    mentioned = set(re.findall(r"`(coding-stack-[a-z]+)`", README))
    assert mentioned and mentioned <= names


def test_every_proxy_variable_is_documented():
    names = set(variables())  # every variable Config.from_env reads: the one place the proxy reads any
    assert len(names) >= 40, names
    proxy_table = section("Configuration", "docs/configuration.md")
    missing = [n for n in sorted(names) if f"`{n}`" not in proxy_table]
    assert not missing, f"docs/configuration.md's Configuration does not explain {missing}"


@pytest.mark.parametrize("page", ["README.md", "docs/testing.md"])
def test_ci_runs_the_readme_test_command(page):
    """The README's Tests section (where a person who just cloned looks) and docs/testing.md's name the one command
    .ci/run runs, first; later commands are narrower runs of it."""
    blocks = [b.strip() for b in shell_blocks(section("Tests", page))]
    assert blocks and all(b.startswith("tests/run.sh ") for b in blocks[1:]), blocks
    assert blocks[0] == "tests/run.sh"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^exec {re.escape(blocks[0])}\b", ci, re.M)


def test_codex_config_in_the_readme_is_the_one_the_codex_test_runs():
    import tomllib

    from test_codex import codex_config
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", section("Pointing clients at it"), re.S)
                if "model_provider =" in b]
    readme = tomllib.loads(block)
    tested = tomllib.loads(codex_config("http://localhost:11433"))
    for key in ("model", "model_provider"):
        assert readme[key] == tested[key]
    ours, theirs = readme["model_providers"]["stack"], tested["model_providers"]["stack"]
    for key in ("base_url", "wire_api", "env_key"):
        assert ours[key] == theirs[key], key


def test_codex_standalone_search_switches_in_the_readme_are_the_tested_ones():
    import tomllib

    from test_codex import standalone_config
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", section("Pointing clients at it"), re.S)
                if "supports_standalone_web_search" in b]
    readme, tested = tomllib.loads(block), tomllib.loads(standalone_config("http://localhost:11433"))
    assert readme["features"] == tested["features"] == {"standalone_web_search": True}
    assert readme["model_providers"]["stack"]["supports_standalone_web_search"] is True
    assert tested["model_providers"]["stack"]["supports_standalone_web_search"] is True


def test_opencode_config_in_the_readme_is_the_one_the_opencode_test_runs():
    import json

    from test_opencode import opencode_config
    (block,) = [b for b in re.findall(r"```json\n(.*?)```", section("Pointing clients at it"), re.S)
                if "opencode.ai" in b]
    assert json.loads(block) == opencode_config("http://localhost:11433")


@pytest.mark.parametrize("name", ["ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_MODEL",
                                  "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_ANY_MODEL"])
def test_claude_code_variables_in_the_readme_are_the_tested_ones(name):
    claude = (ROOT / "tests" / "test_claude_code.py").read_text()
    assert f"`{name}" in section("Pointing clients at it") and name in claude


# ---- the README as a user's path, and the pages it links ------------------------------------------------------

def test_the_readme_is_the_short_path():
    assert len(README.splitlines()) <= 500
    for title in ("What it is", "Requirements", "Quick start", "Pointing clients at it", "Main settings",
                  "Troubleshooting", "Tests", "More documentation"):
        assert f"\n## {title}\n" in README, title


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    """Each relative link names a file that exists and, for a Markdown page, a heading it has: moving reference out
    of the README must not leave a link behind."""
    text = re.sub(r"```.*?```|`[^`\n]*`", "", page.read_text(), flags=re.S)
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):
            continue
        file, _, anchor = link.partition("#")
        target = (page.parent / file).resolve() if file else page
        if not target.exists() or (anchor and target.suffix == ".md" and anchor not in anchors(target)):
            broken.append(link)
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_issue_numbers_where_a_user_reads(page):
    assert not re.findall(r"\bissues? \d+|\(#\d+\)", page.read_text(), flags=re.I)
