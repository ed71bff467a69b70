"""HTTP client for the proxy's one backend (vLLM): pooled keep-alive connections, timeouts
that map to gateway errors, and an abort that frees vLLM's sequence slot at once.

Used by proxy.app; not run on its own. It sits on http.client rather than requests or
urllib3 because the proxy needs the raw socket: to relay chunked SSE bytes the moment they
arrive (read1) and to shut a connection down from another greenlet when the client leaves.
"""
from __future__ import annotations

import http.client
import logging
import socket
import threading
import urllib.parse

log = logging.getLogger("proxy.upstream")

# RFC 9110 §7.6.1: meaningful for one connection only, never relayed. Content-Length is
# recomputed by whoever writes the next hop, and Host belongs to that hop too.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
})


def end_to_end_headers(headers):
    """Drop hop-by-hop headers, including any the Connection header itself names."""
    headers = list(headers)
    named = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(v.strip().lower() for v in value.split(","))
    return [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() not in named]


class UpstreamError(Exception):
    """The backend could not be reached or did not answer in time.

    `kind` is "timeout" (maps to 504) or "unreachable" (502); `refused` says the port was
    closed, which for vLLM usually means it is still loading the model.
    """

    def __init__(self, kind: str, message: str, refused: bool = False):
        super().__init__(message)
        self.kind = kind
        self.refused = refused


class UpstreamResponse:
    """One backend response; read it whole or relay it piece by piece, then close it."""

    def __init__(self, backend: "Backend", conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self._backend = backend
        self._conn = conn
        self._resp = resp
        self.status = resp.status
        self.headers = resp.getheaders()
        self._done = False

    def header(self, name: str, default: str = "") -> str:
        return self._resp.getheader(name, default)

    @property
    def is_event_stream(self) -> bool:
        return self.header("content-type").startswith("text/event-stream")

    def read(self) -> bytes:
        try:
            body = self._resp.read()
        except socket.timeout as e:
            self.abort()
            raise UpstreamError("timeout", f"{self._backend.base_url} stopped answering for {self._backend.read_timeout:g} s") from e
        except (OSError, http.client.HTTPException) as e:
            self.abort()
            raise UpstreamError("unreachable", f"connection to {self._backend.base_url} broke: {e}") from e
        self.close()
        return body

    def iter_raw(self, size: int = 65536):
        """Yield body bytes as they arrive: with chunked encoding, one network read each.

        Raises UpstreamError if the backend dies or goes silent before the body ends.
        """
        try:
            while True:
                data = self._resp.read1(size)
                if not data:
                    break
                yield data
        except socket.timeout as e:
            self.abort()
            raise UpstreamError("timeout", f"{self._backend.base_url} stopped answering for {self._backend.read_timeout:g} s") from e
        except (OSError, http.client.HTTPException, ValueError) as e:
            # ValueError: http.client's reaction to a read on a socket abort() closed.
            self.abort()
            raise UpstreamError("unreachable", f"connection to {self._backend.base_url} broke mid-response: {e}") from e
        self.close()

    def close(self):
        """Finish with the response; a fully read one returns its connection to the pool."""
        if self._done:
            return
        self._done = True
        if self._resp.isclosed() and not self._resp.will_close:
            self._backend._release(self._conn)
        else:
            self._conn.close()

    def abort(self):
        """Drop the connection now, from any greenlet or thread, so vLLM aborts the request.

        shutdown() rather than close(): it wakes a reader blocked on the socket elsewhere.
        A response already finished is left alone: its connection may be back in the pool.
        """
        if self._done:
            return
        self._done = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone: exactly the state we want
        self._conn.close()


class _OneWrite:
    """http.client sends a request's headers and body in two writes; a small request goes out
    in one here, so the body never waits on Nagle's algorithm and vLLM's server wakes once."""

    def _send_output(self, message_body=None, encode_chunked=False):
        if isinstance(message_body, bytes) and len(message_body) <= 65536 and not encode_chunked:
            self._buffer.extend((b"", b""))
            msg = b"\r\n".join(self._buffer) + message_body
            del self._buffer[:]
            self.send(msg)
        else:
            super()._send_output(message_body, encode_chunked)


class _HTTPConnection(_OneWrite, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_OneWrite, http.client.HTTPSConnection):
    pass


class Backend:
    """The vLLM server at `base_url`, with a small pool of idle keep-alive connections."""

    def __init__(self, base_url: str, connect_timeout: float, read_timeout: float, api_key: str = ""):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"BACKEND_URL must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.api_key = api_key
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _new_conn(self) -> http.client.HTTPConnection:
        cls = _HTTPSConnection if self._https else _HTTPConnection
        return cls(self._host, self._port, timeout=self.connect_timeout)

    def _release(self, conn):
        with self._lock:
            if len(self._idle) < 64:
                self._idle.append(conn)
                return
        conn.close()

    def _take(self):
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new_conn(), False

    def request(self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]],
                on_open=None) -> UpstreamResponse:
        """Send one request and wait for the status line and headers.

        `on_open(conn)` is called once the connection exists, so a watcher can abort it
        while this call blocks. A reused keep-alive connection that the server had already
        closed is retried once on a fresh one (the body is bytes, so replay is safe).
        """
        url = self._prefix + path
        for attempt in (0, 1):
            conn, reused = self._take() if attempt == 0 else (self._new_conn(), False)
            if on_open:
                on_open(conn)
            try:
                if conn.sock is None:
                    conn.connect()
                    # Bodies over _OneWrite's limit still go out in several writes; without
                    # this the later ones wait for a delayed ACK (about 0.5 ms on loopback).
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.putrequest(method, url, skip_host=True, skip_accept_encoding=True)
                conn.putheader("Host", self.host_header)
                for name, value in headers:
                    conn.putheader(name, value)
                if body is not None:
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                if conn.sock is not None:
                    conn.sock.settimeout(self.read_timeout)
                resp = conn.getresponse()
                return UpstreamResponse(self, conn, resp)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise UpstreamError("unreachable", f"{self.base_url} closed the connection: {e}") from e
            except ConnectionRefusedError as e:
                conn.close()
                raise UpstreamError("unreachable", f"cannot connect to {self.base_url}: connection refused", refused=True) from e
            except socket.timeout as e:
                conn.close()
                raise UpstreamError("timeout", f"{self.base_url} did not answer within {self.read_timeout:g} s") from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise UpstreamError("unreachable", f"cannot reach {self.base_url}: {e}") from e
        raise AssertionError("unreachable")  # the loop returns or raises
