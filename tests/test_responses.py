"""Tests for /v1/responses with the hosted web_search tool (issue 11): the pure rules of
proxy/apis/responses/request.py, responses_calls.py and responses_output.py, the vLLM Responses stand-in
against the real captures, and the real proxy under gunicorn driven by the official openai SDK.
Run: tests/run.sh tests/test_responses.py
"""
from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

import pytest
from clients import openai

from proxy.apis.responses.calls import next_request, tool_request
from proxy.apis.responses.output import add_usage, web_search_item
from proxy.apis.responses.request import (
    ResponsesPlan,
    first_request,
    internal_name,
    make_plan,
    needs_rewrite,
    refusal,
    replay,
    rewrite_tool_choice,
)
from proxy.backends.search.search import Hit, SearchOutcome
from proxy.tools.base import NOT_EXECUTED
from proxy.tools.web_search import shaped
from standins import responses_wire as w
from standins.rawhttp import raw_request
from standins.searxng import result

SAMPLES = Path(__file__).resolve().parent / "data" / "vllm-0.32-samples"
HOSTED = {"type": "web_search", "external_web_access": False}
SHELL = {"type": "function", "name": "shell", "description": "Run a command",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
         "strict": False}
OWN_WEB_SEARCH = {"type": "function", "name": "web_search", "description": "The client's own search",
                  "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def codex_body(**kw) -> dict:
    """The shape Codex 0.171.0 sends (tests/data/agent-wire/codex-0.171.0-websearch.json; test_agent_wire.py compares)."""
    body = {"model": "foundation", "instructions": "You are Codex.", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is new in vLLM?"}]}],
        "tools": [SHELL, HOSTED], "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k1"}
    body.update(kw)
    return body


def client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def vllm_requests(backend) -> list[dict]:
    return [r.json() for r in backend.received if r.path == "/v1/responses"]


def search_then_answer(query="vllm 0.32 release", text="vLLM 0.32 shipped.") -> tuple:
    return ([w.reasoning("I should look it up"), w.call("web_search", {"query": query})],
            [w.reasoning("Now I know"), w.message(text)])


# ---- pure rules -------------------------------------------------------------------------

@pytest.mark.parametrize("body,expected", [
    ({"input": "hi"}, False),
    ({"input": "hi", "tools": [SHELL]}, False),
    ({"input": "hi", "tools": [OWN_WEB_SEARCH]}, False),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, True),
    ({"input": "hi", "tools": [{"type": "web_search_2025_08_26"}]}, True),
    ({"input": "hi", "tools": [{"type": "web_search_preview"}]}, True),
    ({"input": "hi", "tools": [{"type": "web_search_preview_2025_03_11"}]}, True),
    ({"input": "hi", "tools": [{"type": "file_search"}]}, False),
    ({"input": [{"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "q"}}]}, True),
    ({"input": [{"role": "user", "content": "web_search_call"}]}, False),
])
def test_which_requests_are_rewritten(body, expected):
    assert needs_rewrite(body) is expected


@pytest.mark.parametrize("tools,name", [
    ([HOSTED], "web_search"),
    ([SHELL, HOSTED], "web_search"),
    ([OWN_WEB_SEARCH, HOSTED], "web_search_hosted"),
    ([OWN_WEB_SEARCH, {"type": "function", "name": "web_search_hosted"}, HOSTED], "web_search_hosted_2"),
    ([{"type": "custom", "name": "web_search"}, HOSTED], "web_search_hosted"),
    ([{"type": "namespace", "name": "web", "tools": [{"type": "function", "name": "search"}]}, HOSTED], "web_search"),
])
def test_internal_function_name_avoids_client_tools(tools, name):
    assert internal_name(tools) == name


@pytest.mark.parametrize("choice,expected", [
    ("auto", "auto"), ("none", "none"), ("required", "required"),
    ({"type": "web_search"}, {"type": "function", "name": "web_search"}),
    ({"type": "web_search_preview"}, {"type": "function", "name": "web_search"}),
    ({"type": "function", "name": "shell"}, {"type": "function", "name": "shell"}),
    ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "web_search"}, {"type": "function", "name": "shell"}]},
     {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "web_search"}, {"type": "function", "name": "shell"}]}),
])
def test_tool_choice_rewrite(choice, expected):
    assert rewrite_tool_choice(choice, "web_search") == expected


@pytest.mark.parametrize("choice,after", [
    ("required", "auto"), ({"type": "function", "name": "web_search"}, "auto"),
    ({"type": "allowed_tools", "mode": "required", "tools": []}, "auto"),
    ("auto", "auto"), ("none", "none"), ({"type": "function", "name": "shell"}, {"type": "function", "name": "shell"}),
])
def test_forced_search_is_forced_once(choice, after):
    call = w.output_item(w.call("web_search", {"query": "x"}))
    nxt = next_request({"input": "hi", "tool_choice": choice}, [call], plan(), {call["call_id"]: ok("x")})
    assert nxt["tool_choice"] == after


