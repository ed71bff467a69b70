"""Streaming chat completions through the proxy: byte-identical when the model doesn't
search, one coherent live stream when it does, and a backend abort when the client leaves.

Run: tests/run.sh tests/test_chat_stream.py
"""
import http.client
import json
import socket
import time
import urllib.parse
from pathlib import Path

import pytest
from clients import openai

from proxy.tools.base import NOT_EXECUTED
from standins.vllm_wire import error_reply, sse_reply, stream_frames, tool_call

SAMPLES = Path(__file__).parent / "data" / "vllm-0.32-samples"
USER = [{"role": "user", "content": "What is new in vLLM?"}]


def client(proxy):
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)


def sample_frames(name):
    return [f + b"\n\n" for f in (SAMPLES / name).read_bytes().split(b"\n\n") if f.strip()]


def raw_stream(proxy, body: dict) -> bytes:
    u = urllib.parse.urlsplit(proxy.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return resp.read()


@pytest.mark.parametrize("sample", ["stream-include-usage.sse", "stream-reasoning-then-content.sse",
                                    "forced-tool-call-stream-marker-leak.sse"])
def test_search_free_stream_is_byte_identical(proxy, backend, sample):
    frames = sample_frames(sample)
    if "tool-call" in sample:  # a client tool call, not a search: the client's own
        frames = [f.replace(b'"web_search"', b'"get_weather"') for f in frames]
    backend.script(sse_reply(frames))
    got = raw_stream(proxy, {"model": "foundation", "messages": USER, "stream": True,
                             "tools": [{"type": "function", "function": {"name": "get_weather"}}]})
    assert got == b"".join(frames)


def test_stream_client_mode_passes_the_search_call_to_the_client(start_proxy, backend, searxng):
    p = start_proxy(STREAM_SEARCH="client")
    frames = sample_frames("forced-tool-call-stream.sse")
    backend.script(sse_reply(frames))
    got = raw_stream(p, {"model": "foundation", "messages": USER, "stream": True})
    assert got == b"".join(frames) and searxng.queries == []
    assert backend.received[0].json()["tools"][0]["function"]["name"] == "web_search"


def two_search_script(backend, include_usage=True):
    t1, t2 = tool_call("web_search", {"query": "vllm release"}), tool_call("web_search", {"query": "vllm notes"})
    first = stream_frames(reasoning=["Let me ", "search."], tool_calls=[t1], include_usage=include_usage,
                          prompt_tokens=100, completion_tokens=10)
    backend.script(sse_reply(first),
                   sse_reply(stream_frames(reasoning=["Once ", "more."], tool_calls=[t2], include_usage=include_usage,
                                           prompt_tokens=200, completion_tokens=20)),
                   sse_reply(stream_frames(reasoning=["Got it."], content=["vLLM ", "0.32 ", "is out."],
                                           include_usage=include_usage, prompt_tokens=300, completion_tokens=30)))
    return first, (t1, t2)


def test_two_searches_in_one_live_stream(proxy, backend, searxng):
    first, (t1, t2) = two_search_script(backend)
    stream = client(proxy).chat.completions.create(model="foundation", messages=USER, stream=True,
                                                   stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning", None) or "" for c in chunks if c.choices)
    assert text == "vLLM 0.32 is out."
    assert reasoning == "Let me search.Once more.Got it."
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks), "no web_search delta may leak"
    first_id = json.loads(first[0][6:])["id"]
    assert {c.id for c in chunks} == {first_id}
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and (usage[0].prompt_tokens, usage[0].completion_tokens) == (600, 60)
    assert searxng.queries == ["vllm release", "vllm notes"]
    second = backend.received[1].json()
    assert second["stream"] is True and second["stream_options"] == {"include_usage": True}
    assert second["messages"][1] == {"role": "assistant", "content": None, "reasoning": "Let me search.",
                                     "tool_calls": [t1]}
    assert second["messages"][2]["tool_call_id"] == t1["id"]
    assert 'Search results for "vllm release"' in second["messages"][2]["content"]
    assert backend.received[2].json()["messages"][4]["tool_call_id"] == t2["id"]


def test_raw_stream_has_one_done_and_valid_framing(proxy, backend, searxng):
    two_search_script(backend, include_usage=False)
    raw = raw_stream(proxy, {"model": "foundation", "messages": USER, "stream": True})
    events = [e for e in raw.split(b"\n\n") if e]
    assert raw.endswith(b"data: [DONE]\n\n") and raw.count(b"data: [DONE]") == 1
    for e in events:
        assert e.startswith(b"data: ") or e.startswith(b": searching")
        if e.startswith(b"data: {"):
            json.loads(e[6:])
    assert b'"usage"' not in raw  # the client did not ask for usage


@pytest.mark.slow  # waits out keep-alive intervals
def test_keepalive_comments_during_a_slow_search(proxy, backend, searxng):
    searxng.behave(None, "slow", seconds=1.0)  # the proxy fixture sends a keep-alive every 0.2 s
    t1 = tool_call("web_search", {"query": "slow one"})
    backend.script(sse_reply(stream_frames(tool_calls=[t1])), sse_reply(stream_frames(content=["done"])))
    raw = raw_stream(proxy, {"model": "foundation", "messages": USER, "stream": True})
    assert raw.count(b": searching 'slow one'\n\n") >= 3
    backend.script(sse_reply(stream_frames(tool_calls=[t1])), sse_reply(stream_frames(content=["done"])))
    chunks = list(client(proxy).chat.completions.create(model="foundation", messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "done"


def test_client_tool_call_in_a_stream_is_delivered(proxy, backend, searxng):
    call = tool_call("get_weather", {"city": "Sofia"})
    frames = stream_frames(content=["Checking."], tool_calls=[call])
    backend.script(sse_reply(frames))
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    raw = raw_stream(proxy, {"model": "foundation", "messages": USER, "stream": True, "tools": [weather]})
    assert raw == b"".join(frames)
    backend.script(sse_reply(frames))
    chunks = list(client(proxy).chat.completions.create(model="foundation", messages=USER, stream=True, tools=[weather]))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather" and calls[0].id == call["id"]
    assert "".join(tc.function.arguments or "" for tc in calls) == call["function"]["arguments"]
    assert searxng.queries == []


def test_mixed_turn_in_a_stream(proxy, backend, searxng):
    mixed = [tool_call("web_search", {"query": "q"}), tool_call("get_weather", {"city": "Sofia"})]
    again = tool_call("get_weather", {"city": "Sofia"})
    backend.script(sse_reply(stream_frames(tool_calls=mixed)), sse_reply(stream_frames(tool_calls=[again])))
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    chunks = list(client(proxy).chat.completions.create(model="foundation", messages=USER, stream=True, tools=[weather]))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.id for tc in calls if tc.id] == [again["id"]]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    sent = backend.received[1].json()["messages"]
    assert sent[3] == {"role": "tool", "tool_call_id": mixed[1]["id"], "content": NOT_EXECUTED}
    assert searxng.queries == ["q"]


def test_cap_ends_the_stream_with_an_error_event(start_proxy, backend, searxng):
    p = start_proxy(MAX_SEARCH_ITER="1", KEEPALIVE_INTERVAL="0.2")
    searxng.behave(None, "empty")
    backend.script(sse_reply(stream_frames(tool_calls=[tool_call("web_search", {"query": "a"})])),
                   sse_reply(stream_frames(tool_calls=[tool_call("web_search", {"query": "b"})])))
    raw = raw_stream(p, {"model": "foundation", "messages": USER, "stream": True})
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    err = json.loads(events[-2][6:])["error"]
    assert err["message"] == "1 of 1 search round used (1 search, 0 repeated, 1 empty) — SearXNG returned no usable results"
    backend.script(sse_reply(stream_frames(tool_calls=[tool_call("web_search", {"query": "a"})])),
                   sse_reply(stream_frames(tool_calls=[tool_call("web_search", {"query": "b"})])))
    with pytest.raises(openai.APIError) as exc:
        list(client(p).chat.completions.create(model="foundation", messages=USER, stream=True))
    assert "1 of 1 search round used" in str(exc.value)


def test_vllm_error_on_a_later_turn_becomes_an_error_event(proxy, backend, searxng):
    backend.script(sse_reply(stream_frames(tool_calls=[tool_call("web_search", {"query": "a"})])),
                   error_reply(400, "maximum context length exceeded", "BadRequestError"))
    raw = raw_stream(proxy, {"model": "foundation", "messages": USER, "stream": True})
    assert b"maximum context length exceeded" in raw and raw.endswith(b"data: [DONE]\n\n")


def test_vllm_dying_mid_stream_ends_with_an_error_event(proxy, backend):
    from standins.scripted_backend import Reply
    frames = stream_frames(content=["par", "tial"])[:3]
    backend.script(Reply(headers=[("Content-Type", "text/event-stream; charset=utf-8")], chunks=frames, drop=True))
    raw = raw_stream(proxy, {"model": "foundation", "messages": USER, "stream": True})
    assert raw.startswith(b"".join(frames))
    tail = [e for e in raw.split(b"\n\n") if e][-2:]
    assert b'"error"' in tail[0] and tail[1] == b"data: [DONE]"


def open_stream(proxy, body):
    u = urllib.parse.urlsplit(proxy.url)
    s = socket.create_connection((u.hostname, u.port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return s


def read_until(s, marker: bytes, timeout: float = 5) -> bytes:
    s.settimeout(timeout)
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen and time.monotonic() < deadline:
        seen += s.recv(65536)
    return seen


def test_disconnect_mid_token_aborts_vllm(proxy, backend):
    frames = stream_frames(content=[f"t{i} " for i in range(50)])
    backend.script(sse_reply(frames, gap=0.1))
    s = open_stream(proxy, {"model": "foundation", "messages": USER, "stream": True})
    assert b"t0" in read_until(s, b"t0")
    started = time.monotonic()
    s.close()
    assert backend.wait_for(lambda b: 0 in b.hangups, 5)
    assert time.monotonic() - started < 2


def test_disconnect_mid_search_aborts_and_never_starts_the_next_turn(proxy, backend, searxng):
    searxng.behave(None, "slow", seconds=1.5)
    backend.script(sse_reply(stream_frames(tool_calls=[tool_call("web_search", {"query": "slow"})])),
                   sse_reply(stream_frames(content=["never"])))
    s = open_stream(proxy, {"model": "foundation", "messages": USER, "stream": True})
    assert b": searching" in read_until(s, b": searching")
    s.close()
    time.sleep(2.5)
    assert len(backend.received) == 1, "no new turn may start for a client that left"


def test_disconnect_during_prefill_aborts_vllm(proxy, backend):
    """No byte flows while vLLM prefills a long prompt; the proxy must still notice."""
    reply = sse_reply(stream_frames(content=["x"]))
    reply.delay = 30
    backend.script(reply)
    s = open_stream(proxy, {"model": "foundation", "messages": USER, "stream": True})
    assert backend.wait_for(lambda b: len(b.received) == 1, 5)
    s.close()
    assert backend.wait_for(lambda b: 0 in b.hangups, 5)


def test_a_finished_stream_leaves_its_vllm_connection_in_the_pool(start_proxy, backend):
    """Reading a stream to its end (past [DONE]) lets the next request reuse the connection."""
    p = start_proxy(KEEPALIVE_INTERVAL="0.2", PROXY_WORKER_CONNECTIONS="999")  # a proxy of its own: an empty pool
    before = backend.accepted
    for _ in range(3):
        backend.script(sse_reply(stream_frames(content=["a", "b"])))
        raw_stream(p, {"model": "foundation", "messages": USER, "stream": True})
    assert backend.accepted - before == 1, "all three streams must ride one pooled connection"
