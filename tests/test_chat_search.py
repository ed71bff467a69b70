"""The non-streaming search loop on /v1/chat/completions, seen from both sides: what the
openai SDK got, and what the vLLM and SearXNG stand-ins received.

Run: tests/run.sh tests/test_chat_search.py
"""
import gzip
import json
import socket
import time
import urllib.parse
import zlib

import pytest
from clients import openai

from proxy.apis.chat.rules import chat_tool
from proxy.tools.base import NOT_EXECUTED
from standins.scripted_backend import Reply
from standins.vllm_wire import completion, error_reply, json_reply, sse_reply, stream_frames, tool_call

WEB_SEARCH_TOOL, WEB_FETCH_TOOL = chat_tool("web_search"), chat_tool("web_fetch")
USER = [{"role": "user", "content": "What is new in vLLM?"}]


def client(proxy):
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)


def search_turn(*queries, **kw):
    return json_reply(completion(tool_calls=[tool_call("web_search", {"query": q}) for q in queries], **kw))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_loop_turns_ask_vllm_for_bodies_it_can_read(proxy, backend, searxng, stream):
    """The client's Accept-Encoding (the SDK sends gzip) is for its own answer; every turn the loop reads
    asks for an uncompressed body, so a compressing gateway in front of vLLM cannot hand it gzip."""
    call = [tool_call("web_search", {"query": "q"})]
    if stream:
        backend.script(sse_reply(stream_frames(tool_calls=call, finish_reason="tool_calls")),
                       sse_reply(stream_frames(content=["ok"], finish_reason="stop")))
    else:
        backend.script(search_turn("q"), json_reply(completion(content="ok", finish_reason="stop")))
    c = client(proxy)
    if stream:
        assert "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="foundation", messages=USER, stream=True) if ch.choices) == "ok"
    else:
        assert c.chat.completions.create(model="foundation", messages=USER).choices[0].message.content == "ok"
    assert [r.headers["accept-encoding"] for r in backend.received] == ["identity", "identity"]


def _gzipped(reply: Reply) -> Reply:
    """The reply as a compressing gateway in front of vLLM would send it, whatever the request asked for."""
    headers = reply.headers + [("Content-Encoding", "gzip")]
    if reply.chunks is None:
        return Reply(status=reply.status, body=gzip.compress(reply.body), headers=headers)
    z = zlib.compressobj(wbits=31)  # one gzip stream, flushed per event as a gateway streaming SSE does
    chunks = [z.compress(c) + z.flush(zlib.Z_SYNC_FLUSH) for c in reply.chunks] + [z.flush()]
    return Reply(status=reply.status, headers=headers, chunks=chunks)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_compressing_gateway_in_front_of_vllm_does_not_break_the_loop(proxy, backend, searxng, stream):
    """Every turn the loop reads is decompressed within the body limit (the one bounded decoder), and the client
    gets the answer uncompressed, without the gateway's Content-Encoding."""
    call = [tool_call("web_search", {"query": "q"})]
    if stream:
        backend.script(_gzipped(sse_reply(stream_frames(tool_calls=call, finish_reason="tool_calls"))),
                       _gzipped(sse_reply(stream_frames(content=["all ", "good"], finish_reason="stop"))))
    else:
        backend.script(_gzipped(search_turn("q")), _gzipped(json_reply(completion(content="all good", finish_reason="stop"))))
    c = client(proxy)
    if stream:
        got = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="foundation", messages=USER, stream=True) if ch.choices)
    else:
        got = c.chat.completions.create(model="foundation", messages=USER).choices[0].message.content
    assert got == "all good" and searxng.queries == ["q"] and len(backend.received) == 2


def test_an_encoding_the_loop_cannot_read_is_a_502_naming_it(proxy, backend, searxng):
    reply = json_reply(completion(content="x", finish_reason="stop"))
    backend.script(Reply(body=b"not brotli", headers=reply.headers + [("Content-Encoding", "br")]))
    with pytest.raises(openai.APIStatusError) as e:
        client(proxy).chat.completions.create(model="foundation", messages=USER)
    assert e.value.status_code == 502 and "cannot read (br)" in e.value.message


