#!/usr/bin/env python3
"""Bounded loopback load test of the proxy: N concurrent clients send a mix of plain,
streaming and searching chat requests through real gunicorn to the test stand-ins, and every
answer must be exactly its own. Run with the test venv's python (tests/run.sh builds it), from the repository root:
`python -m scripts.load_test --clients 64 --requests 2000`; tests/test_load.py runs it small.

Each request carries its id; the stand-in vLLM answers with that id (and, for a search, asks
for a query carrying it and checks the tool result it gets back carries it too), so a stream
or a search result delivered to the wrong request shows up as a mismatch, not as luck.
Only 127.0.0.1 is ever contacted; the run stops after --requests requests or --timeout s.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from standins.procfs import backend_connections, children, open_fds, rss_mb
from standins.proxy_process import ProxyProcess
from standins.scripted_backend import Reply, ScriptedBackend
from standins.searxng import SearxngStandIn
from standins.vllm_wire import compact, completion, sse_reply, stream_frames, tool_call

KINDS = ("plain", "stream", "search", "search-stream")
TAG = re.compile(r"req-(\d+) (\S+)")


def expected_answer(rid: int, pad: int) -> str:
    return f"answer-{rid} " + ("abcdefghijklmnop" * (pad // 16 + 1))[:pad]


def make_responder(pad: int, piece: int = 1024):
    """The stand-in vLLM's brain: answers each request from the id in its own prompt."""

    def respond(received):
        body = json.loads(received.body)
        tag = TAG.match(body["messages"][0]["content"])
        assert tag, "every load-test prompt starts with its tag"
        rid, kind = int(tag[1]), tag[2]
        stream = body.get("stream") is True
        tools = [m for m in body["messages"] if m.get("role") == "tool"]
        if kind.startswith("search") and not tools:
            call = tool_call("web_search", {"query": f"q-{rid}"}, call_id=f"call-{rid}")
            if stream:
                return sse_reply(stream_frames(tool_calls=[call], ident=f"chatcmpl-{rid}-1"))
            return Reply(body=compact(completion(tool_calls=[call], ident=f"chatcmpl-{rid}-1")))
        text = expected_answer(rid, pad)
        if tools and (tools[0].get("tool_call_id") != f"call-{rid}" or f"q-{rid}" not in tools[0]["content"]):
            text = f"CROSSTALK in request {rid}: {tools[0]!r:.200}"
        ident = f"chatcmpl-{rid}-{1 + len(tools)}"
        if stream:
            pieces = [text[i:i + piece] for i in range(0, len(text), piece)]
            frames = stream_frames(content=pieces, ident=ident)
            # A pause now and then lets the streams of different requests interleave.
            chunks: list[bytes | float] = []
            for i, f in enumerate(frames):
                chunks.append(f)
                if i % 16 == 15:
                    chunks.append(0.005)
            return Reply(headers=[("Content-Type", "text/event-stream; charset=utf-8")], chunks=chunks)
        return Reply(body=compact(completion(content=text, ident=ident)))

    return respond


@dataclass
class Summary:
    requests: int = 0
    ok: int = 0
    failures: list = field(default_factory=list)
    latencies: list = field(default_factory=list)
    by_kind: dict = field(default_factory=dict)
    elapsed: float = 0.0

    def line(self) -> str:
        lat = sorted(self.latencies) or [0.0]
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
        return (f"{self.ok}/{self.requests} ok in {self.elapsed:.1f} s ({self.requests / max(self.elapsed, 1e-9):.0f} req/s); "
                f"latency ms p50 {p(0.5):.0f} p95 {p(0.95):.0f} max {lat[-1] * 1000:.0f}; "
                f"by kind {self.by_kind}; failures {len(self.failures)}")


def check_one(conn: http.client.HTTPConnection, rid: int, kind: str, pad: int) -> str | None:
    """Send request `rid` and return None if its answer is exactly its own, else why not."""
    stream = kind.endswith("stream")
    body = json.dumps({"model": "foundation", "stream": stream,
                       "messages": [{"role": "user", "content": f"req-{rid} {kind}"}]})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        return f"status {resp.status}: {data[:200]!r}"
    want = expected_answer(rid, pad)
    first_id = f"chatcmpl-{rid}-1"
    if not stream:
        got = json.loads(data)
        text = got["choices"][0]["message"]["content"]
        if text != want:
            return f"wrong answer: {text[:80]!r}"
        if not got["id"].startswith(f"chatcmpl-{rid}-"):
            return f"wrong id {got['id']}"
        return None
    events = [e for e in data.split(b"\n\n") if e.startswith(b"data: ")]
    if events[-1] != b"data: [DONE]" or data.count(b"data: [DONE]") != 1:
        return "stream did not end with exactly one [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    if any("error" in c for c in chunks):
        return f"error event: {chunks[-1]}"
    ids = {c["id"] for c in chunks}
    if ids != {first_id}:
        return f"stream mixes ids {sorted(ids)[:4]}"
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))
    if text != want:
        return f"wrong streamed answer: {text[:80]!r}"
    return None


