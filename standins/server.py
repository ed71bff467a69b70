"""The scaffolding every in-process stand-in server shares: a server on a loopback port the kernel picks, served by
daemon threads, with `.url`, `.close()` and `with`; subclass StandInServer (http.server) or SocketStandIn (raw socket).

Daemon threads everywhere: a test that forgets to close a stand-in must not keep pytest from exiting.
"""
from __future__ import annotations

import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """The request handler every HTTP stand-in starts from: HTTP/1.1 keep-alive, as the servers it stands for speak,
    and no access line per request on the test's stderr."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass


class StandInServer:
    """A ThreadingHTTPServer serving `self.handler()` in a daemon thread.

    Subclasses set up their own state first and call `super().__init__()` last: it starts serving at once (unless
    start=False), and a request may arrive before __init__ returns. `start()` after `close()` serves again on the
    same port, as a server that comes back up would (the Hub stand-in's restarts rely on it).
    """

    #: serve_forever's poll interval: how long close() may wait for the serving thread to notice.
    poll_interval = 0.5

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, ssl_context: ssl.SSLContext | None = None,
                 start: bool = True):
        self.host = host  # "0.0.0.0" or a bridge address for the container tier, whose containers must reach it
        self.port = port  # 0 until the first start picks one
        self.ssl_context = ssl_context
        self.server: ThreadingHTTPServer | None = None
        self.url = self._url()
        if start:
            self.start()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def start(self) -> None:
        server = ThreadingHTTPServer((self.host, self.port), self.handler())
        server.daemon_threads = True
        if self.ssl_context is not None:
            server.socket = self.ssl_context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self.url = self._url()
        self.server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": self.poll_interval},
                         daemon=True).start()

    def _url(self) -> str:
        # An attribute, not a property: tests name the site as a client will reach it (e.g. 127.0.0.1 for 0.0.0.0).
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self):
        if self.server is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SocketStandIn:
    """A listening socket whose every connection is served by `self.serve(conn, index)` in a daemon thread of its
    own, for stand-ins that must write bytes http.server would not (index: the connection's number, from 0)."""

    def __init__(self, host: str = "127.0.0.1"):
        self.accepted = 0  # connections ever accepted
        self._sock = socket.create_server((host, 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name=type(self).__name__).start()

    def serve(self, conn: socket.socket, index: int) -> None:
        raise NotImplementedError

    @staticmethod
    def read_head(conn: socket.socket) -> bytes | None:
        """A request's head, up to and including its blank line (at most 64 KiB read), or None when the client
        closed first; the socket's timeout bounds each receive."""
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            data = conn.recv(4096)
            if not data:
                return None
            head += data
        return head

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            index, self.accepted = self.accepted, self.accepted + 1  # only this thread writes it
            threading.Thread(target=self.serve, args=(conn, index), daemon=True).start()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
