"""Every client mistake is a 4xx in its route's API's error shape (issue 55): no 500, no traceback, no HTML page.

The proxy under real gunicorn against the stand-ins, table by table: request -> status -> shape (and what vLLM
and SearXNG were asked). Each row is a request that was a 500, a traceback, a 502 without SearXNG being asked, an
OpenAI-shaped error on an Anthropic route or gunicorn's HTML page before; the fuzzer's finds are in
tests/test_fuzz.py's REGRESSIONS. docs/apis.md, "Errors on every route", is the rule.

Run: tests/run.sh tests/test_client_errors.py -n 0
"""
from __future__ import annotations

import json
import socket
import urllib.parse

import pytest

from standins import anthropic_wire as aw
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply
from standins.vllm_wire import compact, completion, tool_call

CHAT, MESSAGES, COUNT, RESPONSES, ALPHA = ("/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens",
                                           "/v1/responses", "/v1/alpha/search")
POST_ROUTES = [CHAT, "/v1/completions", MESSAGES, COUNT, RESPONSES, ALPHA]
BAD = ("Traceback", "Exception on", "Error handling request", " ERROR ")


def shape_problem(route: str, status: int, data: bytes) -> str | None:
    """What is wrong with an error body for the route's clients (Anthropic's shape under /v1/messages, OpenAI's
    elsewhere), or None."""
    try:
        doc = json.loads(data)
    except ValueError:
        return f"not JSON: {data[:200]!r}"
    err = doc.get("error") if isinstance(doc, dict) else None
    if not (isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"]
            and isinstance(err.get("type"), str)):
        return f"no error.message and error.type: {doc!r}"
    if route.startswith("/v1/messages"):
        ok = doc.get("type") == "error" and set(doc) == {"type", "error"}
        if ok and 400 <= status < 500 and err["type"] == "api_error":
            return "a client's mistake typed as Anthropic's server error"
        return None if ok else f"not Anthropic's shape: {doc!r}"
    if 400 <= status < 500 and err["type"] in ("server_error", "api_error"):
        return f"a client's mistake typed as a server error: {doc!r}"
    return None if err.get("code") == status and "param" in err else f"not OpenAI's shape: {doc!r}"


def send_raw(url: str, data: bytes, timeout: float = 10) -> tuple[int, dict, bytes]:
    """Bytes on a fresh connection, read to the end: (status, lower-cased headers, body)."""
    u = urllib.parse.urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while True:
            try:
                piece = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not piece:
                break
            got += piece
            head, sep, body = got.partition(b"\r\n\r\n")
            length = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            if sep and length and len(body) >= length[0]:
                break
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line))
    return int(lines[0].split()[1]), headers, body


def clean_log(proxy, start: int) -> None:
    log = proxy.log()[start:]
    for bad in BAD:
        assert bad not in log, f"{bad!r} in the proxy's log: {log[-2000:]}"


# ---- 1 and 2: fields of the wrong type and text that cannot be encoded, refused at the edge ----------------

WEB_SEARCH_SUB = {"model": "foundation", "max_tokens": 100,
                  "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
                  "messages": [{"role": "user", "content": [
                      {"type": "text", "text": "Perform a web search for the query: a\ud800b"}]}]}
REFUSED = [
    # (route, body, param named in the message)
    (CHAT, {"messages": [{"role": []}]}, "messages[0].role"),
    (CHAT, {"messages": [{"role": {"a": 1}, "content": "x"}], "stream": True}, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}, {"role": 5}]}, "messages[1].role"),
    (RESPONSES, {"model": "foundation", "input": [{"role": []}], "tools": [{"type": "web_search"}]}, "input[0].role"),
    (RESPONSES, {"model": "foundation", "input": [{"type": "message", "role": {}}], "tools": [{"type": "web_search"}],
                 "stream": True}, "input[0].role"),
    (ALPHA, {"input": [{"role": []}], "commands": {"search_query": [{"q": "vllm"}]}}, "input[0].role"),
    (ALPHA, {"input": [{"type": "message", "role": "user", "content": "hi"}],
             "commands": {"search_query": [{"q": "a\ud800b"}]}}, "commands.search_query[0].q"),
    (MESSAGES, WEB_SEARCH_SUB, "messages.0.content.0.text"),
    (MESSAGES, {**WEB_SEARCH_SUB, "stream": True}, "messages.0.content.0.text"),
    (MESSAGES, {**WEB_SEARCH_SUB, "messages": [{"role": [], "content": "x"}]}, "messages.0.role"),
]


