"""Issue 8's fault table, the lines not already covered by test_relay/test_chat_search/
test_chat_stream: each fault seen from the client's side and from the stand-ins' side.

Run: tests/run.sh tests/test_faults.py
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.parse

import pytest

from standins.procfs import children, rss_mb
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply
from standins.vllm_wire import SSE_HEADERS, completion, error_reply, json_reply, sse_reply, stream_frames, tool_call

USER = [{"role": "user", "content": "What is new in vLLM?"}]
CHAT = "/v1/chat/completions"


# ---- helpers shared with test_fuzz.py and test_load.py ------------------------------------

def send_raw(proxy, head: bytes, body: bytes = b"") -> socket.socket:
    """Write a request by hand and return the open socket, for clients that misbehave."""
    u = urllib.parse.urlsplit(proxy.url)
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(head + body)
    return s


def post_raw(proxy, target, body: dict | bytes) -> socket.socket:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return send_raw(proxy, b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % (target.encode(), len(data)), data)


def read_until(s, marker: bytes, limit: int = 1 << 20, timeout: float = 10) -> bytes:
    s.settimeout(timeout)
    seen = b""
    while marker not in seen and len(seen) < limit:
        got = s.recv(65536)
        if not got:
            break
        seen += got
    return seen


def worker_pid(proxy) -> int:
    """The one gunicorn worker under the proxy's master (the shipped config runs one)."""
    kids = children(proxy.proc.pid)
    assert len(kids) == 1, f"expected one worker, found {kids}"
    return kids[0]


ACCESS = re.compile(r"INFO proxy: (\S+) (\S+) (\S+) (\d+)ms searches=(\d+) bytes=(\d+) prompt=\S+ cached=\S+(?: .*)?$", re.M)


def access_lines(log: str) -> list[tuple]:
    """(method, path, status, searches, bytes) for each access-log line."""
    # The fixture's start-up probe of /proxy/health is not the test's.
    return [(m[0], m[1], m[2], int(m[4]), int(m[5])) for m in ACCESS.findall(log) if m[1] != "/proxy/health"]


def wait_for_log(proxy, predicate, timeout=5.0) -> str:
    """The access line is written when the body is done, just after the client has it."""
    deadline = time.monotonic() + timeout
    while True:
        log = proxy.log()
        if predicate(log) or time.monotonic() > deadline:
            return log
        time.sleep(0.05)


def sse_events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


def stream_text(raw: bytes) -> str:
    out = []
    for e in sse_events(raw):
        if e.startswith(b"data: {"):
            for c in json.loads(e[6:]).get("choices") or []:
                out.append((c.get("delta") or {}).get("content") or "")
    return "".join(out)


def search_turn(*queries):
    return json_reply(completion(tool_calls=[tool_call("web_search", {"query": q}) for q in queries]))


def search_stream(*queries):
    return sse_reply(stream_frames(tool_calls=[tool_call("web_search", {"query": q}) for q in queries]))


# ---- the client leaves while the proxy waits on vLLM -------------------------------------

SLOW = 30  # seconds the stand-in would take: far past any bound below, so only an abort ends it


