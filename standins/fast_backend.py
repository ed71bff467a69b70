"""A fast gevent stand-in for vLLM and SearXNG on loopback, for scripts/proxy_overhead.py (not for tests): run `python -m standins.fast_backend` from the repository root; it prints `backend=URL searxng=URL` on its first line and serves until killed.

Why not ScriptedBackend: a ThreadingHTTPServer spends more per request than the proxy under
test, and a thread per stream would itself be the bottleneck at 64 paced streams. Here every
connection is a greenlet with a hand-rolled HTTP/1.1 loop and prebuilt replies, so the
direct figures are as close to the wire's own cost as Python allows.

The client picks the reply with headers, which the proxy passes on unchanged (also on the
follow-up turns of a search loop): `X-Bench-Mode: plain | stream | search`, and for a stream
`X-Bench-Chunks: N` (events in total) and `X-Bench-Gap: S` (seconds between events, 0 for
unpaced). Replies use vLLM 0.32's wire shapes from vllm_wire.py so the proxy parses what it
would really parse.
"""
from __future__ import annotations

import argparse
import json
import socket

import gevent
from gevent.server import StreamServer

from . import anthropic_wire, responses_wire
from .searxng import page, result
from .vllm_wire import compact, completion, stream_frames, tool_call

# Headers uvicorn (vLLM's server) sends, so the proxy copies as many as it would in production.
JSON_HEAD = (b"HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 05:00:00 GMT\r\nserver: uvicorn\r\n"
             b"content-type: application/json\r\ncontent-length: %d\r\n\r\n")
SSE_HEAD = (b"HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 05:00:00 GMT\r\nserver: uvicorn\r\n"
            b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")

PLAIN = compact(completion(content="Hello! The proxy relayed this answer untouched.", ident="chatcmpl-bench"))
FINAL = compact(completion(content="Here is what the searches found.", ident="chatcmpl-bench-final"))
# A plain answer on the other APIs' paths, in their own shapes, so the proxy's Messages and Responses loops parse a
# final turn as they would vLLM's (scripts/proxy_overhead_sizes.py sends their requests).
PLAIN_BY_PATH = {
    b"/v1/messages": compact(anthropic_wire.message([anthropic_wire.text("Hello from the stand-in.")],
                                                     ident="msg-bench")),
    b"/v1/responses": compact(responses_wire.body({}, [responses_wire.message("Hello from the stand-in.")],
                                                  ident="resp-bench")),
}
_frame_cache: dict[int, list[bytes]] = {}


def frames(n: int) -> list[bytes]:
    """n SSE events in total: role, n-3 content tokens, finish, [DONE]; each its own HTTP chunk."""
    if n not in _frame_cache:
        events = stream_frames(content=[" tok"] * max(0, n - 3), ident="chatcmpl-bench-stream")
        _frame_cache[n] = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    return _frame_cache[n]


def search_turn(body: bytes, searches: int) -> bytes:
    """A web_search call until `searches` tool results are in the history, then an answer.

    Each query differs so the proxy's repeated-query memory never short-cuts a search.
    """
    done = sum(1 for m in json.loads(body).get("messages", []) if m.get("role") == "tool")
    if done >= searches:
        return FINAL
    call = tool_call("web_search", {"query": f"bench query {done + 1}"}, call_id=f"call-{done + 1}")
    return compact(completion(tool_calls=[call], ident=f"chatcmpl-bench-search-{done + 1}"))


def searxng_page(target: bytes) -> bytes:
    from urllib.parse import parse_qs, urlsplit
    q = parse_qs(urlsplit(target.decode()).query).get("q", [""])[0]
    return json.dumps(page(q, [result(f"https://example.org/{i}", f"{q} — result {i}", f"Snippet {i} about {q}.")
                               for i in range(1, 6)])).encode()


def read_request(sock, buf: bytearray):
    """One request off a keep-alive connection: (method, target, headers, body) or None at EOF."""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        data = sock.recv(262144)
        if not data:
            return None
        buf += data
    head = bytes(buf[:end]).split(b"\r\n")
    del buf[:end + 4]
    method, target, _ = head[0].split(b" ", 2)
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get(b"content-length", b"0"))
    while len(buf) < length:
        data = sock.recv(max(262144, length - len(buf)))
        if not data:
            return None
        buf += data
    body = bytes(buf[:length])
    del buf[:length]
    return method, target, headers, body


def keep_alive(answer):
    """A StreamServer handler: read requests off one keep-alive connection and answer(sock, request) each."""
    def serve(sock, _addr):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        try:
            while (req := read_request(sock, buf)) is not None:
                answer(sock, req)
        except OSError:
            return  # the client (or the proxy's abort) hung up: nothing to clean up
        finally:
            sock.close()
    return serve


def answer_backend(sock, req) -> None:
    _method, target, headers, body = req
    mode = headers.get(b"x-bench-mode", b"plain")
    if mode == b"stream":
        chunks = frames(int(headers.get(b"x-bench-chunks", b"200")))
        gap = float(headers.get(b"x-bench-gap", b"0"))
        sock.sendall(SSE_HEAD + chunks[0])
        for c in chunks[1:]:
            if gap:
                gevent.sleep(gap)
            # One send per event, as vLLM writes one per token: the proxy gets
            # whatever coalescing loopback gives, never an artificially big read.
            sock.sendall(c)
        sock.sendall(b"0\r\n\r\n")
        return
    if mode == b"search":
        reply = search_turn(body, int(headers.get(b"x-bench-searches", b"2")))
    else:
        reply = PLAIN_BY_PATH.get(target.split(b"?", 1)[0], PLAIN)
    sock.sendall(JSON_HEAD % len(reply) + reply)


def answer_searxng(sock, req) -> None:
    reply = searxng_page(req[1])
    sock.sendall(JSON_HEAD % len(reply) + reply)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--searxng-port", type=int, default=0)
    args = ap.parse_args()
    # backlog: 64 streams plus the benchmark's keep-alive connections connect at once.
    backend = StreamServer((args.host, args.port), keep_alive(answer_backend), backlog=1024)
    searx = StreamServer((args.host, args.searxng_port), keep_alive(answer_searxng), backlog=1024)
    backend.start()
    searx.start()
    print(f"backend=http://{args.host}:{backend.server_port} searxng=http://{args.host}:{searx.server_port}", flush=True)
    gevent.wait()


if __name__ == "__main__":
    main()