@pytest.mark.parametrize("tool,results,language", [
    ({"type": "web_search"}, 5, None),
    ({"type": "web_search", "search_context_size": "low"}, 3, None),
    ({"type": "web_search", "search_context_size": "medium"}, 5, None),
    ({"type": "web_search", "search_context_size": "high"}, 10, None),
    ({"type": "web_search", "user_location": {"type": "approximate", "country": "DE", "city": "Berlin"}}, 5, "de-DE"),
    ({"type": "web_search", "user_location": {"type": "approximate", "country": "br"}}, 5, "pt-BR"),
    ({"type": "web_search", "user_location": {"type": "approximate", "country": "CH"}}, 5, None),
    ({"type": "web_search", "user_location": {"type": "approximate", "city": "Paris"}}, 5, None),
])
def test_user_location_and_context_size(tool, results, language):
    p = make_plan({"input": "hi", "tools": [tool]}, 5)
    assert (p.results, p.language) == (results, language)


@pytest.mark.parametrize("item,call_args,output_has", [
    ({"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "rust 2026"}},
     {"query": "rust 2026"}, "not kept"),
    ({"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "q",
      "sources": [{"type": "url", "url": "https://a.example/x"}]}}, {"query": "q"}, "https://a.example/x"),
    ({"type": "web_search_call", "status": "failed", "action": {"type": "search", "query": "q"}}, {"query": "q"}, "failed"),
    ({"type": "web_search_call", "status": "completed", "action": {"type": "open_page", "url": "https://b.example/"}},
     {"query": "https://b.example/"}, "not kept"),
    ({"type": "web_search_call", "status": "completed", "action": {"type": "find_in_page", "url": "https://c.example/", "pattern": "foo"}},
     {"query": "foo https://c.example/"}, "not kept"),
    ({"type": "web_search_call", "status": "completed"}, {"query": ""}, "not kept"),
])
def test_replayed_web_search_call_becomes_call_and_output(item, call_args, output_has):
    before = {"role": "user", "content": "hi"}
    out = replay([before, item, {"role": "user", "content": "more"}], plan())
    assert out[0] == before and out[3] == {"role": "user", "content": "more"}
    call, result_ = out[1], out[2]
    assert call["type"] == "function_call" and call["name"] == "web_search" and json.loads(call["arguments"]) == call_args
    assert result_ == {"type": "function_call_output", "call_id": call["call_id"], "output": result_["output"]}
    assert output_has in result_["output"]


