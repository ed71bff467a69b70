"""Tests of benchmark.sh against the paced stand-in backend (standins/paced_backend.py); run `tests/run.sh tests/test_benchmark.py`."""

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs benchmark.sh against paced backends: it waits for their pace on purpose

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmark.sh"
STANDIN = ROOT / "standins" / "paced_backend.py"

# Paces slow enough that a busy 2-core machine's scheduling noise stays well inside ±40%.
TTFT = 0.05
GAP = 0.01
PREFILL_RATE = 20000.0
TOL = 0.4

# Small cases so one benchmark run takes a few seconds; each test narrows them further.
FAST = ["--runs", "3", "--warmup", "1", "--ttft-tokens", "4", "--decode-tokens", "40",
        "--prefill-tokens", "2000", "--prefill-output", "4"]


@pytest.fixture
def backend(tmp_path):
    """Starts paced stand-ins: backend(*flags) -> (base URL, path of its request log)."""
    procs = []

    def start(*flags):
        log = tmp_path / ("requests-%d.jsonl" % len(procs))
        proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "--port", "0", "--ttft", str(TTFT), "--gap", str(GAP),
             "--prefill-rate", str(PREFILL_RATE), "--log", str(log)] + list(flags),
            stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), "stand-in did not start"
        return url, log

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def bench(*args, env=None, timeout=180):
    return subprocess.run([str(BENCH)] + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def logged(log):
    return [json.loads(line)["body"] for line in log.read_text().splitlines()]


# The stand-in's pace is a floor under every duration and a ceiling over every rate: a busy machine can only
# make a run slower, so only that side is checked closely; the other side is a bound no run comes near.
def paced_seconds(value, expected):
    return expected * 0.9 <= value <= expected + 2.0


def paced_rate(value, expected):
    return expected / 20 <= value <= expected * 1.1


def ratio_of(report_case, metric) -> float:
    """B over A as the report states it, checked against the medians it reports (the arithmetic is exact; how
    near the ratio comes to the pacing's is the machine's noise, which hits both endpoints of one run)."""
    a, b = (report_case["results"][k][metric]["median"] for k in ("A", "B"))
    ratio = report_case["ratio_b_over_a"][metric]
    assert ratio == pytest.approx(b / a), (metric, ratio, a, b)
    return ratio


def case(report, name):
    return next(c for c in report["cases"] if c["name"] == name)


def test_help_prints_usage_without_python(tmp_path):
    # -h must work before the dependency check, on a host that lacks python3.
    out = subprocess.run([shutil.which("bash"), str(BENCH), "-h"], capture_output=True, text=True,
                         env={"PATH": str(tmp_path)})
    assert out.returncode == 0
    assert out.stdout.startswith("Usage: ./benchmark.sh")
    for option in ("--url", "--compare", "--runs", "--warmup", "--decode-tokens", "--prefill-tokens",
                   "--thinking", "--json"):
        assert option in out.stdout


def test_shellcheck_clean():
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    out = subprocess.run([shellcheck, str(BENCH)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_missing_python3_is_reported(tmp_path):
    out = subprocess.run([shutil.which("bash"), str(BENCH), "--runs", "1"], capture_output=True, text=True,
                         env={"PATH": str(tmp_path)})
    assert out.returncode == 1
    assert "benchmark.sh: python3 not found" in out.stderr


def test_json_reports_the_known_pace(backend):
    url, log = backend()
    out = bench("--url", url + "/v1/", "--json", *FAST)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)

    ttft = case(report, "ttft")["results"]["A"]
    # The stand-in sends the role chunk (content "") at once: a TTFT near 0 would mean the
    # benchmark counted it as a token.
    assert paced_seconds(ttft["ttft_s"]["median"], TTFT), ttft["ttft_s"]
    decode = case(report, "decode-40")["results"]["A"]
    assert paced_rate(decode["decode_tok_s"]["median"], 1 / GAP), decode["decode_tok_s"]
    assert decode["completion_tokens"] == {"median": 40, "min": 40, "max": 40}
    prefill = case(report, "prefill")["results"]["A"]
    prompt = prefill["prompt_tokens"]["median"]
    assert abs(prompt - 2000) <= 100, "calibration should size the prompt near --prefill-tokens"
    assert paced_rate(prefill["prefill_tok_s"]["median"], prompt / (TTFT + prompt / PREFILL_RATE))
    for name in ("ttft", "decode-40", "prefill"):
        stats = case(report, name)["results"]["A"]
        assert len(stats["runs"]) == 3
        for key in ("ttft_s", "latency_s"):
            assert stats[key]["min"] <= stats[key]["median"] <= stats[key]["max"]

    # Every request is accounted for, and the tallies are the server's usage numbers.
    bodies = logged(log)
    totals = report["endpoints"]["A"]
    assert totals["url"] == url + "/v1"
    assert totals["requests"] == len(bodies) == 2 + 3 * (3 + 1)  # calibration + cases × (runs + warm-up)
    assert totals["completion_tokens"] == sum(b["max_tokens"] for b in bodies)


def test_requests_ask_for_exact_lengths_without_thinking_and_unique_prefill_prompts(backend):
    url, log = backend()
    out = bench("--url", url, "--json", *FAST)
    assert out.returncode == 0, out.stderr
    bodies = logged(log)
    for body in bodies:
        assert body["model"] == "foundation"
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True
        assert body["min_tokens"] == body["max_tokens"]
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
    long_prompts = [b["messages"][0]["content"] for b in bodies if b["max_tokens"] == 4 and
                    len(b["messages"][0]["content"].split()) > 1000]
    assert len(long_prompts) == 4  # the prefill warm-up and its 3 runs
    # Prefix caching matches from the start, so the prompts must differ right there.
    assert len({p[:40] for p in long_prompts}) == len(long_prompts)


def test_thinking_option_keeps_thinking_and_counts_reasoning_as_tokens(backend):
    url, log = backend("--reasoning-tokens", "1000")
    out = bench("--url", url, "--json", "--thinking", "--cases", "ttft,decode", *FAST)
    assert out.returncode == 0, out.stderr
    assert all("chat_template_kwargs" not in b for b in logged(log))
    report = json.loads(out.stdout)
    assert report["thinking"] is True
    # All output is reasoning here, so only reasoning deltas can have started the clock.
    assert paced_seconds(case(report, "ttft")["results"]["A"]["ttft_s"]["median"], TTFT)
    decode = case(report, "decode-40")["results"]["A"]
    assert paced_rate(decode["decode_tok_s"]["median"], 1 / GAP)
    assert decode["runs"][0]["reasoning_tokens"] == 40


def test_table_on_stdout_and_a_progress_line_per_request_on_stderr(backend):
    url, _ = backend()
    out = bench("--url", url, *FAST)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0] + " " + line.split()[3] for line in out.stdout.splitlines()
            if line.split() and line.split()[0] in ("ttft", "decode-40", "prefill")}
    assert rows == {"ttft TTFT", "decode-40 decode", "prefill prefill", "prefill wall"}
    progress = [line for line in out.stderr.splitlines() if "warm-up" in line or " run " in line]
    assert len(progress) == 3 * (3 + 1)
    assert sum(" run 3/3:" in line for line in progress) == 3


