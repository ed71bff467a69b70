"""The X-Session-ID every request to vLLM carries (proxy/http/affinity.py), and the one retry of a call that failed
before any answer (Exchange.call): the pure key over the agents' real captured requests, then what the stand-in
vLLM received from the real proxy for every API, and what the client got when vLLM (or a router) failed once.

Run: tests/run.sh tests/test_affinity.py
"""
from __future__ import annotations

import hashlib
import http.client
import json
import socket
from pathlib import Path

import pytest

from proxy.backends.state.state import MemoryState
from proxy.http.affinity import Secret, conversation_start, session_key
from standins.keepalive_server import DROP, OK, KeepAliveServer
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply
from standins.vllm_wire import completion, json_reply, sse_reply, stream_frames, tool_call

WIRE = Path(__file__).parent / "data" / "agent-wire"
SECRET = b"k" * 32


def captured(name: str) -> list[dict]:
    return json.loads((WIRE / name).read_text())


def key_of(request: dict, secret: bytes = SECRET) -> str:
    body = request["body"]
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return session_key(request["headers"], raw, secret)


# ---- the pure key ----------------------------------------------------------------------------------

@pytest.mark.parametrize("capture", ["claude-code-2.1.332-webfetch.json", "claude-code-2.1.332-websearch.json",
                                     "codex-0.171.0-alpha-search.json", "codex-0.171.0-websearch.json"])
def test_every_request_of_a_captured_agent_session_gets_one_key(capture):
    requests = captured(capture)
    keys = {key_of(r) for r in requests if any(n.lower() in ("x-claude-code-session-id", "session-id")
                                              for n, _ in r["headers"])}
    assert len(keys) == 1, keys


def test_two_captured_sessions_get_different_keys():
    keys = {key_of(captured(name)[0]) for name in ("claude-code-2.1.332-webfetch.json",
                                                   "claude-code-2.1.332-websearch.json",
                                                   "codex-0.171.0-alpha-search.json", "codex-0.171.0-websearch.json")}
    assert len(keys) == 4


def test_the_key_reveals_neither_the_id_nor_the_prompt_and_depends_on_the_secret():
    sid = "649649b0-625c-40e0-8d6f-1f197482e6fb"
    key = session_key([("X-Claude-Code-Session-Id", sid)], b"", SECRET)
    assert len(key) == 32 and int(key, 16) >= 0
    assert sid.replace("-", "") not in key and key not in hashlib.sha256(sid.encode()).hexdigest()
    assert session_key([("X-Claude-Code-Session-Id", sid)], b"", b"another secret") != key
    # A value that is a secret (someone's key in a session header) leaves the proxy only as this HMAC.
    assert "sk-" not in session_key([("session-id", "sk-live-123")], b"", SECRET)


SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "What is vLLM?"}
ANSWER = {"role": "assistant", "content": "An engine."}
NEXT = {"role": "user", "content": "And its router?"}


def chat(*messages) -> bytes:
    return json.dumps({"model": "foundation", "messages": list(messages)}).encode()


def key(body: bytes, headers=()) -> str:
    return session_key(list(headers), body, SECRET)


@pytest.mark.parametrize("later, same", [
    (chat(SYSTEM, FIRST, ANSWER, NEXT), True),                           # the next turn resends the start
    (chat(SYSTEM, FIRST, ANSWER, NEXT, ANSWER, NEXT), True),
    (json.dumps({"messages": [SYSTEM, FIRST], "stream": True, "tools": []}).encode(), True),  # other fields
    (chat(SYSTEM, {"role": "user", "content": "What is SGLang?"}), False),  # another conversation
    (chat({"role": "system", "content": "You are verbose."}, FIRST), False),
    (chat(FIRST), False),                                                # no system prompt: not the same start
])
def test_chat_key_follows_the_conversations_start(later, same):
    assert (key(later) == key(chat(SYSTEM, FIRST))) is same


def test_messages_key_ignores_where_cache_control_moved():
    def body(*turns, marked_first: bool):
        text = {"type": "text", "text": "What is vLLM?"}
        if marked_first:
            text = {**text, "cache_control": {"type": "ephemeral"}}
        return json.dumps({"model": "claude-x", "system": [{"type": "text", "text": "sys"}],
                           "messages": [{"role": "user", "content": [text]}, *turns]}).encode()
    first = key(body(marked_first=True))
    later = key(body({"role": "assistant", "content": "An engine."}, {"role": "user", "content": "more"},
                     marked_first=False))
    assert first == later
    assert conversation_start(body(marked_first=True)) == conversation_start(body(marked_first=False))