@pytest.mark.parametrize("body,param", [
    ({"input": "hi", "tools": [HOSTED], "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "tools": [HOSTED], "background": True}, "background"),
    ({"input": "hi", "tools": [HOSTED], "store": True}, None),
    ({"input": [{"type": "web_search_call", "action": {"type": "search", "query": "q"}}], "previous_response_id": "resp_1"}, None),
])
def test_refused_requests(body, param):
    got = refusal(body)
    assert (got[1] if got else None) == param


def test_first_request_rewrites_only_what_it_must():
    body = codex_body(include=["reasoning.encrypted_content", "web_search_call.action.sources"], tool_choice={"type": "web_search"},
                      store=True, top_k=20, structured_outputs=None)
    p = make_plan(body, 5)
    out = first_request(body, p)
    assert out["tools"][0] == SHELL and out["tools"][1]["type"] == "function" and out["tools"][1]["name"] == "web_search"
    assert out["tools"][1]["parameters"]["required"] == ["query"]
    assert out["tool_choice"] == {"type": "function", "name": "web_search"}
    assert out["include"] == ["reasoning.encrypted_content"] and p.sources
    assert out["store"] is False
    for key in ("instructions", "input", "reasoning", "prompt_cache_key", "top_k", "structured_outputs", "parallel_tool_calls"):
        assert out[key] == body[key]


def test_usage_sums_every_turn():
    total = add_usage(add_usage(None, w.usage(100, 10, 4, cached=50)), w.usage(130, 20, 6))
    assert total == {"input_tokens": 230, "input_tokens_details": {"cached_tokens": 50, "cache_write_tokens": 0,
                     "input_tokens_per_turn": [], "cached_tokens_per_turn": []}, "output_tokens": 30,
                     "output_tokens_details": {"reasoning_tokens": 10, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                               "tool_output_tokens_per_turn": []}, "total_tokens": 260}


def plan(**kw) -> ResponsesPlan:
    base = dict(name="web_search", hosted=True, results=5, language=None, allowed=(), sources=False,
                client_tools=[HOSTED], client_tool_choice=None, functions={"web_search": "web_search"})
    return ResponsesPlan(**{**base, **kw})


def ok(query, urls=("https://a.example/1",)) -> SearchOutcome:
    return SearchOutcome(query, "ok", hits=[Hit(f"t{i}", u, "s") for i, u in enumerate(urls)])


@pytest.mark.parametrize("outcome,sources,status,action", [
    (ok("q"), False, "completed", {"type": "search", "query": "q"}),
    (ok("q"), True, "completed", {"type": "search", "query": "q", "sources": [{"type": "url", "url": "https://a.example/1"}]}),
    (SearchOutcome("q", "empty", message="none"), True, "completed", {"type": "search", "query": "q", "sources": []}),
    (SearchOutcome("q", "failed", message="Search failed: x", error_code="unavailable"), False, "failed", {"type": "search", "query": "q"}),
])
def test_web_search_call_item(outcome, sources, status, action):
    item = web_search_item({"id": "fc_00ab", "call_id": "c"}, outcome, plan(sources=sources))
    assert item == {"id": "ws_00ab", "type": "web_search_call", "status": status, "action": action}


@pytest.mark.parametrize("allowed,results,kept", [
    ((), 5, ["https://a.example/1", "https://b.example/2", "https://docs.a.example/3"]),
    (("a.example",), 5, ["https://a.example/1", "https://docs.a.example/3"]),
    (("a.example",), 1, ["https://a.example/1"]),
    (("c.example",), 5, []),
])
def test_domain_filter_and_count(allowed, results, kept):
    request = tool_request({"type": "function_call", "name": "web_search", "arguments": '{"query": "q"}'},
                           plan(allowed=allowed, results=results))
    o = shaped(ok("q", ("https://a.example/1", "https://b.example/2", "https://docs.a.example/3")), request)
    assert [h.url for h in o.hits] == kept
    assert o.status == ("ok" if kept else "empty")


# ---- the stand-in speaks vLLM's Responses format ------------------------------------------

FN = {"type": "function", "name": "web_search", "description": "Search",
      "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


@pytest.mark.parametrize("sample,build", [
    ("responses-stream-text.sse", lambda: b"".join(w.stream_frames(
        {"tool_choice": "none", "tools": [], "max_output_tokens": 6, "reasoning": {"effort": "none"}},
        [w.message(["\ufffdzeliki", " water", " nohavo", "huli", "huca"], "msg_b75a078614c596d9")],
        use=w.usage(23, 6), ident="resp_99e15b638cee8264", status="incomplete",
        incomplete_details={"reason": "max_output_tokens"}, created_at=1796248653))),
    ("responses-forced-function-call-stream.sse", lambda: b"".join(w.stream_frames(
        {"tools": [FN], "max_output_tokens": 60, "reasoning": {"effort": "none"}},
        [w.call("web_search", {"query": "hello"}, "fc_9ebaa38534197387", "chatcmpl-tool-8fba033e2b88484a",
                pieces=['{"query": "', "hello", '"}'])],
        use=w.usage(245, 43, cached=128), ident="resp_8aa4a762cb07e4d7"))),
    ("responses-forced-function-call.json", lambda: w.compact(w.body(
        {"tools": [FN], "max_output_tokens": 60, "reasoning": {"effort": "none"}},
        [w.call("web_search", {"query": "hello"}, "fc_8acec3f6afcba505", "chatcmpl-tool-99b924fc04806c01")],
        use=w.usage(245, 40, cache_write=128), ident="resp_991a11412c33300f"))),
    ("responses-web-search-tool-ignored.json", lambda: w.compact(w.body(
        {"tools": [HOSTED], "max_output_tokens": 10},
        [w.reasoning("tiwevuhi c wuacage fire jenalu kadolawocukalozoC", "rs_805b2d8e1db6ff4c")],
        use=w.usage(17, 10, 10), ident="resp_850c0fdc496e5b62", status="incomplete",
        incomplete_details={"reason": "max_output_tokens"}, created_at=1796248653))),
])
def test_standin_matches_real_vllm_capture(sample, build):
    assert build().rstrip() == (SAMPLES / sample).read_bytes().rstrip()


# ---- through the proxy --------------------------------------------------------------------

def test_other_responses_traffic_is_relayed_byte_for_byte(proxy, backend):
    reply = w.sse_reply(w.stream_frames({"tools": [SHELL]}, [w.message("plain answer")]))
    backend.script(reply)
    sent = json.dumps({"model": "foundation", "input": "hi", "tools": [SHELL, OWN_WEB_SEARCH], "stream": True},
                      indent=1).encode()
    conn = http.client.HTTPConnection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]), timeout=10)
    conn.request("POST", "/v1/responses?x=1", sent, {"Content-Type": "application/json"})
    got = conn.getresponse().read()
    assert backend.received[0].body == sent and backend.received[0].query == "x=1"
    assert got == b"".join(reply.chunks)


