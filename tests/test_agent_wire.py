"""The captured wire traffic of the pinned Claude Code and Codex (tests/data/agent-wire/, made by
scripts/capture_agent_wire.py): the captures belong to the versions tests/run.sh installs, the
hand-built request shapes other tests use agree with them, and each captured request replayed
byte for byte through the real proxy is served with the search done by the proxy.

Run: tests/run.sh tests/test_agent_wire.py -q
"""
from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import test_claude_code
import test_codex
from test_responses import HOSTED, codex_body

DATA = Path(__file__).resolve().parent / "data" / "agent-wire"
RUN_SH = Path(__file__).resolve().parent / "run.sh"
# Per-connection headers the relay saw that a replay must not copy.
NOT_REPLAYED = {"host", "content-length", "connection", "accept-encoding"}


def pinned() -> dict[str, str]:
    text = RUN_SH.read_text()
    return {"claude": re.search(r"@anthropic-ai/claude-code@([\d.]+)", text).group(1),
            "codex": re.search(r"@openai/codex@([\d.]+)", text).group(1)}


def capture(name: str) -> list[dict]:
    return json.loads((DATA / name).read_text())


def claude_file() -> str:
    return f"claude-code-{pinned()['claude']}-websearch.json"


def codex_file() -> str:
    return f"codex-{pinned()['codex']}-websearch.json"


def header(record, name):
    return next((v for n, v in record["headers"] if n.lower() == name), None)


def test_captures_are_of_the_pinned_versions():
    versions = pinned()
    claude = capture(claude_file()) + capture(f"claude-code-{versions['claude']}-webfetch.json")
    codex = capture(codex_file()) + capture(f"codex-{versions['codex']}-alpha-search.json")
    assert claude and all(header(r, "user-agent") == f"claude-cli/{versions['claude']} (external, sdk-cli)" for r in claude)
    assert codex and all(f"codex_exec/{versions['codex']} " in header(r, "user-agent") for r in codex)


def test_codex_shape_used_by_the_tests_matches_the_capture():
    (sent,) = [r["body"] for r in capture(codex_file()) if r["target"] == "/v1/responses"]
    mine = codex_body()
    for key in ("tool_choice", "parallel_tool_calls", "reasoning", "store", "stream", "include"):
        assert mine[key] == sent[key], key
    assert set(mine) - {"instructions"} <= set(sent)
    assert [t for t in sent["tools"] if t.get("type") == "web_search"] == [HOSTED]


def test_claude_code_search_subrequest_matches_what_the_proxy_detects():
    subs = [r["body"] for r in capture(claude_file()) if [t.get("name") for t in r["body"].get("tools") or []] == ["web_search"]]
    (sub,) = subs
    assert sub["tools"] == [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]
    assert sub["tool_choice"] == {"type": "auto"} and sub["stream"] is True and "thinking" not in sub
    # Not agent-apis.md's older "You are an assistant for performing a web search tool use".
    assert sub["system"][-1]["text"].startswith("You run a web search for another Claude model")
    (ask,) = sub["messages"]
    assert ask["role"] == "user" and ask["content"][0]["text"].startswith("Perform a web search for the query: ")


def replay(proxy_url: str, record: dict) -> tuple[int, bytes]:
    headers = {n: v for n, v in record["headers"] if n.lower() not in NOT_REPLAYED}
    req = urllib.request.Request(proxy_url + record["target"], method=record["method"], headers=headers,
                                 data=json.dumps(record["body"]).encode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize("index", range(len(capture(claude_file()))))
def test_replayed_claude_code_request_is_served(start_proxy, backend, searxng, index):
    record = capture(claude_file())[index]
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2")
    backend.responder = test_claude_code.StandInModel()
    status, body = replay(proxy.url, record)
    assert status == 200, body[:500]
    assert b"event: message_stop" in body
    (sent,) = [r.json() for r in backend.received if r.path == "/v1/messages"]
    assert sent["model"] == "foundation"
    # No server tool reaches vLLM (it answers 400 to one); the sub-request is searched by the proxy.
    assert not any(str(t.get("type", "")).startswith("web_search_") for t in sent.get("tools") or [])
    is_search = [t.get("name") for t in record["body"]["tools"]] == ["web_search"]
    asked = record["body"]["messages"][0]["content"][0]["text"] if is_search else ""
    assert searxng.queries == ([asked.split("query: ", 1)[1]] if is_search else [])
    if is_search:
        assert b'"type":"web_search_tool_result"' in body


def test_replayed_codex_request_is_searched_by_the_proxy(proxy, backend, searxng):
    (record,) = [r for r in capture(codex_file()) if r["target"] == "/v1/responses"]
    backend.responder = test_codex.stand_in_model
    status, body = replay(proxy.url, record)
    assert status == 200, body[:500]
    assert b'"type":"web_search_call"' in body and b"event: response.completed" in body
    assert searxng.queries == [test_codex.QUERY]
    sent = [r.json() for r in backend.received if r.path == "/v1/responses"]
    assert len(sent) == 2
    assert {"type": "function", "name": "web_search"}.items() <= next(t for t in sent[0]["tools"] if t.get("name") == "web_search").items()
    assert not any(t.get("type") == "web_search" for t in sent[0]["tools"])
    assert all(r.headers.get("authorization") == "Bearer sk-local" for r in backend.received)


def test_replayed_codex_alpha_search_is_answered_by_the_proxy(proxy, backend, searxng):
    """The standalone search request exactly as Codex sent it; its `open` named a loopback page
    of the capture run, which the default SSRF rules refuse, so only the search answers."""
    (record,) = [r for r in capture(f"codex-{pinned()['codex']}-alpha-search.json") if r["target"] == "/v1/alpha/search"]
    status, body = replay(proxy.url, record)
    assert status == 200, body[:500]
    answer = json.loads(body)
    assert set(answer) == {"output", "encrypted_output"}
    assert '## search_query "vllm 0.32 release notes"' in answer["output"] and "[turn0search0]" in answer["output"]
    assert "Failed (url_not_allowed)" in answer["output"]
    assert searxng.queries == ["vllm 0.32 release notes"] and backend.received == []