def run_load(proxy_url: str, clients: int, total: int, pad: int = 4096, timeout: float = 300,
             first_id: int = 0, kinds=KINDS) -> Summary:
    """`total` requests from `clients` keep-alive connections, kinds in rotation."""
    host, port = proxy_url.split("//", 1)[1].split(":")
    summary = Summary()
    lock = threading.Lock()
    next_id = iter(range(first_id, first_id + total))
    deadline = time.monotonic() + timeout

    def client():
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            while time.monotonic() < deadline:
                with lock:
                    rid = next(next_id, None)
                if rid is None:
                    return
                kind = kinds[rid % len(kinds)]
                started = time.monotonic()
                try:
                    why = check_one(conn, rid, kind, pad)
                except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as e:
                    why = f"{type(e).__name__}: {e}"
                    conn.close()
                    conn = http.client.HTTPConnection(host, int(port), timeout=60)
                with lock:
                    summary.requests += 1
                    summary.latencies.append(time.monotonic() - started)
                    summary.by_kind[kind] = summary.by_kind.get(kind, 0) + 1
                    if why is None:
                        summary.ok += 1
                    else:
                        summary.failures.append((rid, kind, why))
        finally:
            conn.close()

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client) for _ in range(clients)]:
            f.result()
    summary.elapsed = time.monotonic() - started
    return summary


def like_real_servers(*standins):
    """Make the stand-ins' sockets behave as vLLM's uvicorn (and SearXNG's server) do under
    load: TCP_NODELAY (else each reply waits out a 40 ms delayed ACK) and a deep listen queue
    (socketserver's 5 overflows when 32 clients connect at once: resets and 1 s SYN retries)."""
    for s in standins:
        s.server.RequestHandlerClass.disable_nagle_algorithm = True
        s.server.socket.listen(2048)


def pool_is_idle(backend: ScriptedBackend, proxy_url: str, pid: int, timeout: float = 10) -> tuple[bool, int]:
    """(True, n) when each of the n connections the proxy still holds to vLLM is an idle
    keep-alive one in its pool: n concurrent slow requests then reuse exactly those n, and
    the count does not grow. A connection stuck in a finished request is not in the pool,
    so the burst would need a new one beside it."""
    port = int(backend.url.rsplit(":", 1)[1])
    n = backend_connections(pid, port)
    if n == 0:
        return True, 0
    saved = backend.responder
    backend.responder = lambda received: Reply(body=b"{}", delay=0.3)
    host, proxy_port = proxy_url.split("//", 1)[1].split(":")

    def one(_):
        conn = http.client.HTTPConnection(host, int(proxy_port), timeout=timeout)
        try:
            conn.request("GET", "/v1/models")
            return conn.getresponse().status
        finally:
            conn.close()

    try:
        with ThreadPoolExecutor(n) as pool:
            statuses = list(pool.map(one, range(n)))
    finally:
        backend.responder = saved
    return statuses == [200] * n and backend_connections(pid, port) == n, n


# ---- the stand-alone run ----------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64, help="concurrent client connections (default 64)")
    ap.add_argument("--requests", type=int, default=1000, help="requests in all (default 1000)")
    ap.add_argument("--pad", type=int, default=4096, help="bytes of answer text per request (default 4096)")
    ap.add_argument("--timeout", type=float, default=600, help="stop sending after this many seconds (default 600)")
    ap.add_argument("--log", default="/tmp/load-test-proxy.log", help="the proxy's log file")
    args = ap.parse_args()

    backend, searxng = ScriptedBackend(), SearxngStandIn()
    like_real_servers(backend, searxng)
    backend.responder = make_responder(args.pad)
    try:
        proxy = ProxyProcess({"BACKEND_URL": backend.url, "SEARXNG_URL": searxng.url}, Path(args.log))
    except BaseException:
        backend.close()
        searxng.close()
        raise
    proc, url = proxy.proc, proxy.url
    try:
        worker = children(proc.pid)[0]
        warm = run_load(url, min(args.clients, 16), 4 * len(KINDS), args.pad, first_id=10**6)
        rss0, fds0 = rss_mb(worker), open_fds(worker)
        summary = run_load(url, args.clients, args.requests, args.pad, args.timeout)
        time.sleep(1)  # client watches notice the end within 0.5 s
        idle_ok, idle = pool_is_idle(backend, url, worker)
        rss1, fds1 = rss_mb(worker), open_fds(worker)
        print(summary.line())
        print(f"warm-up {warm.ok}/{warm.requests} ok; proxy RSS {rss0:.1f} -> {rss1:.1f} MB; "
              f"fds {fds0} -> {fds1}; vLLM connections left open {idle} (all idle in the pool: {idle_ok}); "
              f"searches {len(searxng.requests)}; worker restarted: {children(proc.pid) != [worker]}")
        for rid, kind, why in summary.failures[:20]:
            print(f"  FAIL request {rid} ({kind}): {why}")
        good = (summary.ok == summary.requests == args.requests and idle_ok and children(proc.pid) == [worker])
        return 0 if good else 1
    finally:
        proxy.stop()
        backend.close()
        searxng.close()


if __name__ == "__main__":
    sys.exit(main())