def test_codex_shaped_request_plain(proxy, backend, searxng):
    t1, t2 = search_then_answer()
    backend.responder = w.model(lambda req: w.answer(req, t1, ident="resp_first0000000001"), t2)
    r = client(proxy).responses.create(**{k: v for k, v in codex_body(stream=False).items() if k != "stream"})
    types = [o.type for o in r.output]
    assert types == ["reasoning", "web_search_call", "reasoning", "message"]
    ws = r.output[1]
    assert ws.id == "ws_" + t1[1].id[3:] and ws.status == "completed"
    assert ws.action.type == "search" and ws.action.query == "vllm 0.32 release"
    assert getattr(ws.action, "sources", None) is None
    assert r.output_text == "vLLM 0.32 shipped."
    assert searxng.queries == ["vllm 0.32 release"]
    sent = vllm_requests(backend)
    assert len(sent) == 2
    assert r.id == "resp_first0000000001"
    fn = [t for t in sent[0]["tools"] if t.get("name") == "web_search"]
    assert fn and fn[0]["type"] == "function" and not any(t["type"] == "web_search" for t in sent[0]["tools"])
    follow = sent[1]["input"]
    assert [i.get("type") for i in follow[-3:]] == ["reasoning", "function_call", "function_call_output"]
    assert follow[-1]["call_id"] == t1[1].call_id and "example.org/vllm-0.32-release" in follow[-1]["output"]
    assert r.usage.input_tokens == 80 and r.usage.total_tokens == sum(
        w.default_usage(t)["total_tokens"] for t in (t1, t2))
    # The client's own tools are echoed back, not the proxy's function.
    assert [t.type for t in r.tools] == ["function", "web_search"]


def test_codex_shaped_request_streaming(proxy, backend, searxng):
    t1, t2 = search_then_answer()
    backend.responder = w.model(t1, t2)
    events = list(client(proxy).responses.create(**codex_body()))
    kinds = [e.type for e in events]
    assert kinds.count("response.created") == kinds.count("response.in_progress") == kinds.count("response.completed") == 1
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert not any("function_call" in k for k in kinds)
    first_ws = kinds.index("response.web_search_call.in_progress")
    assert kinds[first_ws - 1] == "response.output_item.added"
    assert kinds[first_ws:first_ws + 4] == ["response.web_search_call.in_progress", "response.web_search_call.searching",
                                           "response.web_search_call.completed", "response.output_item.done"]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == [0, 1, 2, 3]
    assert [e.item.type for e in added] == ["reasoning", "web_search_call", "reasoning", "message"]
    assert added[1].item.status == "in_progress"
    done = [e for e in events if e.type == "response.output_item.done"]
    assert done[1].item.status == "completed" and done[1].item.action.query == "vllm 0.32 release"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert text == "vLLM 0.32 shipped." and reasoning == "I should look it upNow I know"
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "web_search_call", "reasoning", "message"]
    assert final.output[1].id == added[1].item.id
    assert final.id == events[0].response.id
    assert final.usage.output_tokens == sum(w.default_usage(t)["output_tokens"] for t in (t1, t2))
    sent = vllm_requests(backend)
    assert sent[1]["input"][-1]["type"] == "function_call_output"
    assert searxng.queries == ["vllm 0.32 release"]


def test_sdk_stream_accumulator_takes_the_sequence(proxy, backend, searxng):
    first = [w.call("web_search", {"query": "a"}), w.call("web_search", {"query": "b"})]
    backend.responder = w.model(first, [w.call("web_search", {"query": "c"})], [w.message("done")])
    body = codex_body(include=["web_search_call.action.sources"])
    body.pop("stream")
    with client(proxy).responses.stream(**body) as stream:
        final = stream.get_final_response()
    assert [o.type for o in final.output] == ["web_search_call"] * 3 + ["message"]
    assert [o.action.query for o in final.output[:3]] == ["a", "b", "c"]
    assert [s.url for s in final.output[0].action.sources] == [r["url"] for r in _default("a")]
    assert final.output_text == "done"
    assert sorted(searxng.queries[:2]) == ["a", "b"] and searxng.queries[2] == "c"
    assert "web_search_call.action.sources" not in (vllm_requests(backend)[0].get("include") or [])


def _default(q):
    from standins.searxng import default_results
    return default_results(q)