@pytest.mark.parametrize("route, body, param", REFUSED, ids=[f"{r[0]}-{r[2]}" for r in REFUSED])
def test_a_field_the_proxy_cannot_read_is_a_400_naming_it(proxy, backend, searxng, route, body, param):
    start = len(proxy.log())
    status, _, data = raw_request(proxy.url, "POST", route, json.dumps(body).encode(),
                                  {"Content-Type": "application/json"}, timeout=10)
    assert status == 400, data[:300]
    assert shape_problem(route, status, data) is None, shape_problem(route, status, data)
    assert param in json.loads(data)["error"]["message"]
    assert backend.received == [] and searxng.requests == []
    clean_log(proxy, start)


def test_a_model_written_query_that_cannot_be_encoded_is_a_result_the_model_reads(proxy, backend, searxng):
    # vLLM writes a lone surrogate as the JSON escape a model's token can produce.
    backend.script(Reply(body=compact(completion(content=None, tool_calls=[
                       tool_call("web_search", {"query": "x"}, "c1")])).replace(b'\\"x\\"', b'\\"a\\\\ud800b\\"')),
                   Reply(body=compact(completion(content="ok"))))
    start = len(proxy.log())
    status, _, data = raw_request(proxy.url, "POST", CHAT, json.dumps(
        {"model": "foundation", "messages": [{"role": "user", "content": "q"}]}).encode(),
        {"Content-Type": "application/json"})
    assert status == 200, data[:300]
    tool_message = backend.received[1].json()["messages"][-1]
    assert tool_message["role"] == "tool" and "cannot be encoded" in tool_message["content"], tool_message
    assert searxng.requests == []
    clean_log(proxy, start)


def test_claude_codes_search_subrequest_with_a_model_query_that_cannot_be_encoded(proxy, backend, searxng):
    """The same on /v1/messages: a search block with an error code, no traceback."""
    backend.script(Reply(body=aw.message_reply([aw.tool_use("web_search", {"query": "x"}, "t1")]).body
                         .replace(b'"x"', b'"a\\ud800b"')),
                   aw.message_reply([aw.text("ok")]))
    start = len(proxy.log())
    body = {**WEB_SEARCH_SUB, "messages": [{"role": "user", "content": "find the news"}]}
    status, _, data = raw_request(proxy.url, "POST", MESSAGES, json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})
    assert status == 200, data[:300]
    blocks = json.loads(data)["content"]
    result = next(b for b in blocks if b["type"] == "web_search_tool_result")
    assert result["content"]["error_code"] == "invalid_tool_input", result
    assert searxng.requests == []
    clean_log(proxy, start)


# ---- 3: a chunked body with a bad chunk size, on every POST route --------------------------------------

