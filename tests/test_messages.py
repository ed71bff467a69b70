"""Web search as Anthropic's server tool on /v1/messages (issue 10): the pure rules, then the
real proxy under gunicorn driven with the official `anthropic` SDK against a stand-in that
speaks vLLM's Messages format exactly as in tests/data/vllm-0.32-samples/messages-*.

Run: tests/run.sh tests/test_messages.py -x -q
"""
from __future__ import annotations

import base64
import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from clients import anthropic

from proxy.apis.messages.blocks import (
    ERROR_TEXT,
    add_usage,
    encode_content,
    kept_text,
    outcome_from_block,
    result_block,
)
from proxy.apis.messages.history import rewrite_history
from proxy.apis.messages.presentation import model_text, tool_results, with_counts
from proxy.apis.messages.request import (
    MessagesPlan,
    ToolPlan,
    internal_name,
    needs_rewrite,
    next_request,
    rewrite,
    subrequest_query,
    validate,
)
from proxy.apis.messages.wire import as_anthropic_error
from proxy.backends.search.search import Hit, SearchOutcome
from proxy.tools.sources import Sources, numbered
from proxy.tools.web_search import QUERY_SCHEMA, TOOL_DESCRIPTION, format_for_model
from standins import anthropic_wire as W
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply
from standins.searxng import result

SAMPLES = Path(__file__).parent / "data" / "vllm-0.32-samples"
SERVER_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}
ASK = [{"role": "user", "content": "What changed in vLLM 0.32?"}]


# ---- the stand-in speaks vLLM's format exactly -------------------------------------------------

def _sample_events(name):
    return W.parse_stream((SAMPLES / name).read_bytes())


@pytest.mark.parametrize("sample", ["messages-stream-text.sse", "messages-stream-thinking.sse",
                                    "messages-stream-forced-tool-use.sse"])
def test_stream_builder_reproduces_vllm_capture(sample):
    events = _sample_events(sample)
    start = events[0][1]["message"]
    blocks, cur = [], None
    for name, data in events:
        if name == "content_block_start":
            cur = {"start": data["content_block"], "pieces": [], "sig": None}
            blocks.append(cur)
        elif name == "content_block_delta":
            d = data["delta"]
            if d["type"] == "signature_delta":
                cur["sig"] = d["signature"]
            else:
                cur["pieces"].append(d.get("text", d.get("thinking", d.get("partial_json"))))
    built = []
    for b in blocks:
        kind = b["start"]["type"]
        if kind == "text":
            built.append(W.text(b["pieces"]))
        elif kind == "thinking":
            built.append(W.thinking(b["pieces"], b["sig"]))
        else:
            built.append(W.tool_use(b["start"]["name"], "".join(b["pieces"]), ident=b["start"]["id"]))
    end = events[-2][1]
    frames = W.stream_frames(built, stop_reason=end["delta"]["stop_reason"], input_tokens=start["usage"]["input_tokens"],
                             output_tokens=end["usage"]["output_tokens"], ident=start["id"])
    assert b"".join(frames) == (SAMPLES / sample).read_bytes()


def test_message_builder_reproduces_vllm_capture():
    raw = (SAMPLES / "messages-thinking.json").read_bytes()
    data = json.loads(raw)
    b = data["content"][0]
    built = W.message([W.thinking(b["thinking"], b["signature"])], stop_reason="max_tokens", ident=data["id"],
                      input_tokens=17, output_tokens=8)
    assert json.dumps(built, ensure_ascii=False, separators=(",", ":")).encode() == raw


def test_error_builder_matches_vllm_capture():
    raw = (SAMPLES / "messages-error-server-tool.json").read_bytes()
    data = json.loads(raw)["error"]
    assert W.error_reply(400, data["message"], data["param"]).body == raw


# ---- pure rules --------------------------------------------------------------------------------

STU = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q one"}}
HIT_BLOCK = {"type": "web_search_result", "url": "https://a.example/x", "title": "A",
             "encrypted_content": encode_content(Hit("A", "https://a.example/x", "snip A")), "page_age": "2026-01-02"}
WSTR = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [HIT_BLOCK]}


@pytest.mark.parametrize("body,expected", [
    ({"messages": ASK}, False),
    ({"messages": ASK, "tools": [SERVER_TOOL]}, True),
    ({"messages": ASK, "tools": [{"type": "web_search_20260209", "name": "web_search"}]}, True),
    # Claude Desktop's client-side WebSearch and a client's own web_search are normal tools.
    ({"messages": ASK, "tools": [{"name": "WebSearch", "input_schema": {"type": "object"}}]}, False),
    ({"messages": ASK, "tools": [{"name": "web_search", "input_schema": {"type": "object"}}]}, False),
    ({"messages": ASK + [{"role": "assistant", "content": [STU, WSTR]}]}, True),
    ({"messages": [{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]}, False),
    ([1, 2], False),
])
def test_which_requests_are_rewritten(body, expected):
    assert needs_rewrite(body) is expected


@pytest.mark.parametrize("tools,name", [
    ([SERVER_TOOL], "web_search"),
    ([SERVER_TOOL, {"name": "web_search", "input_schema": {}}], "web_search_server"),
    ([SERVER_TOOL, {"name": "web_search", "input_schema": {}}, {"name": "web_search_server", "input_schema": {}}],
     "web_search_server_2"),
])
def test_internal_name_never_collides(tools, name):
    assert internal_name(tools) == name


def test_rewrite_replaces_only_the_server_tool():
    body = {"model": "foundation", "max_tokens": 99, "messages": ASK, "metadata": {"user_id": "u"},
            "thinking": {"type": "adaptive"}, "tool_choice": {"type": "tool", "name": "web_search"},
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}},
                      {**SERVER_TOOL, "allowed_domains": ["docs.example"]}]}
    out, plan = rewrite(body)
    assert out["tools"][0] == body["tools"][0]
    assert out["tools"][1]["name"] == "web_search" and out["tools"][1]["input_schema"]["required"] == ["query"]
    assert "type" not in out["tools"][1] and "docs.example" in out["tools"][1]["description"]
    assert {k: v for k, v in out.items() if k != "tools"} == {k: v for k, v in body.items() if k != "tools"}
    searching = plan.offered["web_search"]
    assert (searching.max_uses, searching.limits.allowed_domains, plan.client_tools) == (8, ("docs.example",), True)