def test_two_searches_then_the_answer(proxy, backend, searxng):
    backend.script(search_turn("vllm release", reasoning="I should search.", prompt_tokens=100, completion_tokens=10),
                   search_turn("vllm 0.32 notes", prompt_tokens=200, completion_tokens=12, reasoning_tokens=3),
                   json_reply(completion(content="vLLM 0.32 is out.", reasoning="done", prompt_tokens=300,
                                         completion_tokens=20, reasoning_tokens=4)))
    r = client(proxy).chat.completions.create(model="foundation", messages=USER, temperature=0.2,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    # The client's view: vLLM's final turn, with usage over every turn of the loop.
    assert r.choices[0].message.content == "vLLM 0.32 is out." and r.choices[0].finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (600, 42, 642)
    assert r.usage.completion_tokens_details.reasoning_tokens == 7
    # SearXNG's view: the two model-written queries, as JSON API calls with honest headers.
    assert searxng.queries == ["vllm release", "vllm 0.32 notes"]
    for req in searxng.requests:
        assert req.path == "/search" and req.params["format"] == "json"
        assert req.headers["user-agent"].startswith("coding-stack-proxy/")
        assert "gzip" in req.headers["accept-encoding"] and req.headers["accept-language"]
        assert "*/*" in req.headers["accept"]
        assert "x-forwarded-for" not in req.headers
    # vLLM's view: the tool injected, the request otherwise as sent, the history growing.
    first, second, third = (r.json() for r in backend.received)
    assert first["tools"] == [WEB_SEARCH_TOOL, WEB_FETCH_TOOL] and first["temperature"] == 0.2
    assert first["chat_template_kwargs"] == {"enable_thinking": True}
    assert first["messages"] == USER
    call1 = second["messages"][1]["tool_calls"][0]
    assert second["messages"][1]["reasoning"] == "I should search."
    assert second["messages"][2]["role"] == "tool" and second["messages"][2]["tool_call_id"] == call1["id"]
    assert 'Search results for "vllm release"' in second["messages"][2]["content"]
    assert "https://example.org/vllm-release/1" in second["messages"][2]["content"]
    assert len(third["messages"]) == 5 and third["messages"][4]["tool_call_id"] == third["messages"][3]["tool_calls"][0]["id"]
    assert "searches=2" in proxy.log_once("searches=2")


def test_several_calls_in_one_turn_run_concurrently(proxy, backend, searxng):
    searxng.behave(None, "slow", seconds=1.2)
    backend.script(search_turn("a", "b", "c"), json_reply(completion(content="done")))
    started = time.monotonic()
    r = client(proxy).chat.completions.create(model="foundation", messages=USER)
    assert r.choices[0].message.content == "done"
    # One after another they would take at least 3.6 s.
    assert time.monotonic() - started < 3.0, "three 1.2 s searches must overlap"
    assert sorted(searxng.queries) == ["a", "b", "c"]
    tools = backend.received[1].json()["messages"][2:]
    calls = backend.received[1].json()["messages"][1]["tool_calls"]
    assert [t["tool_call_id"] for t in tools] == [c["id"] for c in calls]
    assert ['"a"' in tools[0]["content"], '"b"' in tools[1]["content"], '"c"' in tools[2]["content"]] == [True] * 3


def test_answer_without_search_is_vllms_bytes(proxy, backend):
    reply = json_reply(completion(content="hello"))
    backend.script(reply)
    import urllib.request
    req = urllib.request.Request(proxy.url + "/v1/chat/completions", data=json.dumps({"messages": USER}).encode(),
                                 headers={"Content-Type": "application/json"})
    assert urllib.request.urlopen(req).read() == reply.body


@pytest.mark.parametrize("mode, kw, phrase", [
    ("status", {"code": 403}, "does not allow JSON output"),
    ("status", {"code": 429}, "429 Too Many Requests"),
    ("status", {"code": 500}, "HTTP 500"),
    ("nonjson", {}, "did not answer with JSON"),
    ("redirect", {}, "redirect"),
    ("dead", {}, "every search engine behind"),
    ("empty", {}, 'No results for "q1"'),
    ("gzip", {}, 'Search results for "q1"'),
])
def test_searxng_failures_become_tool_results(proxy, backend, searxng, mode, kw, phrase):
    searxng.behave(None, mode, **kw)
    backend.script(search_turn("q1"), json_reply(completion(content="answered anyway")))
    r = client(proxy).chat.completions.create(model="foundation", messages=USER)
    assert r.choices[0].message.content == "answered anyway"
    tool_msg = backend.received[1].json()["messages"][2]
    assert tool_msg["role"] == "tool" and phrase in tool_msg["content"]
    if mode == "dead":
        assert "duckduckgo (HTTP connection error)" in tool_msg["content"]


@pytest.mark.slow  # waits out SearXNG's timeout
def test_searxng_unreachable_and_slow(start_proxy, backend, searxng):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{s.getsockname()[1]}"
    p = start_proxy(SEARXNG_URL=dead_url)
    backend.script(search_turn("q"), json_reply(completion(content="ok")))
    assert client(p).chat.completions.create(model="foundation", messages=USER).choices[0].message.content == "ok"
    content = backend.received[1].json()["messages"][2]["content"]
    assert content.startswith("Search failed") and dead_url in content

    backend.reset()
    searxng.behave(None, "slow", seconds=2)
    p = start_proxy(SEARXNG_TIMEOUT="0.3")
    backend.script(search_turn("q"), json_reply(completion(content="ok")))
    assert client(p).chat.completions.create(model="foundation", messages=USER).choices[0].message.content == "ok"
    assert "did not answer within 0.3 s" in backend.received[1].json()["messages"][2]["content"]


@pytest.mark.parametrize("arguments, phrase", [
    ("{not json", "not valid JSON"),
    ('{"q": "x"}', 'missing "query"'),
    ('{"query": "   "}', "query is empty"),
])
def test_malformed_model_arguments(proxy, backend, searxng, arguments, phrase):
    backend.script(json_reply(completion(tool_calls=[tool_call("web_search", arguments)])),
                   json_reply(completion(content="ok")))
    assert client(proxy).chat.completions.create(model="foundation", messages=USER).choices[0].message.content == "ok"
    assert phrase in backend.received[1].json()["messages"][2]["content"]
    assert searxng.queries == []


def test_bang_is_stripped_and_redirects_never_followed(proxy, backend, searxng):
    backend.script(search_turn("!!g python asyncio"), json_reply(completion(content="ok")))
    client(proxy).chat.completions.create(model="foundation", messages=USER)
    assert searxng.queries == ["g python asyncio"]


def test_repeated_query_is_answered_from_memory(proxy, backend, searxng):
    backend.script(search_turn("same"), search_turn("same"), json_reply(completion(content="ok")))
    client(proxy).chat.completions.create(model="foundation", messages=USER)
    assert searxng.queries == ["same"]
    assert "You already searched for exactly this" in backend.received[2].json()["messages"][4]["content"]


@pytest.mark.parametrize("mode, tail", [
    ("empty", " — SearXNG returned no usable results"),
    ("results", ""),
])
def test_iteration_cap_is_a_counting_error(start_proxy, backend, searxng, mode, tail):
    p = start_proxy(MAX_SEARCH_ITER="2")
    searxng.behave(None, mode)
    backend.script(search_turn("one"), search_turn("two"), search_turn("three"))
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        client(p).chat.completions.create(model="foundation", messages=USER)
    empty = 2 if mode == "empty" else 0
    assert exc.value.body["message"] == f"2 of 2 search rounds used (2 searches, 0 repeated, {empty} empty){tail}"
    assert searxng.queries == ["one", "two"] and len(backend.received) == 3


def test_iteration_cap_names_the_limit_and_the_repeats(start_proxy, backend, searxng):
    p = start_proxy(MAX_SEARCH_ITER="2")
    backend.script(search_turn("same"), search_turn("same"), search_turn("more"))
    with pytest.raises(openai.UnprocessableEntityError) as exc:
        client(p).chat.completions.create(model="foundation", messages=USER)
    assert exc.value.body["message"] == "2 of 2 search rounds used (1 search, 1 repeated, 0 empty)"
    assert exc.value.body["type"] == "search_iterations_exceeded"
    assert searxng.queries == ["same"] and len(backend.received) == 3


def test_client_tools_come_back_untouched(proxy, backend, searxng):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    call = tool_call("get_weather", {"city": "Sofia"})
    reply = json_reply(completion(tool_calls=[call]))
    backend.script(reply)
    r = client(proxy).chat.completions.create(model="foundation", messages=USER, tools=[weather])
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert r.choices[0].message.tool_calls[0].id == call["id"]
    assert backend.received[0].json()["tools"] == [weather, WEB_SEARCH_TOOL, WEB_FETCH_TOOL]
    assert searxng.queries == []


def test_mixed_turn_searches_and_stubs_the_client_call(proxy, backend, searxng):
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    mixed = [tool_call("web_search", {"query": "sofia weather"}), tool_call("get_weather", {"city": "Sofia"})]
    again = tool_call("get_weather", {"city": "Sofia"})
    backend.script(json_reply(completion(tool_calls=mixed)), json_reply(completion(tool_calls=[again])))
    r = client(proxy).chat.completions.create(model="foundation", messages=USER, tools=[weather])
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    assert searxng.queries == ["sofia weather"]
    sent = backend.received[1].json()["messages"]
    assert [m["tool_call_id"] for m in sent[2:]] == [mixed[0]["id"], mixed[1]["id"]]
    assert sent[3]["content"] == NOT_EXECUTED


@pytest.mark.parametrize("extra", [
    {"tools": [{"type": "function", "function": {"name": "web_search", "parameters": {"type": "object"}}},
               {"type": "function", "function": {"name": "web_fetch", "parameters": {"type": "object"}}}]},
    {"tool_choice": "none"},
    {"n": 2},
])
def test_no_injection_when_it_would_change_the_request(proxy, backend, searxng, extra):
    call = tool_call("web_search", {"query": "x"})
    backend.script(json_reply(completion(tool_calls=[call]) if "tools" in extra else completion(content="plain")))
    body = {"model": "foundation", "messages": USER, **extra}
    import urllib.request
    raw = json.dumps(body, separators=(",", ":")).encode()
    urllib.request.urlopen(urllib.request.Request(proxy.url + "/v1/chat/completions", data=raw,
                                                  headers={"Content-Type": "application/json"})).read()
    assert backend.received[0].body == raw  # byte for byte
    assert searxng.queries == []


@pytest.mark.parametrize("env, tools", [
    ({"INJECT_WEB_SEARCH": "false"}, [WEB_FETCH_TOOL]),
    ({"INJECT_WEB_FETCH": "false"}, [WEB_SEARCH_TOOL]),
    ({"INJECT_WEB_SEARCH": "false", "INJECT_WEB_FETCH": "false"}, None),
])
def test_injection_can_be_switched_off(start_proxy, backend, env, tools):
    p = start_proxy(**env)
    backend.script(json_reply(completion(content="plain")))
    client(p).chat.completions.create(model="foundation", messages=USER)
    assert backend.received[0].json().get("tools") == tools


def test_a_client_web_search_of_its_own_still_gets_web_fetch(proxy, backend, searxng):
    """The client's web_search call is the client's (it comes back); web_fetch is still added."""
    theirs = {"type": "function", "function": {"name": "web_search", "parameters": {"type": "object"}}}
    call = tool_call("web_search", {"query": "x"})
    backend.script(json_reply(completion(tool_calls=[call])))
    r = client(proxy).chat.completions.create(model="foundation", messages=USER, tools=[theirs])
    assert r.choices[0].message.tool_calls[0].id == call["id"]
    assert backend.received[0].json()["tools"] == [theirs, WEB_FETCH_TOOL]
    assert searxng.queries == []


def test_forced_web_search_is_forced_on_the_first_turn_only(proxy, backend, searxng):
    backend.script(search_turn("x"), json_reply(completion(content="ok")))
    client(proxy).chat.completions.create(model="foundation", messages=USER,
                                          tool_choice={"type": "function", "function": {"name": "web_search"}})
    assert backend.received[0].json()["tool_choice"]["function"]["name"] == "web_search"
    assert backend.received[1].json()["tool_choice"] == "auto"


def test_vllm_error_on_a_later_turn_is_relayed(proxy, backend, searxng):
    backend.script(search_turn("x"), error_reply(400, "This model's maximum context length is 2048 tokens.",
                                                 "BadRequestError"))
    with pytest.raises(openai.BadRequestError) as exc:
        client(proxy).chat.completions.create(model="foundation", messages=USER)
    assert "maximum context length" in exc.value.body["message"]


def test_client_leaving_a_search_loop_aborts_vllm(proxy, backend, searxng):
    """The client hangs up while vLLM is still thinking: the proxy must hang up on vLLM too."""
    slow = json_reply(completion(content="late"))
    slow.delay = 30
    backend.script(search_turn("x"), slow)
    u = urllib.parse.urlsplit(proxy.url)
    s = socket.create_connection((u.hostname, u.port))
    body = json.dumps({"model": "foundation", "messages": USER}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert backend.wait_for(lambda b: len(b.received) == 2, 10)
    s.close()
    assert backend.wait_for(lambda b: 1 in b.hangups, 5), "vLLM's connection must close when the client leaves"
