"""Property-based fuzz (hypothesis) of request bodies and headers on the proxy's routes: no
500, a proper error for what it refuses itself, and no worker crash or traceback.

Run: tests/run.sh tests/test_fuzz.py  (FUZZ_EXAMPLES=N for more, FUZZ_RANDOM=1 to explore
beyond the fixed, reproducible sequence CI runs).
"""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply
from standins.vllm_wire import compact, completion, sse_reply, stream_frames
from test_faults import worker_pid

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))

# ---- what the stand-in vLLM answers: always something valid, so any 5xx is the proxy's ----

MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "foundation",
           "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
           "usage": {"input_tokens": 1, "output_tokens": 1}}
RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1, "model": "foundation", "status": "completed",
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}


def responder(received):
    try:
        body = json.loads(received.body)
    except (ValueError, RecursionError):
        body = None
    streaming = isinstance(body, dict) and body.get("stream") is True
    if received.path == "/v1/chat/completions":
        return sse_reply(stream_frames(content=["ok"])) if streaming else Reply(body=compact(completion(content="ok")))
    if received.path.startswith("/v1/messages") or received.path == "/v1/responses":
        if streaming:  # their event grammars are not this stand-in's to fake: vLLM's refusal will do
            return Reply(status=400, body=b'{"error":{"message":"stand-in: no stream here","type":"BadRequestError","param":null,"code":400}}')
        return Reply(body=compact(MESSAGE if received.path.startswith("/v1/messages") else RESPONSE))
    return Reply(body=b'{"ok":true}')


# ---- strategies ---------------------------------------------------------------------------

# Hypothesis never draws lone surrogates on its own; a client can send one as `\\ud800`.
odd_text = st.sampled_from(["a\ud800b", "\udfff", "é中", "\x00", "!!bang", " "])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20), odd_text)
anything = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                        max_leaves=12)


def maybe(strategy):
    """A field that is absent, well-typed, or any JSON value at all."""
    return st.one_of(st.just(None), strategy, anything)


role = st.sampled_from(["user", "assistant", "system", "tool", "developer", "bogus"])
chat_message = st.fixed_dictionaries({"role": role}, optional={
    "content": st.one_of(st.text(max_size=30), odd_text, anything),
    "tool_calls": st.lists(st.fixed_dictionaries({"id": st.text(max_size=5), "type": st.just("function"),
                                                  "function": st.fixed_dictionaries({"name": st.text(max_size=10),
                                                                                     "arguments": st.text(max_size=20)})}),
                           max_size=2),
    "tool_call_id": st.text(max_size=5)})
function_tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["web_search", "get_weather", ""])}, optional={"parameters": anything})})

chat_body = st.fixed_dictionaries({}, optional={
    "model": st.text(max_size=10),
    "messages": st.one_of(st.lists(chat_message, max_size=3), anything),
    "tools": st.one_of(st.lists(st.one_of(function_tool, anything), max_size=2), anything),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), anything,
                             st.just({"type": "function", "function": {"name": "web_search"}})),
    "stream": maybe(st.booleans()),
    "stream_options": maybe(st.just({"include_usage": True})),
    "n": maybe(st.integers(0, 3)),
})

messages_body = st.fixed_dictionaries({}, optional={
    "model": st.text(max_size=10),
    "max_tokens": maybe(st.integers(1, 100)),
    "system": st.one_of(st.text(max_size=10), anything),
    "messages": st.one_of(st.lists(st.fixed_dictionaries({"role": role, "content": st.one_of(
        st.text(max_size=20), st.lists(anything, max_size=2))}), max_size=3), anything),
    "tools": st.one_of(st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.just("web_search_20250305"), "name": st.just("web_search")},
                              optional={"max_uses": anything, "allowed_domains": anything,
                                        "blocked_domains": anything, "user_location": anything}),
        anything), max_size=2), anything),
    "stream": maybe(st.booleans()),
})

responses_body = st.fixed_dictionaries({}, optional={
    "model": st.text(max_size=10),
    "input": st.one_of(st.text(max_size=20), st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["message", "web_search_call", "function_call"])},
                              optional={"role": role, "content": anything, "action": anything, "id": anything}),
        anything), max_size=3), anything),
    "tools": st.one_of(st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["web_search", "web_search_preview"])},
                              optional={"filters": anything, "search_context_size": anything}),
        anything), max_size=2), anything),
    "stream": maybe(st.booleans()),
    "previous_response_id": maybe(st.text(max_size=5)),
    "background": maybe(st.booleans()),
    "include": anything,
})


