"""The proxy's dependency locks (requirements.in -> requirements.txt, tests/requirements.in ->
tests/requirements.txt): complete, hashed, and the same pins for the image and the tests; run with
`tests/run.sh tests/test_lock.py`.

The container tier proves the image installs and runs from the lock, and tests/test_lock_install.py that each lock
installs exactly, with nothing left to a resolver; these checks say which line is wrong.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(path: Path) -> dict[str, tuple[str, str, frozenset]]:
    """name -> (version, marker, hashes) for each entry of a `uv pip compile --generate-hashes` file."""
    text = path.read_text().replace("\\\n", " ")
    entries = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-")):
            continue
        spec, _, rest = line.partition("--hash=")
        req = Requirement(spec.strip())
        (pin,) = req.specifier
        assert pin.operator == "==", f"{path.name}: {req.name} is not pinned exactly"
        hashes = frozenset(re.findall(r"sha256:[0-9a-f]{64}", line))
        entries[norm(req.name)] = (pin.version, str(req.marker or ""), hashes)
    return entries


def direct(path: Path) -> dict[str, Requirement]:
    reqs = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            reqs[norm(req.name)] = req
    return reqs


RUNTIME = parse_lock(REPO / "requirements.txt")
TESTS = parse_lock(REPO / "tests" / "requirements.txt")


@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_every_runtime_pin_is_hashed_and_the_tests_run_the_same(name):
    version, marker, hashes = RUNTIME[name]
    assert hashes, f"{name} has no hash"
    assert TESTS.get(name) == (version, marker, hashes), f"{name}: tests/requirements.txt differs from requirements.txt"


@pytest.mark.parametrize("lock,source", [("requirements.txt", "requirements.in"),
                                         ("tests/requirements.txt", "tests/requirements.in")])
def test_direct_pins_are_the_locked_versions(lock, source):
    locked = parse_lock(REPO / lock)
    for name, req in direct(REPO / source).items():
        assert name in locked, f"{name} from {source} is missing in {lock}"
        assert req.specifier.contains(locked[name][0]), f"{name}: {source} says {req.specifier}, {lock} {locked[name][0]}"
