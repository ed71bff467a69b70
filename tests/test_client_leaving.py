"""A client that hangs up in the middle of a search loop, on every API plain and streamed, seen
from the stand-ins' side: vLLM's work for it stops, no turn starts for it, and nothing it
leaves behind touches another client's request (issue 18).

Run: tests/run.sh tests/test_client_leaving.py
"""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from test_faults import access_lines, post_raw, read_until, wait_for_log

from standins import anthropic_wire as A
from standins import responses_wire as R
from standins.scripted_backend import Reply
from standins.vllm_wire import completion, json_reply, sse_reply, stream_frames, tool_call

SLOW = 30      # seconds a stalled vLLM turn would take: only an abort ends it sooner
SEARCH = 0.5   # seconds the slow SearXNG takes to answer
ASK = [{"role": "user", "content": "What is new in vLLM?"}]


@dataclass(frozen=True)
class Api:
    """How these tests speak one API: its target, a searching body, and vLLM's two turns."""
    target: str
    body: Callable[[bool], dict]
    search: Callable[[dict, str], Reply]    # (the request vLLM got, query) -> the searching turn
    answer: Callable[[dict], Reply]         # the request vLLM got -> the answering turn
    opening: bytes                          # the first bytes a streamed answer shows the client


def _responses(request, items):
    return R.answer(request, items)


