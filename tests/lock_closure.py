"""Run by an installed environment's own Python: every requirement of every installed distribution is met by what
is installed, the extras that other packages ask for included. Prints one line per unmet requirement and exits 1;
prints nothing and exits 0 when the closure is complete.

`pip check` is not enough for a lock installed with --no-deps: it ignores the extras a dependency asks for, so a lock
holding justext (which needs `lxml[html_clean]`) and lxml but not lxml-html-clean passes it, and pip's resolver would
have gone looking for the missing package at install time. Needs only the standard library and the environment's pip
(for its vendored `packaging`), so it runs in an environment that holds nothing else.
"""
from __future__ import annotations

import re
import sys
from importlib import metadata

from pip._vendor.packaging.requirements import Requirement  # pip is in every environment this checks


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unmet() -> list[str]:
    installed = {norm(d.metadata["Name"]): d for d in metadata.distributions()}
    asked: dict[str, set[str]] = {name: {""} for name in installed}  # the extras someone asks of each distribution
    problems: list[str] = []
    changed = True
    while changed:  # extras asked of a package add requirements, which may ask for more extras: to a fixed point
        changed = False
        problems = []
        for name, dist in installed.items():
            for line in dist.requires or []:
                req = Requirement(line)
                if req.marker and not any(req.marker.evaluate({"extra": extra}) for extra in asked[name]):
                    continue
                target = norm(req.name)
                if target not in installed:
                    problems.append(f"{name} needs {req}, which is not installed")
                    continue
                if req.specifier and not req.specifier.contains(installed[target].version, prereleases=True):
                    problems.append(f"{name} needs {req}, but {target} {installed[target].version} is installed")
                # Each spelling: a marker may say extra == "html_clean" or "html-clean", and older vendored
                # packaging compares them as written.
                new = {s for e in req.extras for s in (e, norm(e), norm(e).replace("-", "_"))} - asked[target]
                if new:
                    asked[target] |= new
                    changed = True
    return sorted(set(problems))


if __name__ == "__main__":
    found = unmet()
    print("\n".join(found))
    sys.exit(1 if found else 0)