def encoded(bodies):
    """A body as JSON bytes, mangled a little now and then: cut short, prefixed, or raw bytes."""
    as_json = bodies.map(lambda b: json.dumps({k: v for k, v in b.items() if v is not None}).encode())
    return st.one_of(
        as_json, as_json, as_json,
        st.tuples(as_json, st.integers(0, 50)).map(lambda t: t[0][:t[1]]),
        anything.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64),
        st.sampled_from([b"", b"null", b"[" * 5000, b'{"messages": "\\ud800"}', b"\xef\xbb\xbf{}",
                         b'{"a": NaN}', b'{"messages": [], "n": 1e999}']),
    )


TOKEN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
# Framing headers (Content-Length, Transfer-Encoding, Connection, Host, Expect) are left out:
# they fuzz gunicorn's HTTP parser, not the proxy.
header_name = st.one_of(st.sampled_from(["Authorization", "x-api-key", "Content-Type", "Accept", "anthropic-version",
                                         "OpenAI-Beta", "X-Forwarded-For", "Accept-Encoding", "User-Agent"]),
                        st.text(TOKEN, min_size=1, max_size=12).map(lambda n: "X-" + n))
header_value = st.text(st.characters(codec="latin-1", exclude_categories=("Cc",)), max_size=40).map(str.strip)
headers = st.dictionaries(header_name, header_value, max_size=4)

path_piece = st.text("abcXYZ019-._~%/", min_size=1, max_size=12)
ROUTES = {"/v1/chat/completions": chat_body, "/v1/messages": messages_body,
          "/v1/messages/count_tokens": messages_body, "/v1/responses": responses_body}


@st.composite
def requests(draw):
    target = draw(st.sampled_from(list(ROUTES) + ["other"]))
    if target == "other":
        method = draw(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]))
        target = "/" + draw(path_piece).lstrip("/") + draw(st.sampled_from(["", "?q=1", "?a=%ZZ&b"]))
        body = draw(st.one_of(st.none(), encoded(chat_body)))
    else:
        method, body = "POST", draw(encoded(ROUTES[target]))
    return method, target, body, draw(headers)


# ---- the property -------------------------------------------------------------------------

@pytest.fixture
def fuzz_proxy(start_proxy, backend, searxng, monkeypatch):
    # Its own proxy: the worker pid and the log are this test's alone.
    p = start_proxy(FUZZ="1", MAX_BODY_BYTES="65536", KEEPALIVE_INTERVAL="0.2", SEARXNG_TIMEOUT="2")
    backend.responder = responder
    # The stand-in writes headers and body separately; with Nagle on, each reply waits out a
    # 40 ms delayed ACK. vLLM (uvicorn) sets TCP_NODELAY, so the stand-in may too, for this test.
    monkeypatch.setattr(backend.server.RequestHandlerClass, "disable_nagle_algorithm", True, raising=False)
    return p


@pytest.mark.slow  # a fuzzing budget of hundreds of requests
def test_fuzzed_requests_never_500_nor_crash_the_worker(fuzz_proxy, backend):
    pid = worker_pid(fuzz_proxy)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              derandomize=os.environ.get("FUZZ_RANDOM") != "1",
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(request=requests())
    def one(request):
        method, target, body, hdrs = request
        sent_before = len(backend.received)
        status, _, data = raw_request(fuzz_proxy.url, method, target, body, hdrs, timeout=30)
        repro = f"reproduce: {method} {target} headers={hdrs!r} body={body!r}"
        assert status < 500, f"{status} {data[:300]!r}; {repro}"
        if status >= 400 and len(backend.received) == sent_before:
            # Refused by the proxy itself: an error a client SDK can read (OpenAI's or Anthropic's shape).
            err = json.loads(data)["error"]
            assert isinstance(err["message"], str) and err["message"], repro
        assert worker_pid(fuzz_proxy) == pid, f"the worker was replaced; {repro}"

    one()
    # A crash that gunicorn survived by replacing the worker, or an exception inside a stream
    # (already 200), shows only in the log.
    log = fuzz_proxy.log()
    for bad in ("Traceback", "Exception on", "Worker exiting", "WORKER TIMEOUT"):
        assert bad not in log, f"{bad!r} in {fuzz_proxy.log_path}"
    assert log.count("Booting worker") == 1 and worker_pid(fuzz_proxy) == pid
    assert len(backend.received) > EXAMPLES // 4, "most fuzzed requests should have been relayed"
