# Run from the repository root: /tmp/ht/bin/python -m scripts.bench_http_parse [--against GIT_REV], with /tmp/ht made by: python3 -m venv /tmp/ht && /tmp/ht/bin/pip install httptools
"""Microbenchmark: proxy/upstream.py as checked out (httptools, llhttp) against the hand-written
response parser it replaced, read from git at --against, both driven end to end alike.

Each case is one backend response replayed from memory by a fake socket pooled in a Backend,
either "whole" (every read gets up to the proxy's 64 KiB) or in small pieces (each read gets
at most PIECE bytes; for the SSE stream also one event per read, as vLLM sends them). A round
is Backend.request() (the pool's look before reuse, the head), then the body through read()
(JSON) or iter_raw() (streams), checked against the expected bytes; each side is timed as the
best of REPEAT runs, the two sides' runs taken in turn. Compare the columns of one run only.
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import timeit
import types
from pathlib import Path

from proxy.transport import vllm as upstream

ROOT = Path(__file__).resolve().parent.parent

SAMPLES = ROOT / "tests" / "data" / "vllm-0.32-samples"
# The last commit whose proxy/upstream.py parsed responses by hand (issue 18's fixes included).
HAND_WRITTEN = "5a44106"
PIECE = 512
REPEAT = 9


class ReplaySocket:
    """A pooled connection replaying scripted reads: each recv gets at most one piece. Its
    fileno is a real idle socket, so the pool's readability look finds it quiet."""

    def __init__(self, pieces, quiet):
        self.pieces, self.i, self.quiet = pieces, 0, quiet

    def fileno(self):
        return self.quiet.fileno()

    def sendall(self, _data):
        pass

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


def load_revision(rev: str) -> types.ModuleType:
    # The vLLM client moved from proxy/upstream.py to proxy/transport/vllm.py with the layers; older revisions
    # have it at the old path.
    for path in ("proxy/transport/vllm.py", "proxy/upstream.py"):
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"bench_http_parse: no vLLM client at revision {rev}")
    module = types.ModuleType(f"upstream_at_{rev}")
    exec(compile(shown.stdout, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102
    return module


def runner(module, pieces, streamed: bool):
    """One round's function: a Backend of `module` with a pooled replay of `pieces`."""
    backend = module.Backend("http://127.0.0.1:9", 1, 5)
    pair = socket.socketpair()  # its idle end stands for a quiet connection; one_round keeps both alive

    def one_round() -> bytes:
        conn = module.Connection()
        conn.sock = ReplaySocket(list(pieces), pair[0])
        backend._idle[:] = []
        backend._release(conn)
        up = backend.request("POST", "/v1/chat/completions", b"{}", [])
        return b"".join(up.iter_raw()) if streamed else up.read()
    return one_round


# ---- the cases --------------------------------------------------------------------------------

def chunked(parts) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def split(raw: bytes, size: int) -> list[bytes]:
    return [raw[i:i + size] for i in range(0, len(raw), size)]


UVICORN_HEAD = b"HTTP/1.1 200 OK\r\ndate: Sat, 22 Aug 2026 10:00:00 GMT\r\nserver: uvicorn\r\n"


def json_case():
    body = (SAMPLES / "chat-with-tools-no-call.json").read_bytes()
    head = UVICORN_HEAD + b"content-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(body)
    return head + body, body, False, None


def sse_case():
    event = (SAMPLES / "forced-tool-call-stream.sse").read_bytes().split(b"\n\n")[1] + b"\n\n"
    events = [event] * 199 + [b"data: [DONE]\n\n"]
    head = UVICORN_HEAD + b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
    # vLLM flushes each event as it is generated: one chunk per read, the last with "0\r\n\r\n".
    per_event = [head] + [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    per_event[-1] += b"0\r\n\r\n"
    return head + chunked(events), b"".join(events), True, per_event


def mb_case():
    body = bytes(range(256)) * 4096  # 1 MiB
    head = UVICORN_HEAD + b"content-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + chunked(split(body, 8192)), body, True, None


CASES = [("JSON chat completion, Content-Length", json_case),
         ("SSE, 200 events, chunked", sse_case),
         ("1 MiB chunked, 8 KiB chunks", mb_case)]


def best_pair(a, b, number: int) -> tuple[float, float]:
    """Microseconds per round of each, best of REPEAT runs taken in turn, so the machine's
    drift weighs on both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(REPEAT):
        for fn, out in zip((a, b), times, strict=True):
            out.append(timeit.timeit(fn, number=number) / number * 1e6)
    return min(times[0]), min(times[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", default=HAND_WRITTEN, help=f"git revision to compare with (default {HAND_WRITTEN})")
    args = ap.parse_args()
    old = load_revision(args.against)
    print(f"Python {sys.version.split()[0]}; us per response, best of {REPEAT}; "
          f"'{args.against}' is proxy/upstream.py at that revision\n")
    print(f"| case | fed | {args.against} (us) | checked out (us) | {args.against} / checked out |")
    print("| --- | --- | ---: | ---: | ---: |")
    for title, make in CASES:
        raw, body, streamed, per_event = make()
        feeds = [("whole", [raw]), (f"{PIECE} B pieces", split(raw, PIECE))]
        if per_event:
            feeds.insert(1, ("one event per read", per_event))
        for fed, pieces in feeds:
            a, b = runner(old, pieces, streamed), runner(upstream, pieces, streamed)
            assert a() == body and b() == body, (title, fed)
            number = max(20, int(2e6 / len(raw)))
            ta, tb = best_pair(a, b, number)
            print(f"| {title} | {fed} | {ta:.1f} | {tb:.1f} | {ta / tb:.2f} |")


if __name__ == "__main__":
    main()