@pytest.mark.slow  # waits out keep-alive intervals
def test_keepalive_comments_during_a_search(start_proxy, backend, searxng):
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2")
    searxng.behave("slow one", "slow", seconds=1.2)
    t1, t2 = search_then_answer("slow one")
    backend.responder = w.model(t1, t2)
    raw = post_raw(proxy, codex_body())
    before_done = raw.split(b"response.web_search_call.completed")[0]
    assert before_done.count(b": searching 'slow one'\n\n") >= 3
    assert b"event: response.completed" in raw


def post_raw(proxy, body: dict) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]), timeout=30)
    conn.request("POST", "/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return conn.getresponse().read()


@pytest.mark.parametrize("stream", [False, True])
def test_replayed_web_search_call_is_rewritten(proxy, backend, searxng, stream):
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "news?"}]},
        {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "old query"}},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Here you go."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]},
    ]
    backend.responder = w.model([w.message("answer")])
    body = codex_body(input=history, stream=stream)
    if stream:
        final = [e for e in client(proxy).responses.create(**body)][-1].response
    else:
        body.pop("stream")
        final = client(proxy).responses.create(**body)
    assert final.output_text == "answer"
    got = vllm_requests(backend)[0]["input"]
    assert not any(i.get("type") == "web_search_call" for i in got)
    assert [i.get("type") for i in got[1:3]] == ["function_call", "function_call_output"]
    assert json.loads(got[1]["arguments"]) == {"query": "old query"} and got[2]["call_id"] == got[1]["call_id"]
    assert searxng.queries == []


@pytest.mark.parametrize("kept", [True, False])
@pytest.mark.parametrize("stream", [False, True])
def test_a_replayed_call_reads_what_the_model_read(start_proxy, backend, searxng, stream, kept):
    """Codex resends each web_search_call with its action only: the proxy kept what the model read under the
    call's id, so turn 2 reads the very call and result of turn 1 (vLLM's prefix cache matches past them); with
    the store off, or the entry gone, it reads the stand-in line."""
    proxy = start_proxy(**({} if kept else {"RESPONSES_RESULTS_TTL": "0"}))
    t1, t2 = search_then_answer(query="  vllm   0.32 release")
    backend.responder = w.model(t1, t2)
    body = codex_body(stream=stream)
    if stream:
        final = [e for e in client(proxy).responses.create(**body)][-1].response
    else:
        body.pop("stream")
        final = client(proxy).responses.create(**body)
    live = vllm_requests(backend)[1]["input"]
    read = [i for i in live if i.get("type") in ("function_call", "function_call_output")]
    backend.reset()
    backend.responder = w.model([w.message("second")])
    history = body["input"] + [o.model_dump(exclude_none=True) for o in final.output] + [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]}]
    client(proxy).responses.create(**{**codex_body(input=history), "stream": False})
    got = [i for i in vllm_requests(backend)[0]["input"] if i.get("type") in ("function_call", "function_call_output")]
    if kept:
        assert (got[0]["name"], got[0]["arguments"]) == (read[0]["name"], read[0]["arguments"])
        assert got[1]["output"] == read[1]["output"] and "example.org/vllm-0.32-release" in got[1]["output"]
    else:
        assert got[1]["output"].startswith('Searched for "vllm 0.32 release" in an earlier turn')
    assert len(searxng.queries) == 1  # replaying searches nothing


def test_replay_without_the_hosted_tool_relays_the_answer(proxy, backend):
    reply = w.json_reply(w.body({"tools": []}, [w.message("ok")]))
    backend.script(reply)
    body = {"model": "foundation", "input": [
        {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "q"}},
        {"role": "user", "content": "thanks"}]}
    raw = post_raw(proxy, body)
    assert raw == reply.body
    assert [i.get("type") for i in backend.received[0].json()["input"]] == ["function_call", "function_call_output", None]
    assert "tools" not in backend.received[0].json()


def always_search(request):
    n = sum(1 for i in request["input"] if isinstance(i, dict) and i.get("type") == "function_call_output")
    return [w.call("web_search", {"query": f"try {n}"})]


def test_cap_plain(start_proxy, backend, searxng):
    proxy = start_proxy(MAX_SEARCH_ITER="2", KEEPALIVE_INTERVAL="0.2")
    backend.responder = w.model(*[always_search] * 5)
    body = codex_body()
    body.pop("stream")
    with pytest.raises(openai.APIStatusError) as e:
        client(proxy).responses.create(**body)
    assert e.value.status_code == 422 and "2 of 2 search rounds used (2 searches" in e.value.message
    assert searxng.queries == ["try 0", "try 1"]


