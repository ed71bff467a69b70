"""scripts/session_bench.py's pure parts, without a vLLM (the real tier runs it whole: tests/real_vllm/
test_session_bench.py): the ideal reuse, the forced calls' text, vLLM's counters read, bad input refused. Run with
`tests/run.sh tests/test_session_bench_rules.py`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import session_bench as S  # noqa: E402


def served(prompt, output=0, hits=0):
    return S.Served("/v1/responses", {}, prompt, output, prompt, hits, 0.0)


@pytest.mark.parametrize("prev,cur,outputs,expected", [
    (None, served(500), True, 0),                    # the session's first request: nothing before it
    (served(300, 40), served(500), True, 256),        # 339 tokens seen, in whole 128-token blocks
    (served(300, 40), served(500), False, 256),       # the prompt alone: 300 -> 256
    (served(250, 10), served(500), True, 256),        # 259 seen -> 256 ...
    (served(250, 10), served(500), False, 128),       # ... but the prompt alone 250 -> 128
    (served(300, 400), served(500), True, 384),       # never past the new prompt's last token (499 -> 384)
])
def test_ideal_reuse_is_the_previous_request_in_whole_blocks(prev, cur, outputs, expected):
    assert S.ideal(prev, cur, 128, outputs) == expected


def test_turn_rows_count_no_more_than_the_ideal_per_request():
    # The second request beats its ideal; the third falls short: the ratio is not the sum's.
    reqs = [served(300, 20), served(400, 20, hits=384), served(500, 20, hits=128)]
    (row,) = S.turn_rows(reqs, [3], [0.1], 128, True)
    assert (row["prompt"], row["cached"], row["ideal"]) == (1200, 512, 256 + 384)
    assert row["ratio"] == pytest.approx((256 + 128) / (256 + 384))


def test_forced_text_is_the_qwen3_xml_the_template_writes_back():
    calls = [{"name": "web_fetch", "arguments": {"url": "https://a.example/x"}}]
    assert S.forced_text(calls) == ("<tool_call>\n<function=web_fetch>\n<parameter=url>\nhttps://a.example/x\n"
                                    "</parameter>\n</function>\n</tool_call>")


def test_counters_and_block_size_from_vllms_exposition():
    text = ('# HELP vllm:prompt_tokens_total x\nvllm:prompt_tokens_total{engine="0",model_name="foundation"} 1234.0\n'
            'vllm:prefix_cache_hits_total{engine="0"} 1024.0\nvllm:prefix_cache_hits_created 5.0\n'
            'vllm:cache_config_info{block_size="128",engine="0"} 1.0\n')
    got = S.counters(text)
    assert got["vllm:prompt_tokens_total"] == 1234 and got["vllm:prefix_cache_hits_total"] == 1024
    assert got["vllm:generation_tokens_total"] == 0
    assert S.block_size(text) == 128


@pytest.mark.parametrize("args,message", [
    (["--vllm", "http://127.0.0.1:1"], "cannot reach vLLM"),
    (["--vllm", "http://127.0.0.1:1", "--force", "/nonexistent/tokenizer.json"], "--force: cannot read"),
    ([], "required"),
])
def test_bad_use_is_one_line_and_exit_1_or_2(args, message):
    proc = subprocess.run([sys.executable, "scripts/session_bench.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode in (1, 2) and message in proc.stderr and "Traceback" not in proc.stderr


def test_the_shipped_sessions_load(tmp_path):
    for path in sorted((REPO / "tests" / "data" / "sessions").glob("*.json")):
        session = S.Session.load(path)
        assert session.api in ("messages", "responses") and len(session.turns) == 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x"}))
    with pytest.raises(SystemExit):
        S.Session.load(bad)
