"""A raw-socket HTTP/1.1 backend on loopback for the upstream client's connection-reuse tests:
it closes idle keep-alive connections after `keep_alive` seconds as uvicorn does, can read a
request and drop the connection without answering, and records every request it read.

Imported by tests; not run on its own. Unlike scripted_backend.py (http.server), it writes
the exact bytes each test gives it and notes which connection each request came on.
"""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

from .server import SocketStandIn

DROP = object()  # an answer that reads the request, then closes without a byte in reply
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class Seen:
    connection: int    # which accepted connection, counted from 0
    method: str
    path: str
    body: bytes
    late: bool         # arrived after the server had closed its side of an idle connection


class KeepAliveServer(SocketStandIn):
    """Answers the n-th request with answers[n] (raw bytes or DROP), then `default`.

    An idle connection is closed after `keep_alive` seconds, as uvicorn's timeout_keep_alive
    does; it then stays open for reading a moment longer, so a request a client sends on it
    after the close is seen and recorded as late rather than lost.
    """

    def __init__(self, answers=(), keep_alive: float = 5.0, default=DROP):
        self.answers = list(answers)
        self.default = default
        self.keep_alive = keep_alive
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def serve(self, sock, index):
        buf, closed = b"", False
        with sock:
            while True:
                # After its close, the server listens 1 s more for a request sent too late.
                sock.settimeout(1.0 if closed else self.keep_alive)
                what, request, buf = read_request(sock, buf)
                if what == "idle" and not closed:
                    sock.shutdown(socket.SHUT_WR)  # uvicorn's close: the client sees EOF
                    closed = True
                    continue
                if what != "request":
                    return
                method, path, body = request
                with self._lock:
                    self.seen.append(Seen(index, method, path, body, closed))
                    answer = self.answers.pop(0) if self.answers else self.default
                if closed or answer is DROP:
                    return
                sock.sendall(answer)


def read_request(sock, buf: bytes):
    """("request", (method, path, body), rest), or ("eof" | "idle", None, buf)."""
    try:
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                return "eof", None, buf
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = sum(int(v) for n, _, v in (line.partition(":") for line in lines[1:])
                     if n.strip().lower() == "content-length")
        while len(rest) < length:
            data = sock.recv(65536)
            if not data:
                return "eof", None, buf
            rest += data
        return "request", (method, path, rest[:length]), rest[length:]
    except TimeoutError:
        return "idle", None, buf
    except OSError:
        return "eof", None, buf