@pytest.mark.parametrize("problem,body", [
    ("max_uses", {"messages": ASK, "tools": [{**SERVER_TOOL, "max_uses": 0}]}),
    ("not both", {"messages": ASK, "tools": [{**SERVER_TOOL, "allowed_domains": ["a"], "blocked_domains": ["b"]}]}),
    ("messages", {"messages": "hi", "tools": [SERVER_TOOL]}),
])
def test_validate(problem, body):
    assert problem in validate(body)


def _tr(tid, text_has):
    return ("tool_result", tid, text_has)


def _shape(messages):
    out = []
    for m in messages:
        c = m["content"]
        out.append((m["role"], [c] if isinstance(c, str) else [
            _tr(b["tool_use_id"], None) if b["type"] == "tool_result" else (b["type"], b.get("id") or b.get("text"))
            for b in c]))
    return out


STU2 = {**STU, "id": "srvtoolu_2", "input": {"query": "q two"}}
WSTR2 = {**WSTR, "tool_use_id": "srvtoolu_2"}
TEXT = {"type": "text", "text": "so"}
BASH = {"type": "tool_use", "id": "toolu_b", "name": "Bash", "input": {}}


@pytest.mark.parametrize("history,expected", [
    ([{"role": "assistant", "content": [STU, WSTR, TEXT]}, {"role": "user", "content": "more"}],
     [("assistant", [("tool_use", "srvtoolu_1")]), ("user", [_tr("srvtoolu_1", None)]),
      ("assistant", [("text", "so")]), ("user", ["more"])]),
    # two searches of one round, then text
    ([{"role": "assistant", "content": [STU, STU2, WSTR, WSTR2, TEXT]}],
     [("assistant", [("tool_use", "srvtoolu_1"), ("tool_use", "srvtoolu_2")]),
      ("user", [_tr("srvtoolu_1", None), _tr("srvtoolu_2", None)]), ("assistant", [("text", "so")])]),
    # two searches one after the other
    ([{"role": "assistant", "content": [TEXT, STU, WSTR, STU2, WSTR2, TEXT]}],
     [("assistant", [("text", "so"), ("tool_use", "srvtoolu_1")]), ("user", [_tr("srvtoolu_1", None)]),
      ("assistant", [("tool_use", "srvtoolu_2")]), ("user", [_tr("srvtoolu_2", None)]), ("assistant", [("text", "so")])]),
    # a message ending on a result: the result opens the next user message
    ([{"role": "assistant", "content": [STU, WSTR]}, {"role": "user", "content": "ok?"}],
     [("assistant", [("tool_use", "srvtoolu_1")]), ("user", [_tr("srvtoolu_1", None), ("text", "ok?")])]),
    # a search whose result was not replayed still gets a tool_result; a client call keeps its own
    ([{"role": "assistant", "content": [STU, TEXT, BASH]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b", "content": "done"}]}],
     [("assistant", [("tool_use", "srvtoolu_1")]), ("user", [_tr("srvtoolu_1", None)]),
      ("assistant", [("text", "so"), ("tool_use", "toolu_b")]), ("user", [_tr("toolu_b", None)])]),
])
def test_replayed_history_becomes_tool_use_and_tool_result(history, expected):
    assert _shape(rewrite_history(history, NAMES)) == expected


def test_replayed_result_gives_the_model_the_same_text():
    outcome = SearchOutcome("q one", "ok", hits=[Hit("A", "https://a.example/x", "snip A", "2026-01-02"),
                                                 Hit("B", "https://b.example/y", "snip B")],
                            answers=["42"], infoboxes=["Box: text"])
    block = result_block("srvtoolu_1", outcome)
    assert [r["page_age"] for r in block["content"]] == ["2026-01-02", None]
    assert json.loads(base64.b64decode(block["content"][1]["encrypted_content"])) == {"snippet": "snip B"}
    assert format_for_model(outcome_from_block("q one", block["content"])) == format_for_model(outcome)


NAMES = {"web_search": "web_search", "web_fetch": "web_fetch"}  # each server tool's name on the vLLM side
HITS = [Hit("A", "https://a.example/x", "snip A", "2026-01-02"), Hit("B", "https://b.example/y", "snip B")]


@pytest.mark.parametrize("outcome,input_query", [
    (SearchOutcome("q one", "ok", hits=HITS), "q one"),
    # The lines the model read live beside the results: how they came, the cache's age, the repeat warning.
    (SearchOutcome("q one", "ok", hits=HITS, notes=["Some search engines failed (brave: timeout); results from the others."]), "q one"),
    (SearchOutcome("q one", "ok", hits=HITS, cached_age=6.4), "q one"),
    (SearchOutcome("q one", "ok", hits=HITS, cached_age=2.5, repeated=True, answers=["42"], infoboxes=["Box"]), "q one"),
    # Cleaned by the tool (a bang, spaces): the results say what was searched, live and replayed.
    (SearchOutcome("q one", "ok", hits=HITS), "  !q   one"),
    # A failure's own sentence, an empty search's: more than the block holds, so the handler keeps it by id.
    (SearchOutcome("q", "failed", message="Search failed: the query is empty. Call web_search with ...", error_code="invalid_tool_input"), ""),
    (SearchOutcome("q", "failed", message="Search failed: SearXNG answered 502.", error_code="unavailable", timed_out=True), "q"),
    (SearchOutcome("q", "empty", message='No results for "q".', repeated=True), "q"),
])
@pytest.mark.parametrize("cite", [True, False])
def test_a_replayed_search_reads_byte_for_byte_what_the_model_read(outcome, input_query, cite):
    """What turn 2 replays of a search is the very text turn 1's model read, so vLLM's prefix cache matches it."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "web_search", "input": {"query": input_query}}
    live = tool_results([use], [use], [outcome], Sources() if cite else None)["content"][0]["content"]
    assert live == numbered(Sources() if cite else None, outcome, model_text(outcome, {"query": input_query}))
    history = [{"role": "user", "content": "ask"},
               {"role": "assistant", "content": [{**use, "type": "server_tool_use", "id": "srvtoolu_1"},
                                                 result_block("srvtoolu_1", outcome), {"type": "text", "text": "so"}]},
               {"role": "user", "content": "more"}]
    kept = {"srvtoolu_1": {"output": live}} if kept_text(outcome) else {}
    replayed = rewrite_history(history, NAMES, cite=cite, kept=kept.get)[2]["content"][0]["content"]
    assert replayed == live
    if outcome.status == "failed":
        assert live == format_for_model(outcome)  # the live sentence, with its advice
        # Once the worker no longer keeps it: the code's sentence (the answer is right; the cache misses from here).
        gone = rewrite_history(history, NAMES, cite=cite)[2]["content"][0]["content"]
        assert gone == ERROR_TEXT[outcome.error_code]
    for line in outcome.notes + ([outcome.cached_note.strip()] if outcome.ok and outcome.cached_age else []):
        assert line in live


@pytest.mark.parametrize("content,status,code", [
    ({"type": "web_search_tool_result_error", "error_code": "too_many_requests"}, "failed", "too_many_requests"),
    ([], "empty", None),
    # Anthropic's real ciphertext can't be read back: the hit stays, without a snippet.
    ([{"type": "web_search_result", "url": "https://x.example", "title": "X", "encrypted_content": "Eq0K@@", "page_age": None}], "ok", None),
])
def test_outcome_from_replayed_block(content, status, code):
    o = outcome_from_block("q", content)
    assert (o.status, o.error_code) == (status, code)


@pytest.mark.parametrize("body,expected", [
    ({"tools": [SERVER_TOOL], "messages": [{"role": "user", "content": "Perform a web search for the query: vllm 0.32 notes"}]},
     "vllm 0.32 notes"),
    ({"tools": [SERVER_TOOL], "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Perform a web search for the query: a b"}]}]}, "a b"),
    ({"tools": [SERVER_TOOL, {"name": "Bash", "input_schema": {}}],
      "messages": [{"role": "user", "content": "Perform a web search for the query: a"}]}, None),
    ({"tools": [SERVER_TOOL], "messages": [{"role": "user", "content": "search for a"}]}, None),
    ({"tools": [SERVER_TOOL], "messages": ASK + ASK}, None),
])
def test_claude_code_subrequest_detection(body, expected):
    assert subrequest_query(body) == expected


@pytest.mark.parametrize("tool_choice,client_tools,expected", [
    ({"type": "tool", "name": "web_search"}, False, {"type": "auto"}),
    ({"type": "tool", "name": "web_search", "disable_parallel_tool_use": True}, False,
     {"type": "auto", "disable_parallel_tool_use": True}),
    ({"type": "any"}, False, {"type": "auto"}),
    ({"type": "any"}, True, {"type": "any"}),
    ({"type": "tool", "name": "Bash"}, True, {"type": "tool", "name": "Bash"}),
    ({"type": "auto"}, False, {"type": "auto"}),
])
def test_forced_choice_applies_to_the_first_turn_only(tool_choice, client_tools, expected):
    plan = MessagesPlan({"web_search": "web_search", "web_fetch": "web_fetch"},
                        {"web_search": ToolPlan("web_search", "web_search")}, client_tools=client_tools)
    assert next_request({"tool_choice": tool_choice}, [], plan)["tool_choice"] == expected


@pytest.mark.parametrize("status,raw,expected", [
    (400, (SAMPLES / "messages-error-server-tool.json").read_bytes(), ("invalid_request_error", "input_schema")),
    (404, (SAMPLES / "messages-error-wrong-model.txt").read_bytes().split(b"\n")[0], ("NotFoundError", "nope")),
    (500, b"Internal Server Error", ("api_error", "Internal Server Error")),
    (429, b'{"error": "slow down"}', ("rate_limit_error", "slow down")),
])
def test_vllm_errors_in_anthropic_shape(status, raw, expected):
    data = json.loads(as_anthropic_error(status, raw))
    assert data["type"] == "error" and data["error"]["type"] == expected[0] and expected[1] in data["error"]["message"]


def test_usage_adds_up():
    total = add_usage(add_usage(None, {"input_tokens": 10, "output_tokens": 3}),
                        {"input_tokens": 30, "output_tokens": 5, "cache_read_input_tokens": 4})
    assert with_counts(total, {"web_search_requests": 2}) == {"input_tokens": 40, "output_tokens": 8, "cache_read_input_tokens": 4,
                                         "server_tool_use": {"web_search_requests": 2, "web_fetch_requests": 0}}


# ---- through the proxy -------------------------------------------------------------------------

def sdk(proxy, **kw):
    return anthropic.Anthropic(base_url=proxy.url, api_key="dummy", max_retries=0, timeout=30, **kw)


def reply(blocks, stream, **kw):
    return W.stream_reply(blocks, **kw) if stream else W.message_reply(blocks, **kw)


def ask(proxy, stream, beta=False, **kw):
    """One request through the SDK; streamed ones go through the SDK's own accumulator. The
    beta API (`?beta=true`, as Claude Code calls it) has its own accumulator and types."""
    c = sdk(proxy).beta if beta else sdk(proxy)
    kw = {"model": "foundation", "max_tokens": 512, "messages": ASK, **kw}
    if stream:
        with c.messages.stream(**kw) as s:
            return s.get_final_message()
    return c.messages.create(**kw)


def raw_post(proxy, body, path="/v1/messages?beta=true", headers=None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(proxy.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "x-api-key": "dummy",
                                          "anthropic-version": "2023-06-01", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def kinds(message) -> list[str]:
    return [b.type for b in message.content]


def turns(backend):
    return [r for r in backend.received if r.path.startswith("/v1/messages")]


@pytest.mark.parametrize("stream", [False, True])
def test_search_yields_server_blocks_text_and_summed_usage(proxy, backend, searxng, stream):
    call = W.tool_use("web_search", {"query": "vllm 0.32 release notes"})
    backend.script(reply([W.thinking("let me look"), call], stream, input_tokens=100, output_tokens=20),
                   reply([W.text(["vLLM 0.32 ", "adds things."])], stream, input_tokens=300, output_tokens=15))
    msg = ask(proxy, stream, beta=True, tools=[SERVER_TOOL], extra_query={"beta": "true"})
    assert kinds(msg) == ["thinking", "server_tool_use", "web_search_tool_result", "text"]
    use, res = msg.content[1], msg.content[2]
    assert use.id.startswith("srvtoolu_") and use.name == "web_search" and use.input == {"query": "vllm 0.32 release notes"}
    assert res.tool_use_id == use.id
    assert [r.url for r in res.content] == [f"https://example.org/vllm-0.32-release-notes/{i}" for i in (1, 2, 3)]
    assert res.content[0].page_age == "2026-11-01" and res.content[1].page_age is None
    assert msg.content[3].text == "vLLM 0.32 adds things." and msg.stop_reason == "end_turn"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (400, 35)
    assert msg.usage.server_tool_use.web_search_requests == 1
    assert searxng.queries == ["vllm 0.32 release notes"]
    first, second = [r.json() for r in turns(backend)]
    assert [r.query for r in turns(backend)] == ["beta=true", "beta=true"]
    assert first["tools"] == [{"name": "web_search", "description": TOOL_DESCRIPTION, "input_schema": QUERY_SCHEMA}]
    assert second["messages"][:1] == ASK
    assistant, user = second["messages"][1:]
    assert assistant == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "let me look", "signature": W.thinking("").get("signature")},
        {"type": "tool_use", "id": call["id"], "name": "web_search", "input": {"query": "vllm 0.32 release notes"}}]}
    assert user["content"][0]["tool_use_id"] == call["id"]
    assert "Snippet 1 about vllm 0.32 release notes" in user["content"][0]["content"]


def stream_events(proxy, body, path="/v1/messages?beta=true"):
    status, _, raw = raw_post(proxy, {**body, "stream": True}, path)
    assert status == 200, raw
    return W.parse_stream(raw)


def test_stream_is_one_well_formed_message_with_pings(proxy, backend, searxng):
    searxng.behave("slow one", "slow", seconds=0.7)
    backend.script(W.stream_reply([W.text("first I search"), W.tool_use("web_search", {"query": "slow one"})]),
                   W.stream_reply([W.tool_use("web_search", {"query": "a"}), W.tool_use("web_search", {"query": "b"})]),
                   W.stream_reply([W.thinking(["hm", "m"]), W.text(["do", "ne"])]))
    events = stream_events(proxy, {"model": "foundation", "max_tokens": 99, "messages": ASK, "tools": [SERVER_TOOL]})
    names = [n for n, _ in events]
    assert names.count("message_start") == names.count("message_delta") == names.count("message_stop") == 1
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert "ping" in names[names.index("content_block_start"):]
    starts = [d for n, d in events if n == "content_block_start"]
    assert [d["index"] for d in starts] == list(range(9))
    assert [d["content_block"]["type"] for d in starts] == [
        "text", "server_tool_use", "web_search_tool_result", "server_tool_use", "server_tool_use",
        "web_search_tool_result", "web_search_tool_result", "thinking", "text"]
    assert not any(d.get("content_block", {}).get("type") == "tool_use" for _, d in events if d)
    # Every block opens, is filled only while open, and closes, in order.
    open_ = None
    for n, d in events:
        if n == "content_block_start":
            assert open_ is None
            open_ = d["index"]
        elif n in ("content_block_delta", "content_block_stop"):
            assert d["index"] == open_
            open_ = None if n == "content_block_stop" else open_
    use = [d for n, d in events if n == "content_block_delta" and d["index"] == 1]
    assert [u["delta"]["partial_json"] for u in use] == ["", '{"query": "slow one"}']
    assert events[-2][1]["usage"]["server_tool_use"] == {"web_search_requests": 3, "web_fetch_requests": 0}
    assert sorted(searxng.queries) == ["a", "b", "slow one"]


@pytest.mark.parametrize("stream", [False, True])
def test_same_blocks_streaming_or_not(proxy, backend, searxng, stream):
    backend.script(reply([W.text("first I search"), W.tool_use("web_search", {"query": "x"})], stream),
                   reply([W.tool_use("web_search", {"query": "a"}), W.tool_use("web_search", {"query": "b"})], stream),
                   reply([W.thinking("hmm"), W.text("done")], stream))
    msg = ask(proxy, stream, tools=[SERVER_TOOL])
    assert kinds(msg) == ["text", "server_tool_use", "web_search_tool_result", "server_tool_use", "server_tool_use",
                          "web_search_tool_result", "web_search_tool_result", "thinking", "text"]
    assert [b.tool_use_id for b in msg.content if b.type == "web_search_tool_result"] == \
           [b.id for b in msg.content if b.type == "server_tool_use"]
    assert msg.usage.server_tool_use.web_search_requests == 3
    assert msg.content[7].thinking == "hmm" and msg.content[7].signature


def test_request_without_server_tool_is_relayed_byte_for_byte(proxy, backend):
    body = {"model": "foundation", "max_tokens": 5, "messages": ASK,
            "tools": [{"name": "web_search", "description": "mine", "input_schema": {"type": "object"}}]}
    sent = json.dumps(body, indent=1).encode()
    answer = W.message_reply([W.tool_use("web_search", {"query": "mine"})]).body
    backend.script(Reply(body=answer))
    req = urllib.request.Request(proxy.url + "/v1/messages?beta=true", data=sent, method="POST",
                                 headers={"content-type": "application/json"})
    assert urllib.request.urlopen(req, timeout=10).read() == answer
    assert backend.received[0].body == sent and backend.received[0].query == "beta=true"


def test_client_web_search_tool_beside_the_server_tool(proxy, backend, searxng):
    mine = {"name": "web_search", "description": "the client's own", "input_schema": {"type": "object"}}
    backend.script(W.message_reply([W.tool_use("web_search_server", {"query": "proxy side"})]),
                   W.message_reply([W.tool_use("web_search", {"query": "client side"})]))
    msg = ask(proxy, False, tools=[mine, SERVER_TOOL])
    assert kinds(msg) == ["server_tool_use", "web_search_tool_result", "tool_use"]
    assert msg.content[2].name == "web_search" and msg.stop_reason == "tool_use"
    assert searxng.queries == ["proxy side"]
    assert [t["name"] for t in turns(backend)[0].json()["tools"]] == ["web_search", "web_search_server"]


def test_client_tool_call_after_a_search_goes_back_to_the_client(proxy, backend, searxng):
    bash = W.tool_use("Bash", {"command": "ls"})
    backend.script(W.stream_reply([W.tool_use("web_search", {"query": "q"})]), W.stream_reply([W.text("run it"), bash]))
    msg = ask(proxy, True, tools=[{"name": "Bash", "input_schema": {"type": "object"}}, SERVER_TOOL])
    assert kinds(msg) == ["server_tool_use", "web_search_tool_result", "text", "tool_use"]
    assert msg.content[3].id == bash["id"] and msg.content[3].input == {"command": "ls"} and msg.stop_reason == "tool_use"


def test_mixed_turn_runs_searches_and_stubs_client_calls(proxy, backend, searxng):
    bash = W.tool_use("Bash", {"command": "ls"})
    backend.script(W.message_reply([W.tool_use("web_search", {"query": "q"}), bash]), W.message_reply([W.text("ok")]))
    msg = ask(proxy, False, tools=[{"name": "Bash", "input_schema": {"type": "object"}}, SERVER_TOOL])
    assert kinds(msg) == ["server_tool_use", "web_search_tool_result", "text"]
    results = turns(backend)[1].json()["messages"][-1]["content"]
    assert [r["tool_use_id"] for r in results][1] == bash["id"] and results[1]["content"].startswith("Not executed")


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_choice_is_forced_once(proxy, backend, searxng, stream):
    backend.script(reply([W.tool_use("web_search", {"query": "q"})], stream), reply([W.text("ok")], stream))
    ask(proxy, stream, tools=[SERVER_TOOL], tool_choice={"type": "tool", "name": "web_search"})
    assert [t.json()["tool_choice"] for t in turns(backend)] == [{"type": "tool", "name": "web_search"}, {"type": "auto"}]


@pytest.mark.parametrize("stream", [False, True])
def test_max_uses(proxy, backend, searxng, stream):
    backend.script(reply([W.tool_use("web_search", {"query": "one"}), W.tool_use("web_search", {"query": "two"})], stream),
                   reply([W.tool_use("web_search", {"query": "three"})], stream),
                   reply([W.text("answer")], stream))
    msg = ask(proxy, stream, tools=[{**SERVER_TOOL, "max_uses": 1}])
    results = [b for b in msg.content if b.type == "web_search_tool_result"]
    assert isinstance(results[0].content, list)
    assert [r.content.error_code for r in results[1:]] == ["max_uses_exceeded"] * 2
    assert searxng.queries == ["one"] and msg.usage.server_tool_use.web_search_requests == 1
    told = turns(backend)[1].json()["messages"][-1]["content"][1]["content"]
    assert "max_uses" in told


MIXED = [result("https://docs.example.com/a", "Docs A", "in docs"), result("https://blog.other.org/b", "Blog B", "blog"),
         result("https://sub.docs.example.com/c", "Docs C", "sub docs")]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("filters,urls", [
    ({"allowed_domains": ["docs.example.com"]}, ["https://docs.example.com/a", "https://sub.docs.example.com/c"]),
    ({"blocked_domains": ["docs.example.com"]}, ["https://blog.other.org/b"]),
    ({"allowed_domains": ["nowhere.example"]}, []),
])
def test_domain_filters(proxy, backend, searxng, filters, urls, stream):
    searxng.behave("q", "results", results=MIXED)
    backend.script(reply([W.tool_use("web_search", {"query": "q"})], stream), reply([W.text("ok")], stream))
    msg = ask(proxy, stream, tools=[{**SERVER_TOOL, **filters}])
    assert [r.url for r in msg.content[1].content] == urls
    seen = turns(backend)[1].json()["messages"][-1]["content"][0]["content"]
    for r in MIXED:
        assert (r["url"] in seen) == (r["url"] in urls)


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("setup,query,code", [
    (("status", {"code": 429}), "q", "too_many_requests"),
    (("status", {"code": 403}), "q", "unavailable"),
    (("nonjson", {}), "q", "unavailable"),
    (("dead", {}), "q", "unavailable"),
    (None, "  !! ", "invalid_tool_input"),
    (None, "word " * 100, "query_too_long"),
    ("down", "q", "unavailable"),
])
def test_search_failures_become_error_blocks(start_proxy, backend, searxng, setup, query, code, stream):
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2", **({"SEARXNG_URL": f"http://127.0.0.1:{_closed_port()}"} if setup == "down" else {}))
    if isinstance(setup, tuple):
        searxng.behave(None, setup[0], **setup[1])
    backend.script(reply([W.tool_use("web_search", {"query": query})], stream), reply([W.text("sorry")], stream))
    msg = ask(proxy, stream, tools=[SERVER_TOOL])
    assert kinds(msg) == ["server_tool_use", "web_search_tool_result", "text"]
    assert msg.content[1].content.type == "web_search_tool_result_error"
    assert msg.content[1].content.error_code == code
    assert msg.usage.server_tool_use.web_search_requests == 0
    told = turns(backend)[1].json()["messages"][-1]["content"][0]["content"]
    assert told.startswith("Search failed")


def test_replayed_history_shows_the_model_the_same_results(proxy, backend, searxng):
    searxng.behave("q", "results", results=MIXED, answers=["an answer"])
    backend.script(W.message_reply([W.tool_use("web_search", {"query": "q"})]), W.message_reply([W.text("first")]))
    first = ask(proxy, False, tools=[SERVER_TOOL])
    seen_first = turns(backend)[1].json()["messages"][-1]["content"][0]["content"]
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=False) for b in first.content]},
                     {"role": "user", "content": "and then?"}]
    for tools in ([SERVER_TOOL], None):
        backend.reset()
        backend.script(W.message_reply([W.text("second")]))
        kw = {"tools": tools} if tools else {}
        second = ask(proxy, False, messages=history, **kw)
        assert second.content[0].text == "second"
        sent = turns(backend)[0].json()["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
        assert sent[1]["content"][0]["type"] == "tool_use" and sent[1]["content"][0]["id"] == first.content[0].id
        assert sent[2]["content"][0]["content"] == seen_first
        assert sent[4]["content"] == "and then?"
    assert searxng.queries == ["q"]


def test_replayed_history_streams_through(proxy, backend):
    history = ASK + [{"role": "assistant", "content": [STU, WSTR, TEXT]}, {"role": "user", "content": "go on"}]
    backend.script(W.stream_reply([W.text(["a", "b"])]))
    msg = ask(proxy, True, messages=history)
    assert msg.content[0].text == "ab"
    assert "snip A" in turns(backend)[0].json()["messages"][2]["content"][0]["content"]


def test_count_tokens_gets_the_same_rewrite(proxy, backend):
    backend.script(Reply(path="/v1/messages/count_tokens", body=b'{"input_tokens":321}'))
    history = ASK + [{"role": "assistant", "content": [STU, WSTR, TEXT]}, {"role": "user", "content": "go on"}]
    n = sdk(proxy).messages.count_tokens(model="foundation", messages=history, tools=[SERVER_TOOL])
    assert n.input_tokens == 321
    got = backend.received[0]
    assert got.path == "/v1/messages/count_tokens"
    body = got.json()
    assert body["tools"][0]["input_schema"] == QUERY_SCHEMA
    assert [b["type"] for b in body["messages"][1]["content"]] == ["tool_use"]


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_errors_reach_the_sdk_in_anthropic_shape(proxy, backend, stream):
    raw = (SAMPLES / "messages-error-server-blocks-in-history.json").read_bytes()
    backend.script(Reply(status=400, body=raw))
    with pytest.raises(anthropic.BadRequestError) as e:
        ask(proxy, stream, tools=[SERVER_TOOL])
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "server_tool_use" in e.value.body["error"]["message"]


def test_vllm_error_on_a_later_turn_of_a_stream(proxy, backend, searxng):
    backend.script(W.stream_reply([W.tool_use("web_search", {"query": "q"})]),
                   W.error_reply(400, "context too long"))
    with pytest.raises(anthropic.APIStatusError) as e:
        ask(proxy, True, tools=[SERVER_TOOL])
    assert "context too long" in str(e.value)


def test_proxy_errors_are_anthropic_shaped(start_proxy, backend):
    proxy = start_proxy(BACKEND_URL=f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(anthropic.APIStatusError) as e:
        ask(proxy, False, tools=[SERVER_TOOL])
    assert e.value.status_code == 502 and e.value.body["error"]["type"] == "api_error"
    status, _, raw = raw_post(proxy, {"model": "m", "max_tokens": 1, "messages": ASK, "tools": [{**SERVER_TOOL, "max_uses": -1}]})
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [False, True])
def test_search_iteration_cap(start_proxy, backend, searxng, stream):
    proxy = start_proxy(MAX_SEARCH_ITER="2", KEEPALIVE_INTERVAL="0.2")
    backend.responder = lambda r: reply([W.tool_use("web_search", {"query": f"q{len(backend.received)}"})], stream)
    with pytest.raises(anthropic.APIStatusError) as e:
        ask(proxy, stream, tools=[SERVER_TOOL])
    assert "2 of 2 search rounds used (2 searches" in str(e.value)
    assert len(searxng.queries) == 2 and len(turns(backend)) == 3


def test_x_api_key_is_checked_and_never_forwarded(start_proxy, backend, searxng):
    proxy = start_proxy(PROXY_API_KEY="k1", BACKEND_API_KEY="bk")
    backend.script(W.message_reply([W.tool_use("web_search", {"query": "q"})]), W.message_reply([W.text("ok")]))
    msg = anthropic.Anthropic(base_url=proxy.url, api_key="k1", max_retries=0).messages.create(
        model="foundation", max_tokens=9, messages=ASK, tools=[SERVER_TOOL])
    assert msg.content[-1].text == "ok"
    for r in turns(backend):
        assert r.headers["authorization"] == "Bearer bk" and "x-api-key" not in r.headers
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=proxy.url, api_key="wrong", max_retries=0).messages.create(
            model="foundation", max_tokens=9, messages=ASK)


MODELS = (SAMPLES / "models.json").read_bytes()


@pytest.mark.parametrize("env,asked,expected", [
    ({"ANTHROPIC_ANY_MODEL": "1"}, "claude-haiku-4-5-20251001", "foundation"),
    ({"ANTHROPIC_ANY_MODEL": "1"}, "foundation", "foundation"),
    ({}, "claude-haiku-4-5-20251001", "claude-haiku-4-5-20251001"),
])
def test_any_model_option(start_proxy, backend, env, asked, expected):
    proxy = start_proxy(**env)
    backend.responder = lambda r: Reply(body=MODELS) if r.path == "/v1/models" else W.message_reply([W.text("hi")])
    body = {"model": asked, "max_tokens": 5, "messages": ASK}
    status, _, _ = raw_post(proxy, body)
    assert status == 200
    assert turns(backend)[0].json()["model"] == expected
    if asked == expected:  # nothing to change: the relay is byte for byte
        assert turns(backend)[0].body == json.dumps(body).encode()


@pytest.mark.parametrize("stream", [False, True])
def test_claude_code_subrequest_searches_its_query_directly(proxy, backend, searxng, stream):
    q = "vLLM 0.32 release notes 2026"
    backend.script(reply([W.text("Here is what I found.")], stream, input_tokens=200, output_tokens=10))
    body = dict(system="You are an assistant for performing a web search tool use",
                messages=[{"role": "user", "content": f"Perform a web search for the query: {q}"}],
                tools=[SERVER_TOOL], tool_choice={"type": "auto"})
    msg = ask(proxy, stream, **body)
    assert searxng.queries == [q]
    assert kinds(msg) == ["server_tool_use", "web_search_tool_result", "text"]
    assert msg.content[0].input == {"query": q} and msg.usage.server_tool_use.web_search_requests == 1
    (only,) = turns(backend)
    sent = only.json()["messages"]
    assert sent[1]["content"][0]["input"] == {"query": q} and sent[2]["content"][0]["type"] == "tool_result"


# ---- disconnects -----------------------------------------------------------------------------

def _open_stream(proxy, body, until: bytes):
    """Start a streamed request on a raw socket and read until `until` shows up; the caller closes."""
    host, port = proxy.url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    data = json.dumps({**body, "stream": True}).encode()
    sock.sendall(b"POST /v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    seen = b""
    while until not in seen:
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    return sock


def test_disconnect_mid_search_stops_the_loop(proxy, backend, searxng):
    searxng.behave("slow", "slow", seconds=1.5)
    backend.script(W.stream_reply([W.tool_use("web_search", {"query": "slow"})]), W.stream_reply([W.text("never")]))
    # The first ping comes once the turn's tool call is read; the search may not have reached SearXNG yet (a
    # busy machine), and a client leaving before that would end it unsent: wait until SearXNG has it.
    sock = _open_stream(proxy, {"model": "foundation", "max_tokens": 9, "messages": ASK, "tools": [SERVER_TOOL]},
                        b"event: ping")
    deadline = time.monotonic() + 10
    while not searxng.queries:
        assert time.monotonic() < deadline, "the search never reached SearXNG"
        time.sleep(0.01)
    sock.close()
    time.sleep(2.5)
    assert searxng.queries == ["slow"] and len(turns(backend)) == 1


def test_disconnect_mid_generation_aborts_vllm(proxy, backend, searxng):
    backend.script(W.stream_reply([W.tool_use("web_search", {"query": "q"})]),
                   W.stream_reply([W.text(["one ", "two ", "three ", "four"])], gap=1.0))
    sock = _open_stream(proxy, {"model": "foundation", "max_tokens": 9, "messages": ASK, "tools": [SERVER_TOOL]},
                        b'"one "')
    sock.close()
    assert backend.wait_for(lambda b: 1 in b.hangups, timeout=5)


def test_disconnect_during_plain_loop_aborts_vllm(proxy, backend, searxng):
    searxng.behave("slow", "slow", seconds=1.5)
    backend.script(W.message_reply([W.tool_use("web_search", {"query": "slow"})]), W.message_reply([W.text("x")]))
    backend.replies[-1].delay = 3.0
    c = anthropic.Anthropic(base_url=proxy.url, api_key="dummy", max_retries=0, timeout=2.0)
    with pytest.raises(anthropic.APITimeoutError):
        c.messages.create(model="foundation", max_tokens=9, messages=ASK, tools=[SERVER_TOOL])
    assert backend.wait_for(lambda b: 1 in b.hangups, timeout=6)


@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogates_in_results_do_not_break_the_reply(proxy, backend, searxng, stream):
    # SearXNG may relay a page title holding a lone `\ud800` escape; UTF-8 can't encode it.
    searxng.behave("q", "results", results=[result("https://x.example/a", "bad \ud800 title", "snip \udfff")])
    backend.script(reply([W.tool_use("web_search", {"query": "q"})], stream), reply([W.text("ok")], stream))
    msg = ask(proxy, stream, tools=[SERVER_TOOL])
    assert kinds(msg) == ["server_tool_use", "web_search_tool_result", "text"]
    assert msg.content[1].content[0].url == "https://x.example/a"


@pytest.mark.parametrize("body", [
    {"messages": 1},
    {"messages": ASK, "tools": 1},
    {"messages": [1], "tools": [SERVER_TOOL]},
    {"messages": ASK, "tools": [SERVER_TOOL, 5]},
    {"messages": ASK, "tools": [{**SERVER_TOOL, "max_uses": "8"}]},
    {"messages": ASK, "tools": [{**SERVER_TOOL, "allowed_domains": "a.example"}]},
    {"messages": [{"role": "user", "content": "Perform a web search for the query: x"}], "tools": [SERVER_TOOL],
     "tool_choice": "auto"},
    {"messages": ASK + [{"role": "assistant", "content": [STU, 5, {**WSTR, "content": "?"}, {"type": "server_tool_use"}]}]},
    {"messages": ASK + [{"role": "assistant", "content": [{**STU, "input": "q"}, WSTR]}], "tools": [SERVER_TOOL]},
])
def test_malformed_requests_get_a_client_error_not_a_500(proxy, backend, searxng, body):
    backend.responder = lambda r: W.error_reply(400, "vLLM says no")
    status, _, raw = raw_post(proxy, {"model": "foundation", "max_tokens": 5, **body})
    assert 400 <= status < 500, raw
    assert "error" in json.loads(raw)


@pytest.mark.parametrize("tools", [None, [SERVER_TOOL]])
def test_stream_without_a_search_reaches_the_client_byte_for_byte(proxy, backend, tools):
    # Relayed (no server tool) or rewritten but never searched: vLLM's own bytes either way.
    raw = (SAMPLES / "messages-stream-thinking.sse").read_bytes()
    backend.script(Reply(headers=[("Content-Type", "text/event-stream; charset=utf-8")], chunks=[raw[:100], raw[100:]]))
    body = {"model": "foundation", "max_tokens": 8, "messages": ASK, "stream": True, **({"tools": tools} if tools else {})}
    status, _, got = raw_post(proxy, body)
    assert status == 200 and got == raw


def test_plain_reply_is_one_message_with_the_first_turns_id(proxy, backend, searxng):
    backend.script(W.message_reply([W.tool_use("web_search", {"query": "q"})], ident="chatcmpl-first"),
                   W.message_reply([W.text("ok")], ident="chatcmpl-second"))
    assert ask(proxy, False, tools=[SERVER_TOOL]).id == "chatcmpl-first"


def test_a_finished_stream_leaves_its_vllm_connection_in_the_pool(start_proxy, backend):
    """Reading vLLM's stream past message_stop lets the next request reuse the connection."""
    p = start_proxy(KEEPALIVE_INTERVAL="0.2", PROXY_WORKER_CONNECTIONS="998")  # a proxy of its own: an empty pool
    body = {"model": "foundation", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    before = backend.accepted
    for _ in range(3):
        backend.script(W.stream_reply([W.text("hello")], stop_reason="end_turn"))
        assert raw_request(p.url, "POST", "/v1/messages", json.dumps(body).encode())[0] == 200
    assert backend.accepted - before == 1, "all three streams must ride one pooled connection"
