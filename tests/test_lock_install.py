"""Every lock installs exactly, from nothing, as its image installs it: a new, empty venv with the pip the real
python:3.11-slim carries (tests/container/base-pip.txt), the Dockerfile's own `pip install ... && pip check` line, then
tests/lock_closure.py, which fails on any requirement (extras a dependency asks for included) the lock leaves for a
resolver to find. No Docker, so it runs in the inner loop on every change of a lock; run with
`tests/run.sh tests/test_lock_install.py`.

Why: a lock that a resolver completes is not a lock. justext asks for `lxml[html_clean]`; whether pip then went
looking for another lxml depended on pip's version, so one lock gave three outcomes on three pips, and every new
machine's container tier failed while a cached image layer hid it where the tests had run before.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.container.images import base_pip_wheel

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("CODING_STACK_TEST_CACHE", Path.home() / ".cache" / "coding-stack-tests"))
CLOSURE = REPO / "tests" / "lock_closure.py"

# Each image's lock and the Dockerfile that installs it.
IMAGES = {"requirements.txt": "Dockerfile", "model/requirements.txt": "model/Dockerfile",
          "router/requirements.txt": "router/Dockerfile"}
IMAGE_INSTALL = "RUN pip install --no-cache-dir --no-deps --require-hashes -r requirements.txt && pip check"
# Every other place that installs one of the locks, and the words its command must hold.
SCRIPTS = {
    "tests/run.sh": ["--no-deps --require-hashes -r tests/requirements.txt", '"$VENV/bin/pip" check'],
    "download-model.sh": ['--no-deps --require-hashes -r "$LOCK"', "-m pip check"],
    "tests/real_vllm/test_router_real.py": ['install --no-deps --require-hashes -r "{LOCK}"', '/bin/pip" check'],
}


def empty_venv(where: Path) -> Path:
    """A venv holding nothing but the real base image's pip, which installs itself from its own wheel."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    wheel = base_pip_wheel(CACHE)
    subprocess.run([str(where / "bin" / "python"), f"{wheel}/pip", "install", "--quiet", "--no-index", str(wheel)],
                   check=True, timeout=120, env=pip_env(where))
    return where


def pip_env(venv: Path) -> dict[str, str]:
    """The host's environment and pip settings (how this machine reaches the registry: its CA bundle, an index;
    a build gets the same CA bundle, tests/container/images.py), which cannot change what a hashed --no-deps install
    takes. Nothing is compiled to bytecode, which takes most of the time and no part in what installs."""
    return {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_COMPILE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def wheelhouse(venv: Path, lock: Path) -> Path:
    """The lock's files for this platform, fetched once per lock content by the same pip with the same
    --no-deps --require-hashes (so no resolver here either) and reused: later runs install without the network."""
    folder = CACHE / "lock-wheels" / hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    if not (folder / ".complete").exists():
        subprocess.run(["pip", "download", "--quiet", "--no-deps", "--require-hashes", "-r", str(lock), "-d",
                        str(folder)], env=pip_env(venv), check=True, capture_output=True, timeout=600)
        (folder / ".complete").touch()
    return folder


def image_install(venv: Path, lock: Path, command: str) -> subprocess.CompletedProcess:
    """The Dockerfile's RUN line, in a folder holding the lock as requirements.txt (its WORKDIR), with the venv first
    on PATH as the image's interpreter is; the files come from the lock's wheelhouse instead of the index, which
    changes where they are read, not which (their hashes decide)."""
    work = venv.parent / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(lock, work / "requirements.txt")
    env = {**pip_env(venv), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse(venv, lock))}
    return subprocess.run(command.removeprefix("RUN "), shell=True, cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("lock", sorted(IMAGES))
def test_each_lock_installs_exactly_with_the_images_pip(lock, tmp_path):
    dockerfile = (REPO / IMAGES[lock]).read_text()
    (command,) = [line for line in dockerfile.splitlines() if line.startswith("RUN pip ")]
    assert command == IMAGE_INSTALL
    venv = empty_venv(tmp_path / "venv")
    assert subprocess.run(["pip", "--version"], env=pip_env(venv), capture_output=True, text=True,
                          check=True).stdout.startswith("pip 24.0 ")
    done = image_install(venv, REPO / lock, command)
    assert done.returncode == 0, f"{IMAGES[lock]}'s install of {lock} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    closure = subprocess.run([str(venv / "bin" / "python"), str(CLOSURE)], capture_output=True, text=True, timeout=120)
    assert closure.returncode == 0, f"{lock} leaves these to a resolver:\n{closure.stdout}"


def lock_entries(lock: Path, names: set[str]) -> str:
    blocks = re.split(r"\n(?=[a-z])", lock.read_text())
    return "\n".join(b for b in blocks if b.split("==")[0] in names) + "\n"


@pytest.mark.parametrize("names,unmet", [
    # justext asks lxml for its html_clean extra: pip check passes this one, the closure does not.
    ({"justext", "lxml"}, 'lxml needs lxml_html_clean; extra == "html-clean", which is not installed'),
    ({"justext", "lxml", "lxml-html-clean"}, ""),
])
def test_the_closure_check_finds_what_pip_check_misses(names, unmet, tmp_path):
    venv = empty_venv(tmp_path / "venv")
    part = tmp_path / "part.txt"
    part.write_text(lock_entries(REPO / "requirements.txt", names))
    done = image_install(venv, part, IMAGE_INSTALL)
    assert done.returncode == 0, done.stderr[-3000:]
    closure = subprocess.run([str(venv / "bin" / "python"), str(CLOSURE)], capture_output=True, text=True, timeout=120)
    assert closure.stdout.strip() == unmet and closure.returncode == (1 if unmet else 0)


def test_every_install_from_a_lock_is_exact():
    """Every file that installs from a requirements file does so with --no-deps --require-hashes and then checks
    the result: the images by IMAGE_INSTALL, the scripts by their own words; a new place must join one list."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    installers = set()
    for name in tracked:
        path = REPO / name
        if name.startswith("tests/data/") or not path.is_file() or path.suffix not in ("", ".sh", ".py"):
            continue
        if re.fullmatch(r"tests/test_\w+\.py", name):
            continue  # the suite's checks of these lines quote them; they install nothing
        text = path.read_text(errors="replace")
        if re.search(r"""pip["',\s]+install\b[^\n]*(?:-r\b|--requirement)""", text):
            installers.add(name)
    assert installers == set(IMAGES.values()) | set(SCRIPTS), installers
    for dockerfile in IMAGES.values():
        runs = [line for line in (REPO / dockerfile).read_text().splitlines() if line.startswith("RUN pip ")]
        assert runs == [IMAGE_INSTALL], dockerfile
    for script, words in SCRIPTS.items():
        text = (REPO / script).read_text()
        for word in words:
            assert word in text, f"{script} lacks {word!r}"
