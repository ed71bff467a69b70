# Run: python3 -m venv /tmp/ht && /tmp/ht/bin/pip install httptools && /tmp/ht/bin/python scripts/bench_http_parse.py
"""Microbenchmark: proxy/upstream.py's hand-written response parsing against httptools (llhttp,
the parser uvicorn uses), both driven the way the proxy drives a backend socket.

Each case is one backend response replayed from memory by a fake socket, either "whole"
(every read gets up to the proxy's 64 KiB) or in small pieces (each read gets at most PIECE
bytes; for the SSE stream also one event per read, as vLLM sends them). A round reads the
head, then the body through read() (JSON) or iter_raw() (streams), checks the bytes, and is
timed with the best of REPEAT runs of NUMBER rounds. The httptools side is a prototype of a
drop-in: a response object with the same iter_raw()/read() shape, fed straight from recv().
"""
from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path

import httptools

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.upstream import Backend, Connection, UpstreamResponse  # noqa: E402

SAMPLES = ROOT / "tests" / "data" / "vllm-0.32-samples"
PIECE = 512
REPEAT = 5
READ = 65536


class ReplaySocket:
    """Returns the scripted reads in order: each recv gets at most one scripted piece."""

    __slots__ = ("pieces", "i")

    def __init__(self, pieces):
        self.pieces, self.i = pieces, 0

    def recv(self, size):
        if self.i == len(self.pieces):
            return b""
        piece = self.pieces[self.i]
        if len(piece) > size:  # a read never returns more than asked: keep the rest
            self.pieces[self.i] = piece[size:]
            return piece[:size]
        self.i += 1
        return piece

    def close(self):
        pass


def split(raw: bytes, size: int) -> list[bytes]:
    return [raw[i:i + size] for i in range(0, len(raw), size)]


# ---- the two readers ------------------------------------------------------------------------

BACKEND = Backend("http://127.0.0.1:9", 1, 5)


def current(pieces, streamed: bool) -> bytes:
    conn = Connection()
    conn.sock = ReplaySocket(list(pieces))
    version, status, headers = Backend._read_head(conn)
    up = UpstreamResponse(BACKEND, conn, version, status, headers, "POST")
    up._backend = _NoPool  # keep the fake socket out of the real pool
    return b"".join(up.iter_raw()) if streamed else up.read()


class _NoPool:
    base_url = "bench"
    read_timeout = 5

    @staticmethod
    def _release(conn):
        pass


class HttptoolsResponse:
    """What upstream.UpstreamResponse would become on httptools: callbacks collect the head
    and the body pieces; each network read is fed once and its body pieces leave together."""

    def __init__(self, sock):
        self.sock = sock
        self.headers = []
        self.body = []
        self.head_done = False
        self.complete = False
        self.parser = httptools.HttpResponseParser(self)
        while not self.head_done:
            data = sock.recv(READ)
            if not data:
                raise ConnectionError("closed inside the head")
            self.parser.feed_data(data)
        self.status = self.parser.get_status_code()

    def on_header(self, name, value):
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self):
        self.head_done = True

    def on_body(self, body):
        self.body.append(body)

    def on_message_complete(self):
        self.complete = True

    def iter_raw(self):
        while True:
            if self.body:
                piece = self.body[0] if len(self.body) == 1 else b"".join(self.body)
                self.body.clear()
                yield piece
            if self.complete:
                return
            data = self.sock.recv(READ)
            if not data:
                raise ConnectionError("closed inside the body")
            self.parser.feed_data(data)

    def read(self):
        return b"".join(self.iter_raw())


def with_httptools(pieces, streamed: bool) -> bytes:
    up = HttptoolsResponse(ReplaySocket(list(pieces)))
    return b"".join(up.iter_raw()) if streamed else up.read()


# ---- the cases --------------------------------------------------------------------------------

def chunked(parts) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


UVICORN_HEAD = b"HTTP/1.1 200 OK\r\ndate: Sat, 22 Aug 2026 10:00:00 GMT\r\nserver: uvicorn\r\n"


def json_case():
    body = (SAMPLES / "chat-with-tools-no-call.json").read_bytes()
    head = UVICORN_HEAD + b"content-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(body)
    return head + body, body, False, None


def sse_case():
    sample = (SAMPLES / "forced-tool-call-stream.sse").read_bytes()
    event = sample.split(b"\n\n")[1] + b"\n\n"
    json.loads(event[6:])  # a real vLLM chunk event
    events = [event] * 199 + [b"data: [DONE]\n\n"]
    head = UVICORN_HEAD + b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
    wire = chunked(events)
    # vLLM flushes each event as it is generated: one chunk per read, the last with "0\r\n\r\n".
    per_event = [head] + [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    per_event[-1] += b"0\r\n\r\n"
    return head + wire, b"".join(events), True, per_event


def mb_case():
    body = bytes(range(256)) * 4096  # 1 MiB
    head = UVICORN_HEAD + b"content-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + chunked(split(body, 8192)), body, True, None


CASES = [("JSON chat completion, Content-Length", json_case),
         ("SSE, 200 events, chunked", sse_case),
         ("1 MiB chunked, 8 KiB chunks", mb_case)]


def best(fn, number: int) -> float:
    """Microseconds per round, best of REPEAT."""
    return min(timeit.repeat(fn, number=number, repeat=REPEAT)) / number * 1e6


def main():
    print(f"httptools {httptools.__version__}, Python {sys.version.split()[0]}; "
          f"us per response, best of {REPEAT}\n")
    print(f"| case | fed | current (us) | httptools (us) | current / httptools |")
    print("| --- | --- | ---: | ---: | ---: |")
    for title, make in CASES:
        raw, body, streamed, per_event = make()
        feeds = [("whole", [raw]), (f"{PIECE} B pieces", split(raw, PIECE))]
        if per_event:
            feeds.insert(1, ("one event per read", per_event))
        for fed, pieces in feeds:
            for reader in (current, with_httptools):
                assert reader(pieces, streamed) == body, (title, fed, reader.__name__)
            number = max(20, int(2e6 / len(raw)))
            a = best(lambda: current(pieces, streamed), number)
            b = best(lambda: with_httptools(pieces, streamed), number)
            print(f"| {title} | {fed} | {a:.1f} | {b:.1f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
