#!/usr/bin/env bash
# Usage: ./download-model.sh [-h]
#
# Puts the checkpoint vLLM serves into the HF cache it mounts: $MODEL_DIR/hub/models--OWNER--NAME
# (MODEL_DIR default /storage-models/vllm, also read from ./.env). A no-op when every file is already
# there at full size; resumable; with the hub unreachable it verifies against its own download record.
# For hosts that fetch ahead of time: `docker compose up` runs the same code in its `model` service.
# Uses Hugging Face's own client (huggingface_hub) from a private venv, never the system Python's packages,
# installed from model/requirements.txt exactly as the compose `model` service's image installs it.
#
# Environment: MODEL_DIR, MODEL_ID, MODEL_REVISION (default main), HF_TOKEN (gated/private repos),
#   HF_ENDPOINT (a mirror), HF_VENV (where the client's venv lives, default
#   ${XDG_CACHE_HOME:-~/.cache}/coding-stack/hf-venv).
set -euo pipefail

die() { echo "download-model.sh: $*" >&2; exit 1; }
case "${1:-}" in
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "unknown argument '$1' (try -h)" ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
# model/requirements.in pins the same (tests/test_model_service.py).
HF_HUB_VERSION=2.4.0
LOCK=$here/model/requirements.txt

# The same MODEL_DIR docker compose uses: the environment first, then a MODEL_DIR= line in .env.
if [ -z "${MODEL_DIR:-}" ] && [ -f "$here/.env" ]; then
  MODEL_DIR=$(sed -n 's/^[[:space:]]*MODEL_DIR=//p' "$here/.env" | tail -n 1 | tr -d "\"'")
fi
export MODEL_DIR=${MODEL_DIR:-/storage-models/vllm}

# Every dependency is checked before anything is written.
# 3.11: the oldest Python every package of the lock supports (httpx2 and httpcore2 ask for it).
command -v python3 >/dev/null || die "python3 not found: install Python 3.11 or newer"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "python3 is $(python3 -V 2>&1 | cut -d' ' -f2); 3.11 or newer is needed"
[ -f "$here/scripts/download_model.py" ] || die "missing $here/scripts/download_model.py"
[ -f "$LOCK" ] || die "missing $LOCK"

VENV=${HF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/coding-stack/hf-venv}
has_client() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c \
    "import huggingface_hub, sys; sys.exit(huggingface_hub.__version__ != '$HF_HUB_VERSION')" 2>/dev/null
}
if has_client; then
  echo "download-model.sh: using huggingface_hub $HF_HUB_VERSION from $VENV" >&2
else
  python3 -c 'import venv, ensurepip' 2>/dev/null \
    || die "python3 cannot create virtual environments: install python3-venv (Debian/Ubuntu) and retry"
  echo "download-model.sh: installing huggingface_hub==$HF_HUB_VERSION into $VENV" >&2
  python3 -m venv "$VENV" || die "could not create a virtual environment in $VENV"
  # pip's own output goes to a log, so a failure is still one line here. The lock alone, hashed, no resolver
  # (--no-deps), then pip check: what the image installs, whatever pip this Python carries.
  log="$VENV/pip-install.log"
  { "$VENV/bin/python" -m pip install --disable-pip-version-check --no-deps --require-hashes -r "$LOCK" &&
    "$VENV/bin/python" -m pip check; } >"$log" 2>&1 \
    || die "could not install huggingface_hub==$HF_HUB_VERSION into $VENV (is PyPI reachable? see $log)"
  has_client || die "huggingface_hub $HF_HUB_VERSION is still not importable from $VENV"
fi

exec "$VENV/bin/python" "$here/scripts/download_model.py"
