"""The linters pyproject.toml configures, run over the repository as a maintainer runs them (`ruff check .`,
`mypy`), plus what pyproject.toml itself promises; run with `tests/run.sh tests/test_lint.py`."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    proc = run("ruff", "check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow  # mypy over the tree: 20 s of CPU; run it before you commit
def test_mypy_finds_nothing():
    # The cache goes under tests/.work (ignored by git), not into the checkout's root.
    proc = run("mypy", "--cache-dir", str(REPO / "tests" / ".work" / "mypy-cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout


def test_the_project_reads_its_dependencies_from_requirements_in():
    project = PYPROJECT["project"]
    assert project["requires-python"] == ">=3.11"
    assert project["dynamic"] == ["dependencies"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.in"]}
    # setuptools takes the file's lines as requirements, comments aside: each must parse as one, pinned.
    lines = [ln.strip() for ln in (REPO / "requirements.in").read_text().splitlines()]
    reqs = [Requirement(ln) for ln in lines if ln and not ln.startswith("#")]
    assert reqs and all(str(r.specifier).startswith("==") for r in reqs)


def test_every_marker_is_registered():
    """The four tiers, and `slow` (the inner loop's filter, docs/testing.md, "Tests")."""
    markers = PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]
    assert sorted(m.split(":")[0] for m in markers) == ["agents", "container", "real_vllm", "redis", "slow"]
