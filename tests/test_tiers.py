"""The tier markers (pyproject.toml) select what tests/run.sh installs: a selection is collected with
CODING_STACK_TIERS_OUT set and tests/conftest.py names the tiers it holds; run with
`tests/run.sh tests/test_tiers.py`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Where each tier's tests live; a test there without its tier's marker would run without its environment.
NEEDS_VLLM = ("tests/real_vllm/", "tests/container/")
AGENT_MODULES = ("tests/test_claude_code.py", "tests/test_codex.py")


def collect(tmp_path: Path, *args: str) -> tuple[list[str], set[str]]:
    out = tmp_path / "tiers"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, env={**os.environ, "CODING_STACK_TIERS_OUT": str(out)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    return ids, set(out.read_text().split())


@pytest.mark.parametrize("args, tiers", [
    (("-m", "not real_vllm and not agents"), set()),
    (("-m", "not real_vllm and not agents and not container"), set()),
    (("tests/test_lock.py",), set()),
    (("tests/real_vllm",), {"real_vllm"}),
    (("tests/test_codex.py",), {"agents"}),
    (("-m", "agents"), {"agents", "container", "real_vllm"}),  # the container tier runs both agents too
    ((), {"agents", "container", "real_vllm"}),
])
def test_a_selection_names_the_tiers_it_needs(tmp_path, args, tiers):
    ids, used = collect(tmp_path, *args)
    assert ids and used == tiers


def test_the_quick_selection_holds_no_test_of_a_heavy_tier(tmp_path):
    ids, _ = collect(tmp_path, "-m", "not real_vllm and not agents")
    heavy = [i for i in ids if i.startswith(NEEDS_VLLM + AGENT_MODULES)]
    assert not heavy and len(ids) > 500


def test_every_container_agent_test_is_marked_agents(tmp_path):
    ids, _ = collect(tmp_path, "tests/container", "-m", "agents")
    assert sorted(i.split("::")[1] for i in ids) == ["test_claude_code_against_the_stack",
                                                     "test_codex_against_the_stack"]
