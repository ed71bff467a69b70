#!/usr/bin/env bash
# benchmark.sh: measures the vLLM server's TTFT, decode and prefill rates the way vLLM's own benchmark does; run ./benchmark.sh (or ./benchmark.sh -h).
#
# Usage: ./benchmark.sh [options]
#
# Streams chat completions from an OpenAI-compatible endpoint and prints a table of
# medians with [min-max] on stdout, one progress line per request on stderr.
#   TTFT    time from sending to the first chunk carrying a token (reasoning or content)
#   decode  (completion_tokens - 1) / (latency - TTFT), completion_tokens from usage
#   prefill prompt_tokens / TTFT on a long prompt made unique per run (no prefix cache)
# Output lengths are exact: each request sends ignore_eos with min_tokens = max_tokens.
#
# Options:
#   --url URL            endpoint base URL, /v1 optional (default http://localhost:18080;
#                        the proxy is http://localhost:11433)
#   --model NAME         served model name (default foundation)
#   --compare URL2       also measure URL2, interleaved A B A B, and print B/A ratios
#   --runs N             measured runs per case (default 5)
#   --warmup N           unmeasured runs per case before them (default 1)
#   --cases LIST         comma list of ttft,decode,prefill (default all three)
#   --ttft-tokens N      output tokens of a TTFT run (default 16)
#   --decode-tokens LIST output lengths of the decode cases (default 300,1000)
#   --prefill-tokens N   prompt length of the prefill case, about (default 9000)
#   --prefill-output N   output tokens of a prefill run (default 32)
#   --thinking           leave thinking on (default off: enable_thinking=false)
#   --json               print JSON on stdout instead of the table
#   --timeout S          seconds to wait for any byte of an answer (default 600)
#   --api-key KEY        bearer token (default $VLLM_API_KEY)
#   -h, --help           print this help
#
# Needs bash and python3 (3.8+) only. Exit status: 0 done, 1 failed (unreachable, model
# not found, usage missing, HTTP error), 2 bad options.
set -euo pipefail

die() { echo "benchmark.sh: $*" >&2; exit 1; }

# Pure bash on purpose: -h and the python3 check must work on a host that has nothing else.
usage() {
  local line printing=0
  while IFS= read -r line; do
    case $line in
      '# Usage:'*) printing=1 ;;
      '#'*) ;;
      *) break ;;
    esac
    if [ "$printing" = 1 ]; then
      line=${line#\#}
      printf '%s\n' "${line# }"
    fi
  done <"${BASH_SOURCE[0]}"
}

for arg in "$@"; do
  case $arg in -h|--help) usage; exit 0 ;; esac
done

src=${BASH_SOURCE[0]}
case $src in */*) here=${src%/*} ;; *) here=. ;; esac
engine=$here/scripts/benchmark.py

command -v python3 >/dev/null 2>&1 ||
  die "python3 not found; the benchmark needs bash and python3 (3.8 or newer), nothing else"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 8))' ||
  die "python3 is $(python3 -V 2>&1); the benchmark needs 3.8 or newer"
[ -f "$engine" ] || die "$engine is missing; run benchmark.sh from its checkout"

exec python3 "$engine" "$@"
