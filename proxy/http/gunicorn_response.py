"""gunicorn's response writer with one change: a response's status line and headers leave in
the same send as its first body bytes, and a bound on how long a client may take none of them. Installed by
gunicorn.conf.py in every worker; not run on its own.

gunicorn 27 sends the head and then each body piece as separate writes, so a client wakes
twice before it sees a streamed answer's first event. scripts/proxy_overhead.py measured the
time to first event 0.4-0.6 ms lower with one write (2-CPU machine, loopback). The bytes on
the wire are the same; only their grouping into writes changes.

A client that stops reading (its socket's buffers full) would hold its call to vLLM, and its seat on the card,
for as long as its socket stays open: a write that makes no progress for CLIENT_WRITE_TIMEOUT seconds ends the
response as a hang-up does (EPIPE: gunicorn closes the connection quietly and the app's body is closed, which ends
the call to vLLM and gives the seat back). Only body writes carry the bound; reading requests keeps gunicorn's own.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket

from gunicorn.http import wsgi

from proxy.core.config import Config

log = logging.getLogger("proxy")

# Past this, joining head and body would copy a big body just to save one small write.
JOIN_LIMIT = 65536


class OneWriteResponse(wsgi.Response):
    """gunicorn's Response, holding the head until the first body bytes go out."""

    _head = b""
    headers_sent: bool  # gunicorn's own attribute (it ships no type information)

    def send_headers(self):
        # gunicorn's own send_headers without the send: the bytes wait for _emit_body.
        if self.headers_sent:
            return
        # A fixed send buffer instead of Linux's autotuned one (up to tcp_wmem's 4 MiB, which a stream takes minutes
        # to fill): a client that reads nothing blocks the writes, and so meets WRITE_TIMEOUT, after SEND_BUFFER
        # bytes (the kernel doubles the figure). Still far above what a LAN or a 100 ms link needs for full speed.
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        tosend = self.default_headers()
        tosend.extend("%s: %s\r\n" % (k, v) for k, v in self.headers)
        self._head = ("%s\r\n" % "".join(tosend)).encode("latin-1")
        self.headers_sent = True

    def _emit_body(self, data):
        if self.chunked:
            data = b"%X\r\n%s\r\n" % (len(data), data)
        head, self._head = self._head, b""
        if head and len(data) <= JOIN_LIMIT:
            self._send(head + data)
            return
        if head:
            self._send(head)
        self._send(data)

    def _send(self, data: bytes) -> None:
        """sendall, given up after WRITE_TIMEOUT seconds without the client taking the bytes."""
        previous = self.sock.gettimeout()
        self.sock.settimeout(WRITE_TIMEOUT)
        try:
            self.sock.sendall(data)
        except TimeoutError:
            log.warning("client read nothing of its answer for %.0f s (CLIENT_WRITE_TIMEOUT): hanging up",
                        WRITE_TIMEOUT)
            raise BrokenPipeError(errno.EPIPE, "the client stopped reading") from None
        finally:
            self.sock.settimeout(previous)

    def write(self, arg):
        super().write(arg)
        # No body bytes went out (an empty piece, or a HEAD answer): the head still must, now,
        # as gunicorn would have sent it.
        self._flush_head()

    def can_sendfile(self):
        return False  # sendfile() writes the head itself; the proxy never serves files

    def close(self):
        if not self.headers_sent:
            self.send_headers()
        head, self._head = self._head, b""
        if self.chunked:
            self._send(head + b"0\r\n\r\n")
        elif head:
            self._send(head)

    def _flush_head(self):
        head, self._head = self._head, b""
        if head:
            self._send(head)


WRITE_TIMEOUT = 30.0  # CLIENT_WRITE_TIMEOUT, set by install()
SEND_BUFFER = 256 * 1024  # bytes of answer the kernel holds for a client (twice this, as Linux doubles it)


def install():
    """Make gunicorn build every response with OneWriteResponse (wsgi.create looks it up)."""
    global WRITE_TIMEOUT
    WRITE_TIMEOUT = Config.from_env(os.environ).client_write_timeout
    wsgi.Response = OneWriteResponse
