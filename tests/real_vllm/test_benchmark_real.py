"""benchmark.sh end to end against the real vLLM server (issue 6's real tier): exact output lengths, the prefill prompt size, and token totals that agree with vLLM's own /metrics counters; run with `tests/run.sh tests/real_vllm/test_benchmark_real.py`.

The counters are the server's totals and the session server is shared, so the test reads them
right before and after its one benchmark call; pytest runs the tier's tests one at a time.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from realvllm import REPO

pytestmark = pytest.mark.real_vllm

PREFILL_TOKENS = 1500
ARGS = ["--json", "--runs", "2", "--warmup", "1", "--ttft-tokens", "4", "--decode-tokens", "32,64",
        "--prefill-tokens", str(PREFILL_TOKENS), "--prefill-output", "4", "--timeout", "300"]
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total")


def counters(real_vllm, http_client) -> dict[str, float]:
    """The counters summed over their labels (one series per engine, model, finish reason)."""
    reply = http_client.get(real_vllm.url + "/metrics")
    assert reply.status == 200
    totals = {name: 0.0 for name in COUNTERS}
    for line in reply.body.decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def test_benchmark_counts_agree_with_vllm(real_vllm, http_client):
    before = counters(real_vllm, http_client)
    proc = subprocess.run(["./benchmark.sh", "--url", real_vllm.url, *ARGS], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (endpoint,) = report["endpoints"].values()
    # vLLM may count a request a moment after its last chunk has gone out.
    deadline = time.monotonic() + 5
    while True:
        after = counters(real_vllm, http_client)
        done = after["vllm:request_success_total"] - before["vllm:request_success_total"]
        if done >= endpoint["requests"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)

    cases = {case["name"]: case for case in report["cases"]}
    assert list(cases) == ["ttft", "decode-32", "decode-64", "prefill"]
    for case in report["cases"]:
        runs = case["results"]["A"]["runs"]
        assert len(runs) == 2
        # ignore_eos with min_tokens = max_tokens: the random model writes exactly that many.
        assert [run["completion_tokens"] for run in runs] == [case["max_tokens"]] * 2, case["name"]
    prefill = cases["prefill"]["results"]["A"]["prompt_tokens"]["median"]
    assert abs(prefill - PREFILL_TOKENS) <= 0.1 * PREFILL_TOKENS, prefill

    # The totals cover every request benchmark.sh sent (prompt sizing, warm-ups, runs), so
    # they must equal what vLLM counted over the call.
    assert endpoint["prompt_tokens"] == after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert endpoint["completion_tokens"] == after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert endpoint["requests"] == after["vllm:request_success_total"] - before["vllm:request_success_total"]
    # Two sizing requests, then a warm-up and two runs of each of the four cases.
    assert endpoint["requests"] == 2 + 4 * 3