def test_cap_streaming_ends_as_failed_response(start_proxy, backend, searxng):
    proxy = start_proxy(MAX_SEARCH_ITER="2", KEEPALIVE_INTERVAL="0.2")
    backend.responder = w.model(*[always_search] * 5)
    events = list(client(proxy).responses.create(**codex_body()))
    assert events[-1].type == "response.failed"
    assert "2 of 2 search rounds used (2 searches" in events[-1].response.error.message
    assert [o.type for o in events[-1].response.output] == ["web_search_call", "web_search_call"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert sum(e.type == "response.created" for e in events) == 1


@pytest.mark.parametrize("mode,kw,expect", [
    ("dead", {}, "every search engine"),
    ("status", {"code": 500}, "HTTP 500"),
    ("status", {"code": 429}, "429"),
    ("nonjson", {}, "did not answer with JSON"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_search_failure_is_a_failed_call_and_the_response_completes(proxy, backend, searxng, mode, kw, expect, stream):
    searxng.behave(None, mode, **kw)
    t1, t2 = search_then_answer("broken")
    backend.responder = w.model(t1, t2)
    body = codex_body(stream=stream)
    if stream:
        events = list(client(proxy).responses.create(**body))
        kinds = [e.type for e in events]
        assert "response.web_search_call.completed" not in kinds
        final = events[-1].response
        assert events[-1].type == "response.completed"
    else:
        body.pop("stream")
        final = client(proxy).responses.create(**body)
    assert final.status == "completed"
    ws = [o for o in final.output if o.type == "web_search_call"]
    assert len(ws) == 1 and ws[0].status == "failed" and ws[0].action.query == "broken"
    tool_output = vllm_requests(backend)[1]["input"][-1]
    assert tool_output["type"] == "function_call_output" and expect in tool_output["output"]
    assert final.output_text == "vLLM 0.32 shipped."


def test_domain_filter_is_enforced_on_results(proxy, backend, searxng):
    searxng.behave(None, "results", results=[
        result("https://docs.python.org/3/library/asyncio.html", "asyncio"),
        result("https://spam.example/asyncio", "spam"),
        result("https://peps.python.org/pep-3156/", "PEP 3156"),
        result("https://docs.python.org.evil.example/x", "evil")])
    t1, t2 = search_then_answer("asyncio gather")
    backend.responder = w.model(t1, t2)
    tool = {"type": "web_search", "filters": {"allowed_domains": ["python.org"]}, "search_context_size": "low",
            "user_location": {"type": "approximate", "country": "FR"}}
    r = client(proxy).responses.create(model="foundation", input="asyncio?", tools=[tool],
                                       include=["web_search_call.action.sources"])
    ws = [o for o in r.output if o.type == "web_search_call"][0]
    assert [s.url for s in ws.action.sources] == ["https://docs.python.org/3/library/asyncio.html",
                                                  "https://peps.python.org/pep-3156/"]
    seen = vllm_requests(backend)[1]["input"][-1]["output"]
    assert "spam.example" not in seen and "evil.example" not in seen and "peps.python.org" in seen
    assert searxng.requests[0].params.get("language") == "fr-FR"


def test_search_context_size_sets_the_result_count(proxy, backend, searxng):
    searxng.behave(None, "results", results=[result(f"https://r.example/{i}", f"r{i}") for i in range(12)])
    t1, t2 = search_then_answer("many")
    backend.responder = w.model(t1, t2)
    r = client(proxy).responses.create(model="foundation", input="x", include=["web_search_call.action.sources"],
                                       tools=[{"type": "web_search", "search_context_size": "high"}])
    ws = [o for o in r.output if o.type == "web_search_call"][0]
    assert len(ws.action.sources) == 10
    assert "language" not in searxng.requests[0].params


def test_client_web_search_function_of_its_own(proxy, backend, searxng):
    own_call = w.call("web_search", {"q": "client side"})
    backend.responder = w.model([w.call("web_search_hosted", {"query": "hosted side"})], [own_call])
    r = client(proxy).responses.create(model="foundation", input="x", tools=[OWN_WEB_SEARCH, HOSTED])
    assert [o.type for o in r.output] == ["web_search_call", "function_call"]
    assert r.output[1].name == "web_search" and r.output[1].call_id == own_call.call_id
    assert json.loads(r.output[1].arguments) == {"q": "client side"}
    assert searxng.queries == ["hosted side"]
    names = [t.get("name") for t in vllm_requests(backend)[0]["tools"]]
    assert names == ["web_search", "web_search_hosted", "web_fetch", "find_in_page"]  # the hosted tool reads pages too
    assert vllm_requests(backend)[0]["tools"][0] == OWN_WEB_SEARCH


def test_mixed_turn_runs_searches_and_stubs_client_calls(proxy, backend, searxng):
    shell = w.call("shell", {"command": "ls"})
    backend.responder = w.model([w.call("web_search", {"query": "q"}), shell],
                                [w.message("answer")])
    events = list(client(proxy).responses.create(**codex_body()))
    assert not any(getattr(getattr(e, "item", None), "type", None) == "function_call" for e in events)
    follow = vllm_requests(backend)[1]["input"]
    outputs = {i["call_id"]: i["output"] for i in follow if i.get("type") == "function_call_output"}
    assert outputs[shell.call_id] == NOT_EXECUTED
    assert [o.type for o in events[-1].response.output] == ["web_search_call", "message"]


@pytest.mark.parametrize("stream", [False, True])
def test_client_call_after_a_search_returns_as_vllm_wrote_it(proxy, backend, searxng, stream):
    shell = w.call("shell", {"command": "ls -la"})
    backend.responder = w.model([w.call("web_search", {"query": "q"})], [w.reasoning("run it"), shell])
    body = codex_body(stream=stream)
    if stream:
        events = list(client(proxy).responses.create(**body))
        final = events[-1].response
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert deltas == shell.text
    else:
        body.pop("stream")
        final = client(proxy).responses.create(**body)
    assert [o.type for o in final.output] == ["web_search_call", "reasoning", "function_call"]
    assert final.output[2].model_dump(exclude_none=True) == {k: v for k, v in w.output_item(shell).items() if v is not None}


def test_forced_hosted_tool_choice(proxy, backend, searxng):
    t1, t2 = search_then_answer()
    backend.responder = w.model(t1, t2)
    r = client(proxy).responses.create(model="foundation", input="x", tools=[HOSTED], tool_choice={"type": "web_search"})
    sent = vllm_requests(backend)
    assert sent[0]["tool_choice"] == {"type": "function", "name": "web_search"} and sent[1]["tool_choice"] == "auto"
    assert r.tool_choice == {"type": "web_search"}


def test_previous_response_id_is_refused_and_store_is_not_kept(proxy, backend, searxng):
    with pytest.raises(openai.BadRequestError) as e:
        client(proxy).responses.create(model="foundation", input="x", tools=[HOSTED], previous_response_id="resp_1")
    assert "previous_response_id" in e.value.message and backend.received == []
    backend.responder = w.model([w.message("hi")])
    client(proxy).responses.create(model="foundation", input="x", tools=[HOSTED], store=True)
    assert vllm_requests(backend)[0]["store"] is False


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_error_on_a_later_turn(proxy, backend, searxng, stream):
    t1, _ = search_then_answer()
    backend.responder = w.model(t1, w.error_reply(400, "This model's maximum context length is 2048 tokens."))
    body = codex_body(stream=stream)
    if stream:
        events = list(client(proxy).responses.create(**body))
        assert events[-1].type == "response.failed"
        assert "maximum context length" in events[-1].response.error.message
        assert [o.type for o in events[-1].response.output] == ["reasoning", "web_search_call"]
    else:
        body.pop("stream")
        with pytest.raises(openai.BadRequestError) as e:
            client(proxy).responses.create(**body)
        assert "maximum context length" in e.value.message


def test_model_that_never_searches_keeps_vllm_events(proxy, backend, searxng):
    frames = w.stream_frames(codex_body(), [w.reasoning("hmm"), w.message("no search needed")])
    backend.script(w.sse_reply(frames))
    raw = post_raw(proxy, codex_body())
    sent = raw.split(b"\n\n")
    original = b"".join(frames).split(b"\n\n")
    # Item events pass as vLLM wrote them; only the envelope echoes the client's own tools.
    assert sent[2:-2] == original[2:-2]
    assert b'"type":"web_search"' in sent[0] and searxng.queries == []


def test_disconnect_mid_search_stops_the_loop(proxy, backend, searxng):
    searxng.behave("slow", "slow", seconds=1.5)
    t1, t2 = search_then_answer("slow")
    backend.responder = w.model(t1, t2)
    sock = socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])))
    payload = json.dumps(codex_body()).encode()
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(payload), payload))
    seen = b""
    while b"response.web_search_call.searching" not in seen:
        seen += sock.recv(65536)
    # The client leaves once SearXNG has the query: a search whose client left before it was sent
    # never reaches SearXNG at all, which would leave nothing here to count.
    deadline = time.monotonic() + 10
    while not searxng.queries:
        assert time.monotonic() < deadline, "the search never started"
        time.sleep(0.02)
    sock.close()
    time.sleep(2.5)
    assert len(vllm_requests(backend)) == 1  # no second turn was started for a client that left
    assert searxng.queries == ["slow"]