@pytest.mark.parametrize("target, body, env, reply", [
    # The long non-streaming call without a search: no byte flows for minutes during a prefill.
    (CHAT, {"messages": USER}, {}, json_reply(completion(content="late"))),
    (CHAT, {"messages": USER}, {"INJECT_WEB_SEARCH": "false"}, json_reply(completion(content="late"))),
    ("/v1/completions", {"prompt": "x"}, {}, json_reply({"id": "cmpl-1"})),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": USER}, {}, json_reply({"type": "message"})),
    ("/v1/responses", {"model": "m", "input": "x"}, {}, json_reply({"object": "response"})),
    # A relayed stream whose next token is long in coming.
    ("/v1/completions", {"prompt": "x", "stream": True}, {},
     Reply(headers=list(SSE_HEADERS), chunks=[b"data: {}\n\n", SLOW, b"data: [DONE]\n\n"])),
], ids=["chat", "chat-no-inject", "completions", "messages", "responses", "completions-stream"])
def test_client_leaving_a_long_call_aborts_vllm(start_proxy, backend, target, body, env, reply):
    p = start_proxy(**env)
    if reply.chunks is None:
        reply.delay = SLOW
    backend.script(reply)
    seen = len(access_lines(p.log()))  # the proxy is shared with other tests of the same settings
    s = post_raw(p, target, body)
    assert backend.wait_for(lambda b: len(b.received) == 1, 10)
    if reply.chunks is not None:
        assert b"data: {}" in read_until(s, b"data: {}")
    s.close()
    assert backend.wait_for(lambda b: b.hangups == [0], 5), "vLLM must see the connection close"
    # The proxy's view: one request, ended as the client's doing, not as vLLM's failure.
    log = wait_for_log(p, lambda text: len(access_lines(text)) > seen)
    mine = access_lines(log)[seen]
    assert mine[1] == target
    # 200 when the stream had started before the client left; 499 (nginx's "client closed") otherwise.
    assert mine[2] == ("200" if reply.chunks else "499"), mine
    assert len(backend.received) == 1


# ---- vLLM answering 5xx, on every route ----------------------------------------------------

