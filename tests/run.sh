#!/usr/bin/env bash
# Usage: tests/run.sh [pytest args...]
#
# The one test command (README "Tests", .ci/run): builds or reuses the pinned test
# environments in $CODING_STACK_TEST_CACHE (default ~/.cache/coding-stack-tests), then runs
# the whole suite with pytest. Extra arguments go to pytest (e.g. -k stream, -x).
# Needs python3 (3.11), and on first run the package registries; tests use loopback only.
set -euo pipefail

die() { echo "run.sh: $*" >&2; exit 1; }
case "${1:-}" in -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0;; esac

cd "$(dirname "$0")/.."
command -v python3 >/dev/null || die "python3 not found"

CACHE=${CODING_STACK_TEST_CACHE:-$HOME/.cache/coding-stack-tests}
export CODING_STACK_TEST_CACHE=$CACHE
mkdir -p "$CACHE"

# The venv is keyed by the pinned requirement files, so a pin change builds a new one and an
# unchanged tree reuses the old one (CI runs on a fresh clone, not a fresh cache).
key=$(cat requirements.txt tests/requirements.txt | sha256sum | cut -c1-12)
VENV=$CACHE/venv-$key
if [ ! -x "$VENV/.complete" ]; then
  echo "run.sh: creating test environment $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip==25.3
  (cd tests && "$VENV/bin/pip" install --quiet -r requirements.txt)
  printf '#!/bin/sh\n' >"$VENV/.complete" && chmod +x "$VENV/.complete"
else
  echo "run.sh: test environment already built: $VENV" >&2
fi

export PATH="$VENV/bin:$PATH"
# pytest.ini names tests/ as the default, so arguments may be paths, options, or both.
exec "$VENV/bin/python" -m pytest "$@"