def test_disconnect_mid_generation_aborts_vllm(proxy, backend, searxng):
    t1 = [w.call("web_search", {"query": "q"})]
    def slow_turn(req):
        return w.sse_reply(w.stream_frames(req, [w.message("a b c d e f g h")]), gap=0.5)
    backend.responder = w.model(t1, slow_turn)
    sock = socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])))
    payload = json.dumps(codex_body()).encode()
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(payload), payload))
    seen = b""
    while b"response.output_text.delta" not in seen:
        seen += sock.recv(65536)
    sock.close()
    assert backend.wait_for(lambda b: 1 in b.hangups, timeout=5)


def test_vllm_stream_breaking_mid_turn_fails_the_response(proxy, backend, searxng):
    t1, t2 = search_then_answer()
    def broken(req):
        return w.sse_reply(w.stream_frames(req, t2)[:6], drop=True)
    backend.responder = w.model(t1, broken)
    events = list(client(proxy).responses.create(**codex_body()))
    assert events[-1].type == "response.failed" and "broke" in events[-1].response.error.message
    assert sum(e.type == "response.created" for e in events) == 1
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_unreachable_is_an_openai_shaped_502(start_proxy, stream):
    proxy = start_proxy(BACKEND_URL="http://127.0.0.1:9", KEEPALIVE_INTERVAL="0.2")
    body = codex_body(stream=stream)
    if not stream:
        body.pop("stream")
    with pytest.raises(openai.APIStatusError) as e:
        r = client(proxy).responses.create(**body)
        list(r) if stream else None
    assert e.value.status_code == 502 and "unreachable" in e.value.message