def test_responses_key_from_instructions_and_first_user_input():
    items = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    first = key(json.dumps({"instructions": "be brief", "input": items}).encode())
    later = key(json.dumps({"instructions": "be brief", "input": items + [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "again"}]}]}).encode())
    assert first == later
    assert key(json.dumps({"input": "hi"}).encode()) != key(json.dumps({"input": "bye"}).encode())


@pytest.mark.parametrize("body", [b"", b"not json", b"[1,2]", b'{"model":"foundation"}', b'{"messages":"x"}',
                                  b'{"prompt":"a"}', b"\xff\xfe"])
def test_no_conversation_gets_a_fresh_random_key(body):
    a, b = key(body), key(body)
    assert a != b and len(a) == len(b) == 32


def test_the_clients_own_id_wins_over_the_body():
    a = key(chat(SYSTEM, FIRST), [("session-id", "s1")])
    assert a == key(chat(SYSTEM, {"role": "user", "content": "other"}), [("Session-Id", "s1")])
    assert a != key(chat(SYSTEM, FIRST), [("session-id", "s2")])
    assert a != key(chat(SYSTEM, FIRST))


# ---- what vLLM received from the real proxy ---------------------------------------------------------

USER = [{"role": "user", "content": "What is new in vLLM?"}]


def sent_keys(backend) -> list[str]:
    return [r.headers.get("x-session-id") for r in backend.received]


def test_every_turn_of_a_search_loop_carries_the_relays_key(proxy, backend, searxng):
    call = [tool_call("web_search", {"query": "vllm"})]
    backend.script(json_reply(completion(tool_calls=call, finish_reason="tool_calls")),
                   json_reply(completion(content="ok", finish_reason="stop")))
    body = json.dumps({"model": "foundation", "messages": USER}).encode()
    status, _, _ = raw_request(proxy.url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    assert status == 200
    # The next request of the same conversation, relayed whole (no search: tool_choice none).
    later = json.dumps({"model": "foundation", "tool_choice": "none", "messages": USER + [
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "thanks"}]}).encode()
    backend.script(json_reply(completion(content="bye", finish_reason="stop")))
    assert raw_request(proxy.url, "POST", "/v1/chat/completions", later, {"Content-Type": "application/json"})[0] == 200
    keys = sent_keys(backend)
    assert len(keys) == 3 and len(set(keys)) == 1 and len(keys[0]) == 32


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"model": "foundation", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages/count_tokens", {"model": "foundation", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "foundation", "input": "hi", "tools": []}),
    ("/v1/completions", {"model": "foundation", "prompt": "hi"}),
])
def test_each_api_sends_the_agents_session_as_a_keyed_id(proxy, backend, path, body):
    for _ in range(2):
        backend.script(Reply(body=b"{}"))
        status, _, _ = raw_request(proxy.url, "POST", path, json.dumps(body).encode(),
                                   {"Content-Type": "application/json", "X-Claude-Code-Session-Id": "abc",
                                    "X-Session-ID": "client-chosen"})
        assert status == 200
    keys = sent_keys(backend)
    assert len(set(keys)) == 1 and keys[0] not in ("abc", "client-chosen")
    # The agent's own header still reaches vLLM as it was (the proxy is transparent for it).
    assert backend.received[0].headers["x-claude-code-session-id"] == "abc"
    # The client's own X-Session-ID is replaced, never sent beside the proxy's.
    assert all(list(r.headers).count("x-session-id") == 1 for r in backend.received)


def test_requests_of_no_session_spread(proxy, backend):
    for _ in range(2):
        backend.script(Reply(body=b'{"data":[]}'))
        assert raw_request(proxy.url, "GET", "/v1/models", None, {})[0] == 200
    a, b = sent_keys(backend)
    assert a and b and a != b


def test_proxies_sharing_a_secret_give_one_session_one_key(start_proxy, backend):
    body = json.dumps({"model": "foundation", "tool_choice": "none", "messages": USER}).encode()
    for p in (start_proxy(SESSION_ID_SECRET="shared"), start_proxy(SESSION_ID_SECRET="shared", PROXY_WORKERS="2"),
              start_proxy(SESSION_ID_SECRET="other")):
        backend.script(json_reply(completion(content="ok", finish_reason="stop")))
        assert raw_request(p.url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})[0] == 200
    shared, shared_too, other = sent_keys(backend)
    assert shared == shared_too != other


def test_without_a_secret_every_worker_of_one_proxy_agrees(start_proxy, backend):
    """gunicorn.conf.py makes the key once in the master: each connection here may reach either worker, and one
    conversation still gets one key (a key per worker would scatter its turns over a router's workers)."""
    proxy = start_proxy(PROXY_WORKERS="2")
    body = json.dumps({"model": "foundation", "tool_choice": "none", "messages": USER}).encode()
    for _ in range(8):
        backend.script(json_reply(completion(content="ok", finish_reason="stop")))
        assert raw_request(proxy.url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})[0] == 200
    assert len(set(sent_keys(backend))) == 1