MSG_SEARCH = {"model": "m", "max_tokens": 50, "messages": USER,
              "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
RESP_SEARCH = {"model": "m", "input": "x", "tools": [{"type": "web_search"}]}


@pytest.mark.parametrize("status", [500, 503])
@pytest.mark.parametrize("method, target, body, replies_before", [
    ("POST", CHAT, {"messages": USER}, 0),
    ("POST", CHAT, {"messages": USER}, 1),                       # after one search
    ("POST", "/v1/completions", {"prompt": "x"}, 0),
    ("GET", "/v1/models", None, 0),
    ("POST", "/v1/messages", {"model": "m", "max_tokens": 5, "messages": USER}, 0),
    ("POST", "/v1/messages", MSG_SEARCH, 0),
    ("POST", "/v1/responses", {"model": "m", "input": "x"}, 0),
    ("POST", "/v1/responses", RESP_SEARCH, 0),
], ids=["chat", "chat-after-search", "completions", "models", "messages", "messages-search",
        "responses", "responses-search"])
def test_vllm_5xx_keeps_its_status(proxy, backend, searxng, method, target, body, replies_before, status):
    if replies_before:
        backend.script(search_turn("q"))
    backend.script(error_reply(status, "engine is dead", "InternalServerError"))
    got, _, data = raw_request(proxy.url, method, target, json.dumps(body).encode() if body else None)
    assert got == status
    text = json.dumps(json.loads(data))
    assert "engine is dead" in text and '"error"' in text  # OpenAI's or Anthropic's shape, vLLM's words
    assert len(backend.received) == replies_before + 1


@pytest.mark.parametrize("stream_first", [True, False])
def test_vllm_5xx_on_a_stream(proxy, backend, searxng, stream_first):
    """Before the stream starts the status is vLLM's; after a search it is an error event."""
    if not stream_first:
        backend.script(search_stream("q"))
    backend.script(error_reply(503, "engine is dead", "ServiceUnavailableError"))
    status, headers, data = raw_request(proxy.url, "POST", CHAT,
                                        json.dumps({"messages": USER, "stream": True}).encode())
    if stream_first:
        assert status == 503 and json.loads(data)["error"]["message"] == "engine is dead"
    else:
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        events = sse_events(data)
        assert events[-1] == b"data: [DONE]" and data.count(b"data: [DONE]") == 1
        assert json.loads(events[-2][6:])["error"]["message"] == "engine is dead"
        assert searxng.queries == ["q"]
    assert len(backend.received) == (1 if stream_first else 2)


# ---- vLLM dying, going silent or babbling during a search loop ---------------------------

def dying(frames, silence=None):
    """A stream that stops after `frames`: the connection drops, or goes silent for `silence` s."""
    if silence:
        return Reply(headers=list(SSE_HEADERS), chunks=list(frames) + [silence])
    return Reply(headers=list(SSE_HEADERS), chunks=list(frames), drop=True)


CUT_TOOL_CALL = stream_frames(content=["Let me look."],
                              tool_calls=[tool_call("web_search", {"query": "cut"})])[:4]
HALF_ANSWER = stream_frames(content=["par", "tial", " answer"])[:3]


@pytest.mark.parametrize("script, phrase, searches, hangup", [
    # Dies while the search call itself is still arriving: nothing may be searched.
    (lambda: [dying(CUT_TOOL_CALL)], "broke mid-response", [], None),
    # Dies on the turn after a search, mid-answer.
    (lambda: [search_stream("q"), dying(HALF_ANSWER)], "broke mid-response", ["q"], None),
    # Ends the body cleanly but without [DONE]: still not a finished answer.
    (lambda: [search_stream("q"), Reply(headers=list(SSE_HEADERS), chunks=HALF_ANSWER)], "ended the stream early", ["q"], None),
    # Goes silent past READ_TIMEOUT on the turn after a search: the proxy hangs up on it.
    (lambda: [search_stream("q"), dying(HALF_ANSWER, silence=SLOW)], "timed out", ["q"], 1),
], ids=["dies-in-tool-call", "dies-after-search", "no-done-after-search", "silent-after-search"])
def test_vllm_dying_in_a_search_stream(start_proxy, backend, searxng, script, phrase, searches, hangup):
    p = start_proxy(KEEPALIVE_INTERVAL="0.2", READ_TIMEOUT="1")
    backend.script(*script())
    status, _, raw = raw_request(p.url, "POST", CHAT, json.dumps({"messages": USER, "stream": True}).encode())
    events = sse_events(raw)
    assert status == 200 and events[-1] == b"data: [DONE]" and raw.count(b"data: [DONE]") == 1
    err = json.loads(events[-2][6:])["error"]
    assert phrase in err["message"] and err["code"] in (502, 504)
    assert stream_text(raw) in ("", "Let me look.", "partial")  # what came, no more, no tool-call leak
    assert b'"tool_calls"' not in raw and b'"finish_reason":"stop"' not in raw
    assert searxng.queries == searches
    if hangup is not None:
        assert backend.wait_for(lambda b: hangup in b.hangups, 5)


@pytest.mark.parametrize("script, status, phrase", [
    (lambda: [search_turn("q"), Reply(chunks=[b'{"id":"chatcmpl-1","choi'], drop=True)], 502, "broke"),
    (lambda: [search_turn("q"), Reply(chunks=[b'{"id":', SLOW])], 504, "timed out"),
    (lambda: [Reply(body=b"<html>not json</html>")], 502, "not a JSON object"),
    (lambda: [Reply(body=b'{"choices": "nope"}')], 502, "not a chat completion"),
    (lambda: [search_turn("q"), Reply(body=b"[]")], 502, "not a JSON object"),
], ids=["dies-after-search", "silent-after-search", "200-not-json", "200-wrong-shape", "200-array-after-search"])
def test_vllm_failing_in_a_plain_search_loop(start_proxy, backend, searxng, script, status, phrase):
    p = start_proxy(KEEPALIVE_INTERVAL="0.2", READ_TIMEOUT="1")
    backend.script(*script())
    got, _, data = raw_request(p.url, "POST", CHAT, json.dumps({"messages": USER}).encode())
    err = json.loads(data)["error"]
    assert got == status and phrase in err["message"] and err["code"] == status
    assert len(backend.received) == len(script())
    assert "Traceback" not in p.log()


@pytest.mark.parametrize("target, body, shape", [
    ("/v1/responses", {"model": "foundation", "input": "hi", "tools": [{"type": "web_search"}]}, "openai"),
    ("/v1/messages", {"model": "foundation", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}],
                      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "anthropic"),
])
def test_a_200_that_is_not_json_is_a_502_on_the_agent_routes(proxy, backend, target, body, shape):
    backend.script(Reply(body=b"<html>not json</html>"))
    got, _, data = raw_request(proxy.url, "POST", target, json.dumps(body).encode())
    doc = json.loads(data)
    assert got == 502 and "not a JSON object" in doc["error"]["message"]
    assert (doc.get("type") == "error") == (shape == "anthropic")
    assert "Traceback" not in proxy.log()


