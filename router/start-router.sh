#!/usr/bin/env bash
# Usage: start-router.sh [vllm-router options...]
#
# The router image's entrypoint (compose.scale.yaml): vllm-router on 0.0.0.0:8000 in front of the vLLM workers in
# VLLM_WORKERS (space- or comma-separated base URLs: http://vllm:8000 http://vllm-2:8000 http://gpu-box-2:18080),
# with the options given after it. With VLLM_API_KEY set, the router sends it to the workers: it forwards no client
# header on /v1/messages and /v1/responses, so a worker that needs a key would refuse those. The key reaches this
# script through the environment, never compose's command line.
set -euo pipefail

die() { echo "start-router.sh: $*" >&2; exit 1; }
case "${1:-}" in
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
esac

read -r -a workers <<<"${VLLM_WORKERS//,/ }" || true
[ ${#workers[@]} -gt 0 ] || die "VLLM_WORKERS names no worker (e.g. VLLM_WORKERS=\"http://vllm:8000 http://vllm-2:8000\")"
for url in "${workers[@]}"; do
  [[ $url =~ ^https?://[^/?#@[:space:]]+/?$ ]] || die "VLLM_WORKERS: '$url' is not an http:// or https:// base URL"
done
key=()
if [ -n "${VLLM_API_KEY:-}" ]; then
  key=(--api-key "$VLLM_API_KEY")
fi
# The image's process is the router itself (exec): `docker stop` reaches it, and its exit is the container's.
exec vllm-router --host 0.0.0.0 --port 8000 --worker-urls "${workers[@]}" "${key[@]}" "$@"