CODEX = captured("codex-0.171.0-websearch.json")[0]


def codex_body(prompt: str, later: bool = False) -> bytes:
    """Codex 0.171's captured first request with the person's prompt replaced: its developer messages, then its
    <environment_context> user message (the same for every session in one folder), then the prompt."""
    body = CODEX["body"] if isinstance(CODEX["body"], dict) else json.loads(CODEX["body"])
    items = [i for i in body["input"] if i.get("role") in ("developer", "user")]
    items[-1] = {**items[-1], "content": [{"type": "input_text", "text": prompt}]}
    if later:
        items += [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And now?"}]}]
    return json.dumps({**body, "input": items, "stream": False, "tools": []}).encode()


# (headers, body) of two requests through real gunicorn -> whether vLLM saw one X-Session-ID for both.
@pytest.mark.parametrize("first, second, same", [
    (({"session-id": "aaaa"}, codex_body("hi")), ({"session-id": "bbbb"}, codex_body("hi")), False),
    (({"session-id": "aaaa"}, codex_body("hi")), ({"session-id": "aaaa"}, codex_body("bye")), True),
    (({"Session-Id": "aaaa"}, codex_body("hi")), ({"session-id": "aaaa"}, codex_body("hi")), True),
    (({"X-Session-ID": "aaaa"}, codex_body("hi")), ({"X-Session-ID": "bbbb"}, codex_body("hi")), False),
    (({"X-Claude-Code-Session-Id": "a"}, codex_body("hi")), ({"X-Claude-Code-Session-Id": "b"}, codex_body("hi")),
     False),
    # No header: the session's start, past the environment context every session of one folder sends alike.
    (({}, codex_body("Fix the parser")), ({}, codex_body("Write the docs")), False),
    (({}, codex_body("Fix the parser")), ({}, codex_body("Fix the parser", later=True)), True),
], ids=["codex-session-id", "same-session", "header-case", "x-session-id", "claude-code", "codex-start",
        "codex-next-turn"])
def test_sessions_are_told_apart_through_gunicorn(proxy, backend, first, second, same):
    for headers, body in (first, second):
        backend.script(Reply(body=b"{}"))
        status, _, data = raw_request(proxy.url, "POST", "/v1/responses", body,
                                      {"Content-Type": "application/json", **headers})
        assert status == 200, data
    a, b = sent_keys(backend)
    assert (a == b) is same and len(a) == len(b) == 32
    # The client's own header still reached vLLM as it came.
    for (headers, _), seen in zip((first, second), backend.received, strict=True):
        assert all(seen.headers.get(n.lower()) == v for n, v in headers.items() if n.lower() != "x-session-id")


def test_a_codex_start_skips_what_the_client_generated():
    start = json.loads(conversation_start(codex_body("Fix the parser")))
    assert "Fix the parser" in json.dumps(start[1]) and "environment_context" not in json.dumps(start)


def test_a_store_that_lost_the_key_gets_the_running_replicas_back():
    """Secret without SESSION_ID_SECRET on one store (MemoryState stands for Valkey here; test_state_shared.py runs
    the real one): the first replica's key is everyone's, and after the store restarted empty the running replica
    puts it back within REFRESH, so one started meanwhile comes round to it."""
    now = [0.0]
    store = MemoryState()
    first, second = Secret("", store, clock=lambda: now[0]), Secret("", store, clock=lambda: now[0])
    assert first() == second() and len(first()) == 64
    key = first()
    store.drop(Secret.USE, Secret.KEY)
    late = Secret("", store, clock=lambda: now[0])
    assert late() != key  # asked before anyone put the key back
    now[0] += Secret.REFRESH
    store.drop(Secret.USE, Secret.KEY)
    assert first() == key and second() == key and late() == key
    assert Secret("configured", store)() == b"configured"


# ---- one retry before any byte reached the client ----------------------------------------------------

GONE = Reply(status=502, body=b"Backend request failed: error sending request", headers=[("Content-Type", "text/plain")])
NONE_LEFT = Reply(status=503, body=b"No available workers", headers=[("Content-Type", "text/plain")])
SPENT = Reply(status=500, body=b"Request failed: error sending request for url (http://w2:8000/v1/models)",
              headers=[("Content-Type", "text/plain; charset=utf-8")])


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "foundation", "messages": USER}),           # the search loop's first turn
    ("/v1/chat/completions", {"model": "foundation", "messages": USER, "tool_choice": "none"}),  # relayed
    ("/v1/messages", {"model": "foundation", "max_tokens": 5, "messages": USER}),
    ("/v1/responses", {"model": "foundation", "input": "hi"}),
    ("/v1/completions", {"model": "foundation", "prompt": "hi"}),
])
@pytest.mark.parametrize("failure", [GONE, NONE_LEFT, SPENT], ids=["502", "503", "500"])
def test_a_gateways_plain_text_failure_is_tried_once_more(proxy, backend, path, body, failure):
    backend.script(failure, json_reply(completion(content="ok", finish_reason="stop")))
    status, _, data = raw_request(proxy.url, "POST", path, json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})
    assert status == 200, data
    assert len(backend.received) == 2
    assert backend.received[0].body == backend.received[1].body
    assert len(set(sent_keys(backend))) == 1