# ---- SearXNG failing inside a stream (the plain loop's table is in test_chat_search) --------

@pytest.mark.parametrize("mode, kw, phrase", [
    ("slow", {"seconds": 2}, "did not answer within 0.3 s"),
    ("status", {"code": 429}, "429 Too Many Requests"),
    ("status", {"code": 502}, "HTTP 502"),
    ("nonjson", {}, "did not answer with JSON"),
    ("dead", {}, "every search engine behind"),
])
def test_searxng_failing_inside_a_stream(start_proxy, backend, searxng, mode, kw, phrase):
    p = start_proxy(KEEPALIVE_INTERVAL="0.2", SEARXNG_TIMEOUT="0.3")
    searxng.behave(None, mode, **kw)
    backend.script(search_stream("q1"), sse_reply(stream_frames(content=["answered ", "anyway"])))
    status, _, raw = raw_request(p.url, "POST", CHAT, json.dumps({"messages": USER, "stream": True}).encode())
    assert status == 200 and stream_text(raw) == "answered anyway" and raw.endswith(b"data: [DONE]\n\n")
    assert b'"error"' not in raw
    tool = backend.received[1].json()["messages"][2]
    assert tool["role"] == "tool" and phrase in tool["content"]
    assert searxng.queries == ["q1"]


# ---- the model misbehaving ---------------------------------------------------------------

def test_malformed_and_repeated_searches_in_a_stream(proxy, backend, searxng):
    """The stream twin of test_chat_search's tables: error tool results, no second search."""
    backend.script(sse_reply(stream_frames(tool_calls=[tool_call("web_search", "{not json")])),
                   search_stream("same"), search_stream("same"),
                   sse_reply(stream_frames(content=["ok"])))
    status, _, raw = raw_request(proxy.url, "POST", CHAT, json.dumps({"messages": USER, "stream": True}).encode())
    assert status == 200 and stream_text(raw) == "ok"
    tools = [m["content"] for m in backend.received[3].json()["messages"] if m["role"] == "tool"]
    assert "not valid JSON" in tools[0]
    assert tools[1].startswith('Search results for "same"')
    assert tools[2].startswith("You already searched for exactly this")
    assert searxng.queries == ["same"]


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("client_tools", [None, [WEATHER]])
def test_unknown_tool_goes_to_the_client_as_vllm_wrote_it(proxy, backend, searxng, stream, client_tools):
    """A call to a tool nobody defined is not the proxy's to judge: it only knows web_search,
    and the client that owns the other tools (and its own loop) answers or rejects it. So
    it reaches the client exactly as vLLM wrote it, and nothing is searched or retried."""
    call = tool_call("rm_rf_everything", {"path": "/"})
    body = {"messages": USER, "stream": stream, **({"tools": client_tools} if client_tools else {})}
    reply = sse_reply(stream_frames(tool_calls=[call])) if stream else json_reply(completion(tool_calls=[call]))
    backend.script(reply)
    status, _, data = raw_request(proxy.url, "POST", CHAT, json.dumps(body).encode())
    assert status == 200 and data == (b"".join(reply.chunks) if stream else reply.body)
    assert len(backend.received) == 1 and searxng.queries == []