@pytest.mark.parametrize("route", POST_ROUTES)
@pytest.mark.parametrize("chunks", [b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}\r\n-1\r\n\r\n", b"2\r\n{}XX"])
def test_a_broken_chunked_body_is_a_400(proxy, backend, route, chunks):
    start = len(proxy.log())
    status, headers, data = send_raw(proxy.url, (
        f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks)
    assert status == 400, data[:300]
    assert shape_problem(route, status, data) is None, shape_problem(route, status, data)
    assert backend.received == []
    clean_log(proxy, start)


# ---- 4: vLLM's own errors on Anthropic routes, reshaped with their status ------------------------------

VLLM_400 = Reply(status=400, body=b'{"error":{"message":"1 validation error: messages Field required",'
                                  b'"type":"Bad Request","param":"body.messages","code":400}}')
VLLM_404 = Reply(status=404, body=b'{"detail":"Not Found"}')
VLLM_401 = Reply(status=401, body=b'{"error":"Unauthorized"}')
ANTHROPIC_RELAYED = [
    # (target, body, vLLM's answer)
    (MESSAGES, b"[]", VLLM_400),
    (MESSAGES, b'"text"', VLLM_400),
    (MESSAGES, b'{"model": "foundation", "max_tokens": 5}', VLLM_400),
    (MESSAGES, b'{"model": "foundation", "max_tokens": 5, "stream": true}', VLLM_400),
    (COUNT, b'{"model": "foundation"}', VLLM_400),
    (MESSAGES + "/batches", b'{"model": "foundation", "max_tokens": 5, "messages": []}', VLLM_404),
    (MESSAGES + "?beta=true", b"{not json", VLLM_400),
    (MESSAGES, b'{"model": "foundation", "max_tokens": 5, "messages": []}', VLLM_401),
]


@pytest.mark.parametrize("target, body, answer", ANTHROPIC_RELAYED,
                         ids=[f"{t}-{b[:20]!r}-{a.status}" for t, b, a in ANTHROPIC_RELAYED])
def test_vllms_errors_on_anthropic_routes_are_in_anthropics_shape(proxy, backend, target, body, answer):
    backend.script(answer)
    status, _, data = raw_request(proxy.url, "POST", target, body, {"Content-Type": "application/json"})
    assert status == answer.status
    assert shape_problem(MESSAGES, status, data) is None, shape_problem(MESSAGES, status, data)
    message = json.loads(data)["error"]["message"]
    assert message in answer.body.decode() or "Not Found" in message or "Unauthorized" in message
    assert len(backend.received) == 1  # vLLM judged it: the proxy only reshaped its answer


def test_a_trailing_slash_is_redirected_back_through_the_proxy(proxy, backend):
    """vLLM answers `POST /v1/messages/` with a 307 to its own address (tests/real_vllm/test_messages_real.py)."""
    backend.script(Reply(status=307, body=b"", headers=[("Location", backend.url + "/v1/messages?beta=true")]))
    status, headers, _ = raw_request(proxy.url, "POST", MESSAGES + "/", b"{}", {"Content-Type": "application/json"})
    assert (status, headers["location"]) == (307, "/v1/messages?beta=true")


@pytest.mark.parametrize("location, relayed", [
    ("http://vllm:8000/v1/messages", "/v1/messages"),
    ("http://vllm:8000/v1/messages?beta=true#x", "/v1/messages?beta=true#x"),
    ("http://vllm:8000", "/"),
    ("https://vllm:8000/v1/messages", "https://vllm:8000/v1/messages"),  # another origin: not vLLM's
    ("https://elsewhere.example/x", "https://elsewhere.example/x"),
    ("/v1/messages", "/v1/messages"),
])
def test_a_redirect_to_vllms_own_address_is_made_relative(location, relayed):
    from proxy.engine.relay import proxied_location
    assert proxied_location([("Location", location), ("X", "y")], "http://vllm:8000") == [("Location", relayed), ("X", "y")]


def test_an_error_of_vllm_on_an_openai_route_stays_as_vllm_wrote_it(proxy, backend):
    backend.script(VLLM_400)
    status, _, data = raw_request(proxy.url, "POST", "/v1/completions", b"{}", {"Content-Type": "application/json"})
    assert (status, data) == (400, VLLM_400.body)


# ---- 5: methods, and the framing errors gunicorn answers itself ------------------------------------------

@pytest.mark.parametrize("method, target", [("PROPFIND", "/v1/models"), ("PROPFIND", MESSAGES), ("TRACE", CHAT),
                                            ("CONNECT", "/v1/models")])
def test_an_unknown_method_is_a_client_error(proxy, backend, method, target):
    start = len(proxy.log())
    status, _, data = send_raw(proxy.url, f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
    assert 400 <= status < 500
    assert shape_problem(target, status, data) is None, shape_problem(target, status, data)
    assert backend.received == []
    clean_log(proxy, start)


FRAMING = [
    # (what, raw request head, status gunicorn gives it)
    ("header over 8190 bytes", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
    ("control character in a header", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\nContent-Length: 2\r\n\r\n{}", 400),
    ("Content-Length -1", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}", 400),
    ("request line over 4094 bytes", b"GET /v1/models?" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    ("on an Anthropic route", b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n{}", 400),
    ("too many headers", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 120 + b"\r\n", 431),
    ("a transfer coding gunicorn does not implement",
     b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: br, chunked\r\n\r\n0\r\n\r\n", 400),
    ("not HTTP at all", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
]


@pytest.mark.parametrize("what, head, expected", FRAMING, ids=[f[0] for f in FRAMING])
def test_framing_errors_gunicorn_answers_are_json(proxy, backend, what, head, expected):
    start = len(proxy.log())
    status, headers, data = send_raw(proxy.url, head)
    assert status == expected
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    route = MESSAGES if b"/v1/messages" in head.split(b"\r\n", 1)[0] else CHAT
    assert shape_problem(route, status, data) is None, shape_problem(route, status, data)
    assert backend.received == []
    clean_log(proxy, start)