def test_a_stream_is_tried_once_more_before_its_first_byte(proxy, backend):
    backend.script(GONE, sse_reply(stream_frames(content=["o", "k"], finish_reason="stop")))
    body = {"model": "foundation", "messages": USER, "stream": True}
    status, _, data = raw_request(proxy.url, "POST", "/v1/chat/completions", json.dumps(body).encode(),
                                  {"Content-Type": "application/json"})
    assert status == 200 and b"data: [DONE]" in data
    assert len(backend.received) == 2


def test_only_one_retry(proxy, backend):
    backend.script(GONE, GONE, json_reply(completion(content="never", finish_reason="stop")))
    status, _, data = raw_request(proxy.url, "POST", "/v1/chat/completions",
                                  json.dumps({"model": "foundation", "messages": USER}).encode(),
                                  {"Content-Type": "application/json"})
    assert status == 502 and len(backend.received) == 2
    backend.reset()


@pytest.mark.parametrize("reply", [
    Reply(status=500, body=b'{"error":{"message":"boom"}}'),  # vLLM's own engine error: JSON
    Reply(status=400, body=b'{"error":{"message":"bad"}}'),
    Reply(status=504, body=b"timeout", headers=[("Content-Type", "text/plain")]),
    # vLLM's own 503 (JSON) and its /health while the engine is dead (empty): vLLM's answer, not a lost worker.
    Reply(status=503, body=b'{"error":{"message":"engine is dead"}}'),
    Reply(status=503, body=b"", headers=[]),
])
def test_vllms_own_errors_are_not_retried(proxy, backend, reply):
    backend.script(reply)
    status, _, data = raw_request(proxy.url, "POST", "/v1/completions", b'{"prompt":"a"}',
                                  {"Content-Type": "application/json"})
    assert (status, data) == (reply.status, reply.body) and len(backend.received) == 1


def test_bytes_already_sent_are_never_retried(proxy, backend):
    # The stream broke after its first event reached the client: it must see a broken stream, not a second answer.
    first = stream_frames(content=["partial"])
    backend.script(Reply(headers=[("Content-Type", "text/event-stream")], chunks=[first[0]], drop=True),
                   sse_reply(stream_frames(content=["second"], finish_reason="stop")))
    body = {"model": "foundation", "messages": USER, "stream": True, "tool_choice": "none"}
    with pytest.raises(http.client.IncompleteRead) as broken:
        raw_request(proxy.url, "POST", "/v1/chat/completions", json.dumps(body).encode(),
                    {"Content-Type": "application/json"})
    assert broken.value.partial.startswith(b"data: ") and b"second" not in broken.value.partial
    assert len(backend.received) == 1
    backend.reset()


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v1/chat/completions", json.dumps({"model": "foundation", "messages": USER,
                                                 "tool_choice": "none"}).encode()),
    ("POST", "/v1/messages", json.dumps({"model": "foundation", "max_tokens": 5, "messages": USER}).encode()),
    ("GET", "/v1/models", None),
])
def test_a_connection_closed_before_the_head_is_tried_once_more(start_proxy, tmp_path, method, path, body):
    # A fresh connection (no pooled one to blame) read, then closed without a byte: a worker that died under the
    # request, or a router that lost it.
    server = KeepAliveServer([DROP, OK], default=DROP)
    try:
        proxy = start_proxy(BACKEND_URL=server.url)
        status, _, data = raw_request(proxy.url, method, path, body, {"Content-Type": "application/json"})
        assert (status, data) == (200, b"{}")
        assert [s.path for s in server.seen] == [path, path]
        assert len({s.connection for s in server.seen}) == 2
    finally:
        server.close()


def test_a_refused_connection_is_tried_once_and_then_a_502(start_proxy):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    proxy = start_proxy(BACKEND_URL=f"http://127.0.0.1:{port}")
    status, _, data = raw_request(proxy.url, "GET", "/v1/models", None, {})
    assert status == 502 and b"connection refused" in data
    assert proxy.log_path.read_text().count("trying once more") >= 1