def test_vllm_error_event_mid_stream_fails_the_response(proxy, backend, searxng):
    t1, t2 = search_then_answer()
    err = {"type": "error", "code": 500, "message": "EngineCore died", "param": None, "sequence_number": 2}
    def failing(req):
        return w.sse_reply(w.stream_frames(req, t2)[:2] + [w.event(err)])
    backend.responder = w.model(t1, failing)
    events = list(client(proxy).responses.create(**codex_body()))
    assert events[-1].type == "response.failed" and events[-1].response.error.message == "EngineCore died"
    assert [e.type for e in events].count("response.created") == 1


def test_a_finished_stream_leaves_its_vllm_connection_in_the_pool(start_proxy, backend):
    """Reading vLLM's stream to its end lets the next request reuse the connection."""
    p = start_proxy(KEEPALIVE_INTERVAL="0.2", PROXY_WORKER_CONNECTIONS="997")  # a proxy of its own: an empty pool
    body = {"model": "foundation", "input": "hi", "stream": True, "tools": [{"type": "web_search"}]}
    before = backend.accepted
    for _ in range(3):
        backend.script(w.sse_reply(w.stream_frames(body, [w.message("hello")])))
        assert raw_request(p.url, "POST", "/v1/responses", json.dumps(body).encode())[0] == 200
    assert backend.accepted - before == 1, "all three streams must ride one pooled connection"


@pytest.mark.parametrize("replayer, kept", [("alice", True), ("bob", False)])
def test_what_the_model_read_is_kept_for_the_key_that_ran_it(start_proxy, backend, searxng, tmp_path, replayer, kept):
    """With people's keys (issue 51), a ws_ id names what the model read for its key alone: another member who
    sends alice's history, ids and all, reads the stand-in line, not her results."""
    from test_team import ADMIN_KEY, add_key
    keys_file = tmp_path / "keys.json"
    keys = {name: add_key(keys_file, name) for name in ("alice", "bob")}
    proxy = start_proxy(PROXY_KEYS_FILE=str(keys_file), PROXY_API_KEY=ADMIN_KEY,
                        PROXY_STATE_DB=str(tmp_path / "state.sqlite3"))
    t1, t2 = search_then_answer(query="  vllm   0.32 release")
    backend.responder = w.model(t1, t2)
    body = codex_body(stream=False)
    body.pop("stream")
    alice = openai.OpenAI(base_url=proxy.url + "/v1", api_key=keys["alice"], max_retries=0, timeout=30)
    final = alice.responses.create(**body)
    backend.reset()
    backend.responder = w.model([w.message("second")])
    history = body["input"] + [o.model_dump(exclude_none=True) for o in final.output] + [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]}]
    other = openai.OpenAI(base_url=proxy.url + "/v1", api_key=keys[replayer], max_retries=0, timeout=30)
    other.responses.create(**{**codex_body(input=history), "stream": False})
    got = [i for i in vllm_requests(backend)[0]["input"] if i.get("type") == "function_call_output"]
    assert ("example.org/vllm-0.32-release" in got[0]["output"]) == kept, got[0]["output"]
    assert got[0]["output"].startswith('Searched for "vllm 0.32 release" in an earlier turn') != kept