def test_unknown_tool_beside_a_search_is_stubbed_then_delivered(proxy, backend, searxng):
    """In a turn that also searches, the unknown call gets the not-executed stub like any
    client call; if the model insists, the client receives it after the search."""
    from proxy.tools.base import NOT_EXECUTED
    mixed = [tool_call("web_search", {"query": "q"}), tool_call("made_up", {})]
    again = tool_call("made_up", {})
    backend.script(json_reply(completion(tool_calls=mixed)), json_reply(completion(tool_calls=[again])))
    status, _, data = raw_request(proxy.url, "POST", CHAT, json.dumps({"messages": USER}).encode())
    calls = json.loads(data)["choices"][0]["message"]["tool_calls"]
    assert status == 200 and calls == [again]
    sent = backend.received[1].json()["messages"]
    assert sent[3] == {"role": "tool", "tool_call_id": mixed[1]["id"], "content": NOT_EXECUTED}
    assert searxng.queries == ["q"]


# ---- clients sending bad input (the first rows are in test_relay) ---------------------------

@pytest.mark.parametrize("target, body, status, phrase", [
    (CHAT, b'{"messages": [1, 2]}', 400, "Every entry of `messages`"),
    (CHAT, b'{"messages": null}', 400, "messages"),
    (CHAT, b'{"messages": [], "tools": [1]}', 400, "tools"),
    (CHAT, b'{"messages": [], "tools": {"a": 1}}', 400, "tools"),
    (CHAT, b'{"messages": [], "stream": 1}', 400, "stream"),
    (CHAT, b'{"messages": [], "stream_options": "usage"}', 400, "stream_options"),
    (CHAT, b'{"messages": [], "tool_choice": 5}', 400, "tool_choice"),
    (CHAT, b"null", 400, "JSON object"),
    (CHAT, b"12", 400, "JSON object"),
    (CHAT, b"   ", 400, "not valid JSON"),
    (CHAT, b'{"messages": []}garbage', 400, "not valid JSON"),
    (CHAT, b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', 400, "not valid JSON"),
    (CHAT, b"\xef\xbb\xbf\xff", 400, "not valid JSON"),
    # json.loads raises RecursionError, not ValueError, for this: it used to be a 500.
    (CHAT, b"[" * 100_000, 400, "nested too deeply"),
    ("/v1/messages", b'{"messages": ' + b"[" * 100_000, 400, "nested too deeply"),
    ("/v1/responses", b'{"input": ' + b"[" * 100_000, 400, "nested too deeply"),
], ids=lambda v: v.decode("latin-1")[:40] if isinstance(v, bytes) else None)
def test_bad_bodies_are_400_and_never_reach_vllm(proxy, backend, target, body, status, phrase):
    got, headers, data = raw_request(proxy.url, "POST", target, body, {"Content-Type": "application/json"})
    doc = json.loads(data)
    err = doc["error"]
    if target.startswith("/v1/messages"):  # Anthropic's shape, which Claude Code parses
        assert (got, doc["type"], err["type"]) == (status, "error", "invalid_request_error")
    else:
        assert (got, err["code"], err["type"]) == (status, status, "invalid_request_error")
    assert phrase in err["message"] and headers["content-type"] == "application/json"
    assert backend.received == []


def test_lone_surrogate_escape_reaches_vllm_as_sent(proxy, backend, searxng):
    """Valid JSON that UTF-8 cannot encode once decoded: it used to be a 500 on every loop."""
    backend.script(json_reply(completion(content="ok")))
    body = b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'
    status, _, data = raw_request(proxy.url, "POST", CHAT, body)
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "ok"
    assert b'"a\\ud800b"' in backend.received[0].body


LIMIT = 1000


@pytest.mark.parametrize("target", [CHAT, "/v1/messages", "/v1/responses", "/v1/alpha/search", "/v1/other"])
@pytest.mark.parametrize("how", ["length", "chunked", "declared"])
def test_bodies_over_the_limit_are_413(start_proxy, backend, target, how):
    p = start_proxy(MAX_BODY_BYTES=str(LIMIT))
    big = b'{"messages": [], "x": "' + b"a" * (3 * LIMIT) + b'"}'
    if how == "length":
        status, _, data = raw_request(p.url, "POST", target, big)
    else:
        if how == "chunked":  # no Content-Length to check up front: the limit must hold anyway
            head = b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % target.encode()
            payload = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 500]), big[i:i + 500])
                               for i in range(0, len(big), 500)) + b"0\r\n\r\n"
        else:  # a Content-Length that announces too much: refused before any of it is read
            head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (target.encode(), 10 * LIMIT)
            payload = b"{}"
        s = send_raw(p, head, payload)
        resp = http.client.HTTPResponse(s)
        resp.begin()
        status, data = resp.status, resp.read()
        s.close()
    doc = json.loads(data)
    err = doc["error"]
    assert status == 413 and "MAX_BODY_BYTES" in err["message"]
    if target.startswith("/v1/messages"):  # Anthropic's shape on Anthropic's route
        assert (doc["type"], err["type"]) == ("error", "request_too_large")
    else:
        assert err["code"] == 413
    assert backend.received == []


