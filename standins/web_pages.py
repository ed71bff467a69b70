"""A stand-in web site on loopback for web_fetch tests: each path answers what the test set with
`site.route(path, ...)` (status, headers, body, a stall), over HTTP or, given a certificate, HTTPS.

Used from tests/test_fetch.py; every request is recorded (`site.requests`) with its path and headers.
"""
from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass, field

from .server import QuietHandler, StandInServer


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=lambda: {"Content-Type": "text/html; charset=utf-8"})
    stall: float = 0.0           # seconds to wait after the head, before the body
    drip: float = 0.0            # seconds between single body bytes (a slow server)


@dataclass
class Seen:
    path: str
    headers: dict


class WebSite(StandInServer):
    def __init__(self, certfile: str | None = None, keyfile: str | None = None, host: str = "127.0.0.1"):
        # host "0.0.0.0" for the container tier: the proxy's container reaches it over Docker's bridge.
        self.routes: dict[str, Route] = {}
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        ctx = None
        if certfile:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(certfile, keyfile)
        super().__init__(host, ssl_context=ctx)

    def route(self, path: str, body: bytes | str = b"", status: int = 200, headers: dict | None = None, **kw) -> None:
        body = body.encode() if isinstance(body, str) else body
        with self._lock:
            self.routes[path] = Route(status, body, {"Content-Type": "text/html; charset=utf-8"} if headers is None else headers, **kw)

    def reset(self) -> None:
        with self._lock:
            self.routes.clear()
            self.requests.clear()

    def handler(self):
        site = self

        class Handler(QuietHandler):
            def do_GET(self):
                with site._lock:
                    site.requests.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}))
                    route = site.routes.get(self.path) or Route(404, b"not found", {"Content-Type": "text/plain"})
                self.send_response(route.status)
                for name, value in route.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(route.body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.flush()
                try:
                    if route.stall:
                        time.sleep(route.stall)
                    if route.drip:
                        for i in range(len(route.body)):
                            self.wfile.write(route.body[i:i + 1])
                            self.wfile.flush()
                            time.sleep(route.drip)
                    else:
                        self.wfile.write(route.body)
                except OSError:
                    pass  # the fetcher hung up (byte cap, timeout): what the test wanted
                self.close_connection = True

        return Handler
