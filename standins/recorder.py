"""A recording relay on loopback: every request a client sends is kept exactly as it arrived
(method, target, headers in order and case, body) and then forwarded to `upstream` (the proxy)
or answered by `responder`, with the answer streamed back chunk by chunk as it comes.

Used by scripts/capture_agent_wire.py to capture what Claude Code and Codex put on the wire,
and by tests that must see a client's own request before the proxy rewrites it.
"""
from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from dataclasses import dataclass

from .server import QuietHandler, StandInServer

# Headers that describe one hop, not the request; the relay sets its own.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                        "proxy-connection", "host", "content-length"})


@dataclass
class Recorded:
    method: str
    target: str                 # path and query exactly as sent
    headers: list               # [(name, value)] in the client's order and case
    body: bytes
    status: int | None = None   # what the client was answered
    response: bytes | None = None  # the answer's body, kept when it is JSON (not a stream)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)

    def json(self):
        return json.loads(self.body)

    def as_dict(self) -> dict:
        """A JSON-ready record: the body parsed when it is JSON, else as text."""
        try:
            body = self.json() if self.body else None
        except ValueError:
            body = self.body.decode("utf-8", "replace")
        out = {"method": self.method, "target": self.target, "headers": self.headers, "body": body,
               "status": self.status}
        if self.response is not None:
            try:
                out["response"] = json.loads(self.response)
            except ValueError:
                out["response"] = self.response.decode("utf-8", "replace")
        return out


class Recorder(StandInServer):
    def __init__(self, upstream: str | None = None, responder=None):
        """upstream: base URL to forward to; responder(recorded) -> (status, headers, body) otherwise."""
        self.upstream = urllib.parse.urlsplit(upstream) if upstream else None
        self.responder = responder
        self.received: list[Recorded] = []
        self._lock = threading.Lock()
        super().__init__()

    def handler(self):
        outer = self

        class Handler(QuietHandler):
            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def handle_one(self):
                rec = Recorded(self.command, self.path, list(self.headers.items()), self._read_body())
                with outer._lock:
                    outer.received.append(rec)
                if outer.upstream is None:
                    status, headers, body = outer.responder(rec)
                    rec.status = status
                    self.send_response(status)
                    for n, v in headers:
                        self.send_header(n, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._forward(rec, outer.upstream)

            def _forward(self, rec: Recorded, up: urllib.parse.SplitResult):
                conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=120)
                try:
                    headers = {n: v for n, v in rec.headers if n.lower() not in HOP_BY_HOP}
                    conn.request(rec.method, up.path.rstrip("/") + rec.target, body=rec.body or None, headers=headers)
                    resp = conn.getresponse()
                    rec.status = resp.status
                    self.send_response(resp.status)
                    for n, v in resp.getheaders():
                        if n.lower() not in HOP_BY_HOP:
                            self.send_header(n, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    kept: list[bytes] | None = [] if "json" in (resp.getheader("Content-Type") or "") else None
                    while True:
                        piece = resp.read1(65536)
                        if not piece:
                            break
                        if kept is not None:
                            kept.append(piece)
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    if kept is not None:
                        rec.response = b"".join(kept)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = handle_one

        return Handler