@pytest.mark.parametrize("target", [CHAT, "/v1/messages", "/v1/responses", "/v1/alpha/search", "/v1/other"])
@pytest.mark.parametrize("sent", [0, 100, 4999])
def test_a_body_shorter_than_its_content_length_is_a_400(proxy, backend, target, sent):
    """A client that stops sending (it hung up its side, or its length is wrong): the body is read in one call of the
    announced length, and what came short of it is the client's framing, in the route's shape; vLLM never sees half a
    request."""
    body = (b'{"messages": [], "x": "' + b"a" * 6000)[:sent]
    s = send_raw(proxy, b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                 % target.encode(), body)
    s.shutdown(socket.SHUT_WR)
    resp = http.client.HTTPResponse(s)
    resp.begin()
    status, doc = resp.status, json.loads(resp.read())
    s.close()
    assert status == 400 and f"ended after {sent} of the 5000 bytes" in doc["error"]["message"]
    assert (doc.get("type") == "error") == target.startswith("/v1/messages")
    assert backend.received == []


# ---- BACKEND_API_KEY stays between the proxy and vLLM --------------------------------------

SECRET = "sk-backend-SECRET-0123456789"


@pytest.mark.parametrize("case", ["relay", "search", "stream-search", "vllm-error", "bad-json", "too-large",
                                  "unreachable"])
def test_backend_key_is_never_echoed(start_proxy, backend, searxng, case):
    env = {"BACKEND_API_KEY": SECRET, "MAX_BODY_BYTES": "100000"}
    if case == "unreachable":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["BACKEND_URL"] = f"http://127.0.0.1:{s.getsockname()[1]}"
    p = start_proxy(**env)
    target, body = CHAT, {"messages": USER}
    if case == "relay":
        target, body = "/v1/completions", {"prompt": "x"}
        backend.script(json_reply({"id": "cmpl-1"}))
    elif case == "search":
        backend.script(search_turn("q"), json_reply(completion(content="ok")))
    elif case == "stream-search":
        body = {**body, "stream": True}
        backend.script(search_stream("q"), sse_reply(stream_frames(content=["ok"])))
    elif case == "vllm-error":
        backend.script(error_reply(401, "Invalid API key", "AuthenticationError"))
    raw = b"{nope" if case == "bad-json" else b'{"x": "' + b"a" * 200_000 + b'"}' if case == "too-large" \
        else json.dumps(body).encode()
    status, headers, data = raw_request(p.url, "POST", target, raw, {"Authorization": "Bearer client-key"})
    assert SECRET not in data.decode("latin-1") and SECRET not in json.dumps(headers)
    assert status == {"bad-json": 400, "too-large": 413, "unreachable": 502, "vllm-error": 401}.get(case, 200)
    # vLLM gets the proxy's key, never the client's; SearXNG gets neither.
    for r in backend.received:
        assert r.headers["authorization"] == f"Bearer {SECRET}"
    assert len(backend.received) == {"search": 2, "stream-search": 2, "relay": 1, "vllm-error": 1}.get(case, 0)
    for r in searxng.requests:
        assert "authorization" not in r.headers and SECRET not in json.dumps(r.headers)
    assert SECRET not in wait_for_log(p, lambda log: access_lines(log))