def test_compare_identical_endpoints_gives_ratios_near_one_interleaved(backend):
    url_a, _ = backend()
    url_b, _ = backend()
    out = bench("--url", url_a, "--compare", url_b, "--json", *FAST)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    cases = {c["name"]: c for c in report["cases"]}
    for name, metric in (("ttft", "ttft_s"), ("decode-40", "decode_tok_s"), ("prefill", "prefill_tok_s"),
                         ("prefill", "latency_s")):
        assert 0.25 < ratio_of(cases[name], metric) < 4, (name, metric)  # the same pace: neither side far off
    labels = [line.split()[0] for line in out.stderr.splitlines() if line[:2] in ("A ", "B ")]
    assert len(labels) == 2 * 3 * (3 + 1)
    assert labels == ["A", "B"] * (len(labels) // 2)


def test_compare_ratio_shows_a_slower_second_endpoint(backend):
    url_a, _ = backend()
    url_b, _ = backend("--ttft", str(2 * TTFT), "--gap", str(2 * GAP))
    out = bench("--url", url_a, "--compare", url_b, "--json", "--cases", "ttft,decode", *FAST)
    assert out.returncode == 0, out.stderr
    cases = {c["name"]: c for c in json.loads(out.stdout)["cases"]}
    # B's pace is half A's: its first token later, its tokens slower, by up to 2x (noise narrows it toward 1).
    assert 1.0 < ratio_of(cases["ttft"], "ttft_s") <= 2.0 * (1 + TOL)
    assert 0.5 * (1 - TOL) <= ratio_of(cases["decode-40"], "decode_tok_s") < 1.0


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % s.getsockname()[1]


ERROR_CASES = [
    # id, stand-in flags, benchmark flags, exit status, message on stderr
    ("unreachable", None, [], 1, "cannot reach http://127.0.0.1:"),
    ("wrong-model", [], ["--model", "nope"], 1, "model not found at"),
    ("wrong-model-no-model-list", ["--no-models"], ["--model", "nope"], 1,
     "model not found at http://127.0.0.1:"),
    ("usage-missing", ["--omit-usage"], [], 1, "usage missing"),
    ("error-mid-stream", ["--error-after", "2"], [], 1, "reported an error mid-stream: The engine died"),
    ("context-too-small", ["--max-model-len", "1000"], ["--cases", "prefill", "--prefill-tokens", "2000"], 1,
     "max_model_len 1000"),
    ("context-too-small-no-model-list", ["--max-model-len", "1000", "--no-models"],
     ["--cases", "decode", "--decode-tokens", "2000"], 1, "answered HTTP 400: This model's maximum context"),
    ("unknown-option", [], ["--bogus"], 2, "unrecognized arguments: --bogus"),
    ("bad-case", [], ["--cases", "ttft,speed"], 2, "cases are ttft, decode, prefill"),
    ("bad-runs", [], ["--runs", "0"], 2, "must be 1 or more"),
    ("one-token-decode", [], ["--decode-tokens", "1"], 2, "need token counts of 2 or more"),
]


@pytest.mark.parametrize("standin_flags,bench_flags,status,message",
                         [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_errors_exit_nonzero_with_their_message(backend, standin_flags, bench_flags, status, message):
    url = closed_port_url() if standin_flags is None else backend(*standin_flags)[0]
    out = bench("--url", url, "--runs", "1", "--warmup", "0", "--cases", "ttft", "--ttft-tokens", "4",
                *bench_flags, timeout=60)
    assert out.returncode == status, out.stderr
    assert message in out.stderr
    assert out.stderr.splitlines()[-1].startswith("benchmark.sh: ")
    assert out.stdout == ""


def test_endpoint_that_ignores_exact_lengths_gets_a_warning(backend):
    # A non-vLLM server may drop ignore_eos/min_tokens; the numbers then belong to other lengths.
    url, _ = backend("--plain-openai", "--natural-tokens", "20")
    out = bench("--url", url, "--json", "--runs", "2", "--warmup", "0", "--cases", "decode",
                "--decode-tokens", "40")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("asked for exactly 40 tokens and got 20") == 1
    decode = json.loads(out.stdout)["cases"][0]["results"]["A"]
    assert decode["completion_tokens"]["median"] == 20