APIS = {
    "chat": Api(
        "/v1/chat/completions",
        lambda stream: {"model": "foundation", "messages": ASK, "stream": stream},
        lambda req, q: (sse_reply(stream_frames(tool_calls=[tool_call("web_search", {"query": q})])) if req.get("stream")
                        else json_reply(completion(tool_calls=[tool_call("web_search", {"query": q})]))),
        lambda req: (sse_reply(stream_frames(content=["all ", "done"])) if req.get("stream")
                     else json_reply(completion(content="all done"))),
        b'"role":"assistant"'),
    "messages": Api(
        "/v1/messages",
        lambda stream: {"model": "foundation", "max_tokens": 50, "messages": ASK, "stream": stream,
                        "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        lambda req, q: (A.stream_reply if req.get("stream") else A.message_reply)([A.tool_use("web_search", {"query": q})]),
        lambda req: (A.stream_reply if req.get("stream") else A.message_reply)([A.text(["all ", "done"])]),
        b"event: message_start"),
    "responses": Api(
        "/v1/responses",
        lambda stream: {"model": "foundation", "input": "What is new in vLLM?", "stream": stream,
                        "tools": [{"type": "web_search"}]},
        lambda req, q: _responses(req, [R.call("web_search", {"query": q})]),
        lambda req: _responses(req, [R.message("all done")]),
        b"event: response.created"),
}


def serve(backend, *turns):
    """Answer the search loop's requests in order, each built from the request vLLM got."""
    queue = list(turns)

    def respond(received):
        return queue.pop(0)(received.json()) if queue else None
    backend.responder = respond


def stalled(make, stream: bool):
    """The turn, but vLLM stalls: before its first byte (plain: a long prefill), or after its
    first event (a stream mid-generation)."""
    def turn(request):
        reply = make(request)
        if stream:
            reply.chunks.insert(1, SLOW)
        else:
            reply.delay = SLOW
        return reply
    return turn


def prefill(make):
    def turn(request):
        reply = make(request)
        reply.delay = SLOW
        return reply
    return turn


def logged(proxy, seen: int, count: int) -> list[tuple[str, str]]:
    """(path, status) of the `count` requests the access log shows after its first `seen` lines."""
    log = wait_for_log(proxy, lambda text: len(access_lines(text)) >= seen + count, timeout=10)
    return sorted((a[1], a[2]) for a in access_lines(log)[seen:])


@pytest.mark.parametrize("moment", ["before", "during", "after"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("api", list(APIS))
def test_client_leaving_a_search_loop(proxy, backend, searxng, api, stream, moment):
    """Before the search (vLLM is on turn 1), during it (SearXNG is slow) or after it (vLLM
    is on turn 2): vLLM's current turn is cut, and no turn starts once the client has gone."""
    a = APIS[api]
    searxng.behave("slow", "slow", seconds=SEARCH)
    def first(req):
        return a.search(req, "slow")

    if moment == "before":
        first = stalled(first, stream)
    serve(backend, first, prefill(a.answer) if moment == "after" else a.answer)
    seen = len(access_lines(proxy.log()))

    s = post_raw(proxy, a.target, a.body(stream))
    if moment == "before":
        if stream:
            assert a.opening in read_until(s, a.opening)
        else:
            assert backend.wait_for(lambda b: len(b.received) == 1, 10)
    elif moment == "during":
        deadline = time.monotonic() + 10
        while not searxng.requests:
            assert time.monotonic() < deadline, "the search never started"
            time.sleep(0.02)
    else:
        assert backend.wait_for(lambda b: len(b.received) == 2, 10)
    s.close()

    # The access line is written once the request's loop has ended, so from then on no turn can start.
    # A plain request that lost its client ends as nginx's "client closed" (499); a stream had
    # already answered 200.
    assert logged(proxy, seen, 1) == [(a.target, "200" if stream else "499")]
    if moment == "during":
        assert len(backend.received) == 1, "no turn may start for a client that left"
        assert backend.hangups == []
    else:
        turn = 0 if moment == "before" else 1
        assert backend.wait_for(lambda b: b.hangups == [turn], 5), "vLLM must see its turn cut"
        assert len(backend.received) == turn + 1
    assert searxng.queries == ([] if moment == "before" else ["slow"])


WORDS = [f"w{i} " for i in range(20)]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("api", list(APIS))
def test_a_departing_client_never_cuts_another_clients_stream(start_proxy, backend, searxng, api, stream):
    """Client A searches; its first turn's vLLM connection went back to the pool and client
    B's stream rides it now. A hangs up: B's stream must go on to its clean end."""
    p = start_proxy(KEEPALIVE_INTERVAL="0.2", PROXY_WORKER_CONNECTIONS="990")  # a pool of its own
    a = APIS[api]
    searxng.behave("slow", "slow", seconds=2 * SEARCH)
    b_reply = sse_reply(stream_frames(content=WORDS), gap=0.05)
    serve(backend, lambda req: a.search(req, "slow"), lambda req: b_reply, a.answer)
    seen = len(access_lines(p.log()))

    client_a = post_raw(p, a.target, a.body(stream))
    deadline = time.monotonic() + 10
    while not searxng.requests:  # A is searching: its first turn was read to its end
        assert time.monotonic() < deadline, "A's search never started"
        time.sleep(0.02)
    opened = backend.accepted
    got = {}

    def run_b():
        u = urllib.parse.urlsplit(p.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=15)
        conn.request("POST", "/v1/chat/completions", json.dumps({"model": "foundation", "messages": ASK, "stream": True}),
                     {"Content-Type": "application/json"})
        got["raw"] = conn.getresponse().read()
        conn.close()

    reader = threading.Thread(target=run_b)
    reader.start()
    assert backend.wait_for(lambda b: len(b.received) == 2, 10)
    time.sleep(0.2)  # B is a few words in
    client_a.close()
    reader.join(20)

    raw = got["raw"]
    assert b'"error"' not in raw and raw.endswith(b"data: [DONE]\n\n"), raw[-300:]
    chunks = [json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "".join(WORDS)
    # B rode A's connection, as in the bug report: no new one was opened for it, and the pool
    # hands out the connection returned last.
    assert backend.accepted == opened
    # Both requests logged: A's loop has ended, and no third turn was asked for.
    assert logged(p, seen, 2) == sorted([(a.target, "200" if stream else "499"), ("/v1/chat/completions", "200")])
    assert [r.path for r in backend.received] == [a.target, "/v1/chat/completions"]
    assert backend.hangups == []
