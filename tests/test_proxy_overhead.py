"""scripts/proxy_overhead.py runs end to end (a tiny run, a few seconds): every case of issue 7
is measured, the table names each target, and the JSON holds every figure; with --against it measures two
checkouts' proxies side by side. Its speed
figures are not asserted: they belong to the benchmark, not to a test on a noisy machine.

Run: tests/run.sh tests/test_proxy_overhead.py
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the overhead benchmark end to end

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--requests", "20", "--streams", "3", "--chunks", "20", "--concurrent", "8", "--rounds", "1",
        "--paced-chunks", "5", "--paced-seconds", "0.2", "--big", "2", "--big-bytes", "200000", "--loops", "2",
        "--metric-requests", "20", "--cache-loops", "3"]


def test_a_tiny_run_measures_every_case(tmp_path):
    out = tmp_path / "overhead.json"
    run = subprocess.run([sys.executable, "-m", "scripts.proxy_overhead", *TINY, "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "FAILED ANSWERS" not in run.stdout
    for row in ["(1) non-streaming p50", "(1) floor: GET /proxy/health", "(2) 20-event stream TTFT", "(2) 4-event stream TTFT",
                "(2) proxy CPU per event", "(3) 8 x 0.2 s streams wall", "(4) 0.2 MB body, web_search injected",
                "(4) 0.2 MB body, nothing injected", "(5) search loop", "(6) proxy RSS",
                "(7) PROXY_METRICS off -> on: non-streaming p50", "(7) PROXY_METRICS off -> on: proxy CPU per request",
                "(8) 3 repeated 2-search loops", "(8) searches that reached SearXNG"]:
        assert row in run.stdout, f"{row!r} missing from:\n{run.stdout}"
    assert run.stdout.count(" met") + run.stdout.count("NOT MET") == 7  # one verdict per target
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"nonstreaming", "stream", "concurrent", "big_body", "search_loop", "metrics", "search_cache"}
    # The cache's loops searched twice in all (the first loop's two queries); the others twice per loop.
    assert (results["search_cache"]["cache_searxng_requests"], results["search_cache"]["nocache_searxng_requests"]) == (2, 6)
    assert results["stream"]["chunks"] == 20 and results["concurrent"]["streams"] == 8
    assert all(v > 0 for v in (results["nonstreaming"]["proxy_p50_ms"], results["stream"]["proxy_short_ttft_ms"],
                               results["concurrent"]["proxy_rss_peak_mb"]))


def test_against_measures_two_checkouts_in_one_run(tmp_path):
    """--against: the other checkout's proxy (here this one again, an A/A run) beside this one's, each figure with
    its ratio, and the request-by-request interleaved rows; every round of each case is in the JSON."""
    out = tmp_path / "ab.json"
    run = subprocess.run([sys.executable, "-m", "scripts.proxy_overhead", "--against", str(ROOT), "--only", "1,5",
                          "--requests", "10", "--loops", "2", "--ab-rounds", "2", "--ab-requests", "12",
                          "--ab-loops", "2", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "FAILED ANSWERS" not in run.stdout
    for row in ["after/before", "(1) non-streaming p50", "(5) search loop: the proxy itself",
                "request by request, before and after interleaved", "(5) 2-search loop proxy CPU/request"]:
        assert row in run.stdout, f"{row!r} missing from:\n{run.stdout}"
    runs = json.loads(out.read_text())["runs"]
    assert [len(runs[side]["nonstreaming"]) for side in ("before", "after")] == [2, 2]
    assert len(runs["interleaved"]["plain"]) == 2 and len(runs["interleaved"]["search_loop"]) == 2


def test_sizes_measures_each_api_and_mode_beside_direct(tmp_path):
    """scripts/proxy_overhead_sizes.py (issue 54): each API in both modes at the sizes asked, a row each with direct
    beside the proxy, and every cell's figures in the JSON; its bodies are the sizes asked and agent-shaped."""
    out = tmp_path / "sizes.json"
    run = subprocess.run([sys.executable, "-m", "scripts.proxy_overhead_sizes", "--sizes", "0.02,0.05",
                          "--requests", "4", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "FAILED ANSWERS" not in run.stdout
    assert "direct p50/p90" in run.stdout and "proxy p50/p90" in run.stdout and "load average" in run.stdout
    results = json.loads(out.read_text())["results"]
    assert [(r["mode"], r["api"]) for r in results][::2] == [(m, a) for m in ("relay", "tools")
                                                          for a in ("chat", "messages", "responses")]
    for r in results:
        assert 0.015e6 < r["body_bytes"] < 0.06e6
        assert r["direct_p50_ms"] > 0 and r["proxy_p50_ms"] > 0 and r["proxy_cpu_ms"] > 0
        assert f"{r['mode']:6} {r['api']:9}" in run.stdout
