"""A scripted stand-in for vLLM on loopback: each request gets the next reply the test
queued (status, headers, a body or a paced list of chunks), and everything it received and
every client hang-up is recorded for the test to assert on.

Used from tests/conftest.py (`backend` fixture); it answers nothing it was not told to, so a
test can never pass on a reply it did not script. The wire helpers for vLLM's exact shapes
are in vllm_wire.py beside it.
"""
from __future__ import annotations

import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field

from .server import QuietHandler, StandInServer


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: list = field(default_factory=lambda: [("Content-Type", "application/json")])
    # For a chunked (streamed) reply: bytes are sent as one chunk each; a number sleeps that
    # many seconds (watching for the client to hang up meanwhile).
    chunks: list | None = None
    delay: float = 0.0          # seconds to wait before answering at all
    path: str | None = None     # if set, only a request to this path may take this reply
    drop: bool = False          # close the connection after the chunks, without the final chunk


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)


class ScriptedBackend(StandInServer):
    def __init__(self):
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self.hangups: list[int] = []       # indexes into received whose client left early
        self.open_connections = 0
        self.accepted = 0                  # connections ever opened to it (never reset)
        # Called as responder(received) -> Reply when no queued reply fits: for clients such as
        # Claude Code whose exact request sequence a test can't queue up front.
        self.responder = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        super().__init__()

    def reset(self):
        with self._lock:
            self.replies.clear()
            self.received.clear()
            self.responder = None
            self.hangups.clear()

    def script(self, *replies: Reply):
        with self._lock:
            self.replies.extend(replies)

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        """Block until predicate(self) holds (e.g. a hang-up was seen); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _take(self, path: str) -> Reply | None:
        with self._lock:
            for i, r in enumerate(self.replies):
                if r.path is None or r.path == path:
                    return self.replies.pop(i)
        return None

    def handler(self):
        outer = self

        class Handler(QuietHandler):
            def setup(self):
                super().setup()
                with outer._changed:
                    outer.open_connections += 1
                    outer.accepted += 1
                    outer._changed.notify_all()

            def finish(self):
                try:
                    super().finish()
                finally:
                    with outer._changed:
                        outer.open_connections -= 1
                        outer._changed.notify_all()

            def _client_gone(self, seconds: float) -> bool:
                """Sleep `seconds`, returning early (True) if the peer closed meanwhile."""
                end = time.monotonic() + seconds
                while True:
                    left = end - time.monotonic()
                    if left <= 0:
                        return False
                    r, _, _ = select.select([self.connection], [], [], min(left, 0.05))
                    if r:
                        try:
                            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                                return True
                        except OSError:
                            return True
                        time.sleep(min(left, 0.05))

            def _record_hangup(self, index):
                with outer._changed:
                    outer.hangups.append(index)
                    outer._changed.notify_all()

            def handle_one(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path, _, query = self.path.partition("?")
                with outer._changed:
                    outer.received.append(Received(self.command, path, query,
                                                   {k.lower(): v for k, v in self.headers.items()}, body))
                    index = len(outer.received) - 1
                    outer._changed.notify_all()
                reply = outer._take(path)
                if reply is None and outer.responder is not None:
                    reply = outer.responder(outer.received[index])
                if reply is None:
                    reply = Reply(status=500, body=json.dumps({"error": {
                        "message": f"stand-in: no scripted reply for {self.command} {path}",
                        "type": "InternalServerError", "param": None, "code": 500}}).encode())
                if reply.delay and self._client_gone(reply.delay):
                    self._record_hangup(index)
                    self.close_connection = True
                    return
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers:
                        self.send_header(name, value)
                    if reply.chunks is None:
                        self.send_header("Content-Length", str(len(reply.body)))
                        self.end_headers()
                        if self.command != "HEAD":
                            self.wfile.write(reply.body)
                        return
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for piece in reply.chunks:
                        if isinstance(piece, (int, float)):
                            if self._client_gone(piece):
                                raise BrokenPipeError("client left during a pause")
                            continue
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                    if reply.drop:
                        self.close_connection = True
                        return
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self._record_hangup(index)
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = handle_one

        return Handler