# ---- a slow reader must not make the proxy buffer the stream ------------------------------

PIECE = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 65000}}]}).encode() + b"\n\n"
TOTAL_MB = 192


@pytest.mark.parametrize("target, body, search_first", [
    ("/v1/completions", {"prompt": "x", "stream": True}, False),
    (CHAT, {"messages": USER, "stream": True}, False),
    (CHAT, {"messages": USER, "stream": True}, True),
], ids=["relay", "chat-stream", "chat-stream-after-search"])
def test_slow_reader_gets_backpressure_not_a_buffer(start_proxy, backend, searxng, target, body, search_first):
    """vLLM writes ~192 MB while the client reads 1 MB and stalls. A proxy that keeps
    reading would grow by that much; one that waits on the client keeps vLLM's writes
    blocked, so vLLM is still mid-stream when the client finally hangs up."""
    p = start_proxy(SLOW_READER="1")  # its own worker, so the RSS is this test's alone
    pid = worker_pid(p)
    n = TOTAL_MB * (1 << 20) // len(PIECE)
    big = Reply(headers=list(SSE_HEADERS), chunks=[PIECE] * n + [b"data: [DONE]\n\n"])
    if search_first:
        backend.script(search_stream("q"))
    backend.script(big)
    before = rss_mb(pid)
    s = post_raw(p, target, body)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    read_until(s, b"x" * 1000, limit=1 << 20)
    time.sleep(1.5)  # long enough for an unthrottled proxy to pull a good part of the 192 MB
    grown = rss_mb(pid) - before
    s.close()
    assert grown < 48, f"the proxy's RSS grew {grown:.0f} MB for one stalled client"
    index = 1 if search_first else 0
    assert backend.wait_for(lambda b: index in b.hangups, 10), "vLLM must still have been writing, then see the hang-up"


# ---- the access log -------------------------------------------------------------------------

def test_one_log_line_per_request_and_no_text(start_proxy, backend, searxng):
    p = start_proxy(LOG_TEST="1", MAX_BODY_BYTES="100000")
    prompt, answer = "PROMPT-TEXT-7f3a", "ANSWER-TEXT-9c1e"
    user = [{"role": "user", "content": prompt}]
    backend.script(search_turn("query words"), json_reply(completion(content=answer)),
                   search_stream("other words"), sse_reply(stream_frames(content=[answer])),
                   error_reply(500, f"vLLM error quoting {prompt}", "InternalServerError"))
    cases = [
        ("POST", CHAT, {"messages": user}, "200", 1),
        ("POST", CHAT, {"messages": user, "stream": True}, "200", 1),
        ("POST", CHAT, {"messages": user}, "500", 0),
        ("POST", CHAT, {"messages": prompt}, "400", 0),
        ("POST", CHAT, {"messages": user, "pad": "x" * 200_000}, "413", 0),
    ]
    sizes = []
    for method, target, body, _, _ in cases:
        status, _, data = raw_request(p.url, method, target, json.dumps(body).encode())
        sizes.append(len(data))
    log = wait_for_log(p, lambda text: len(access_lines(text)) >= len(cases))
    assert access_lines(log) == [(m, t, st, n, size) for (m, t, _, st, n), size in zip(cases, sizes, strict=True)]
    assert prompt not in log and answer not in log


def test_search_queries_are_not_logged_at_info(proxy, backend, searxng):
    backend.script(search_turn("private query words"), json_reply(completion(content="ok")))
    raw_request(proxy.url, "POST", CHAT, json.dumps({"messages": USER}).encode())
    assert searxng.queries == ["private query words"]
    assert "private query words" not in wait_for_log(proxy, lambda log: "searches=1" in log)
