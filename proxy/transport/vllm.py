"""HTTP/1.1 client for the proxy's one backend (vLLM): pooled keep-alive connections, timeouts
that map to gateway errors, and an abort that frees vLLM's sequence slot at once.

Used by proxy.http.app; not run on its own. It is a small client of its own rather than requests,
urllib3 or http.client for two reasons. The proxy needs the raw socket: to shut a connection
down from another greenlet when the client leaves. And it is the proxy's hot path: measured
with scripts/proxy_overhead.py, http.client's header parsing (the email package) and its
one-chunk-per-read decoding cost more CPU per request than everything else the proxy does
with a small chat request. Here httptools (llhttp, the parser vLLM's own uvicorn uses) parses
every byte in C, and a read hands on every event that has arrived, however many:
scripts/bench_http_parse.py measured it within 5% of the hand-written parser it replaced on
a JSON answer and 2-7x faster on chunked ones (SSE streams, large bodies).
"""
from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
import urllib.parse

import httptools

from proxy.runtime.concurrency import system_poll as _poll
from proxy.transport.decoding import BoundedDecoder, UnknownEncoding
from proxy.transport.http1 import ProtocolError, body_framing, content_length, may_retry, request_head

# Requests up to this size go out in one write, so the body never waits on Nagle's algorithm
# and vLLM's server wakes once; bigger ones are sent as head, then body, without a join copy.
ONE_WRITE = 65536
MAX_HEAD = 65536  # a response head larger than this is not vLLM's
READ_SIZE = 65536
IDLE_POOL = 64
# vLLM's server (uvicorn) closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds,
# 5 by default (uvicorn's own timeout_keep_alive default is 5 too), counted from when it
# finished writing the response, so never later than our idle clock starts. A connection idle
# for less than this cannot be the one uvicorn is closing at this very moment; one that a
# restarted or reconfigured server closed earlier is caught by idle_connection_ok().
POOL_IDLE = 2.0


class UpstreamError(Exception):
    """The backend could not be reached or did not answer in time.

    `kind` is "timeout" (maps to 504) or "unreachable" (502); `refused` says the port was
    closed, which for vLLM usually means it is still loading the model; `unanswered` says the
    backend failed before a byte of its answer (refused, reset or closed before the head); `stale` says it failed on
    a pooled keep-alive connection in a way that proves the server cannot have acted on the request (may_retry).
    What goes again on those facts is the one retry policy, proxy/engine/retry.py's, run by Exchange.call.
    """

    def __init__(self, kind: str, message: str, refused: bool = False, unanswered: bool = False,
                 stale: bool = False):
        super().__init__(message)
        self.kind = kind
        self.refused = refused
        self.unanswered = unanswered or refused
        self.stale = stale


class Connection:
    """One connection to the backend.

    `sock` is None until connected and after close; another greenlet may shut it down
    (watch.Call.abort) to wake a reader blocked here.
    """

    __slots__ = ("sock", "idle_since")

    def __init__(self):
        self.sock: socket.socket | None = None
        self.idle_since = 0.0

    def recv(self, size: int) -> bytes:
        """What has arrived, waiting for at least a byte; b"" at the end of the stream."""
        sock = self.sock
        if sock is None:
            raise ConnectionAbortedError("connection closed")
        return sock.recv(size)

    def close(self):
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


def idle_connection_ok(sock) -> bool:
    """True if an idle keep-alive socket has nothing to read. Anything readable means it is
    dead to us: EOF or a reset (the server closed it), or bytes no request asked for."""
    pending = getattr(sock, "pending", None)  # TLS: bytes already read and decrypted
    if pending is not None and pending():
        return False
    poller = _poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


class UpstreamResponse:
    """One backend response; read it whole or relay it piece by piece, then close it.

    httptools parses every byte read and calls the on_* methods. body_framing's rules still
    decide where the body ends: llhttp cannot know that an answer to HEAD has no body, nor
    tell a body cut short from one that runs to the end of the stream.
    """

    def __init__(self, backend: Backend, conn: Connection, method: str):
        self._backend = backend
        self._conn = conn
        self._method = method
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self._framing, self._left = "close", 0
        self._reusable = False
        self._body: list[bytes] = []  # parsed, not yet handed on
        self._fed = 0                 # bytes read, head included
        self._head_done = False
        self._complete = False
        self._extra = False           # bytes past the answer's end: the connection is done
        self._done = False
        self._decoder: BoundedDecoder | None = None  # set by decode_content(): the body is handed on decoded

    # ---- httptools' callbacks, inside feed_data ----

    def on_message_begin(self):
        if self._head_done:
            self._extra = True  # a second answer where one was asked for

    def on_header(self, name: bytes, value: bytes):
        if not self._head_done:  # after it: trailer fields, end-to-end metadata not relayed
            self.headers.append((name.decode("latin-1"), value.decode("latin-1").rstrip(" \t")))

    def on_headers_complete(self):
        if self._head_done:
            return  # the head of a second answer (on_message_begin marked it)
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.headers = []  # an interim answer (100 Continue): the final one follows
        else:
            self.status = status
            self._head_done = True

    def on_body(self, body: bytes):
        if not self._extra:
            self._body.append(body)

    def on_message_complete(self):
        if self._head_done:
            self._complete = True

    # ----

    def _feed(self, data: bytes):
        self._fed += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # a 101's head is all of it that is HTTP; that connection is not reused
        except httptools.HttpParserCallbackError:
            raise  # a bug in the callbacks above: a 500 that says so, not vLLM's 502
        except httptools.HttpParserError as e:
            if not self._complete:
                raise ProtocolError(str(e) or type(e).__name__) from e
            self._extra = True  # what follows the answer is not HTTP

    def _read_head(self):
        """Read until the final answer's head is in (1xx interim answers are skipped) and
        decide how its body ends."""
        while not self._head_done:
            if self._fed > MAX_HEAD:
                raise ProtocolError(f"the response head is over {MAX_HEAD} bytes")
            data = self._conn.recv(READ_SIZE)
            if not data:
                if self._fed:
                    raise ProtocolError("the connection closed inside the response head")
                raise _Closed("no response")
            self._feed(data)
        version = self._parser.get_http_version()
        if version not in ("1.0", "1.1"):
            raise ProtocolError(f"not an HTTP/1.x response: HTTP/{version}")
        self._framing, self._left = body_framing(self._method, self.status, self.headers)
        connection = self.header("connection").lower()
        self._reusable = (version == "1.1" and "close" not in connection
                          and self._framing != "close" and self.status != 101)
        if self._framing == "none":
            # llhttp takes what follows a HEAD answer for the body its Content-Length gives.
            self._extra = self._extra or bool(self._body)
            self._body.clear()
            self._complete = True

    def header(self, name: str, default: str = "") -> str:
        """The header's value (several joined with ", ", as http.client did), else `default`."""
        name = name.lower()
        values = [v for n, v in self.headers if n.lower() == name]
        return ", ".join(values) if values else default

    @property
    def content_length(self) -> int | None:
        """vLLM's Content-Length (body_framing checked it); for HEAD, the GET's body's."""
        return content_length(self.headers)

    @property
    def is_event_stream(self) -> bool:
        return self.header("content-type").startswith("text/event-stream")

    def decode_content(self, limit: int) -> None:
        """For the search loop, which reads every turn itself (never the relay, which passes bytes as they came):
        the body with its gzip/deflate undone, at most `limit` bytes, and no Content-Encoding header."""
        encoding = self.header("content-encoding").strip().lower()
        if encoding in ("", "identity"):
            return
        try:
            self._decoder = BoundedDecoder(encoding, limit)
        except UnknownEncoding as e:
            self.abort()
            raise UpstreamError("unreachable", f"{self._backend.base_url} answered in an encoding the proxy cannot "
                                               f"read ({encoding}): {e}") from None
        self.headers = [(n, v) for n, v in self.headers if n.lower() != "content-encoding"]

    def read(self) -> bytes:
        """The whole body. Raises UpstreamError if the backend dies or goes silent first."""
        size = READ_SIZE
        if self._framing == "length":  # what is left of it in few reads, at most 1 MiB each
            size = min(max(self._left - sum(map(len, self._body)), READ_SIZE), 1 << 20)
        with self._broken("broke"):
            body = b"".join(self._pieces(size))
        self.close()
        return body

    def iter_raw(self, size: int = READ_SIZE):
        """Yield body bytes as they arrive: all that one network read brought, de-chunked.

        Raises UpstreamError if the backend dies or goes silent before the body ends.
        """
        with self._broken("broke mid-response"):
            yield from self._pieces(size)
        self.close()

    @contextlib.contextmanager
    def _broken(self, what: str):
        """A body read that fails is UpstreamError (timeout, or unreachable: the connection `what`), the connection
        aborted first so it never goes back to the pool."""
        try:
            yield
        except TimeoutError as e:
            self.abort()
            raise UpstreamError("timeout", f"{self._backend.base_url} stopped answering for {self._backend.read_timeout:g} s") from e
        except (OSError, ProtocolError) as e:
            self.abort()
            raise UpstreamError("unreachable", f"connection to {self._backend.base_url} {what}: {e}") from e

    def _pieces(self, size: int):
        """The body's pieces as they arrive: as sent, or decoded when decode_content() asked for it (picked once
        here, so the relay's pieces pass through no extra generator)."""
        return self._raw_pieces(size) if self._decoder is None else self._decoded_pieces(size)

    def _decoded_pieces(self, size: int):
        assert self._decoder is not None
        for piece in self._raw_pieces(size):
            try:
                out = self._decoder.take(piece)
            except ValueError as e:
                raise ProtocolError(str(e)) from None
            if out:
                yield out

    def _raw_pieces(self, size: int):
        body = self._body
        while True:
            if body:
                piece = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                yield piece
            if self._complete:
                return
            data = self._conn.recv(size)
            if not data:
                if self._framing == "close":  # the body is whatever comes until the close
                    self._complete = True
                    return
                raise ProtocolError("the backend closed the connection before the body ended")
            self._feed(data)

    def close(self):
        """Finish with the response; a fully read one returns its connection to the pool."""
        if self._done:
            return
        self._done = True
        self._parser = None  # type: ignore[assignment]  # never used after close; it refers back to self; freed now rather than by the collector
        if self._complete and self._reusable and not self._extra:
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


class _Closed(Exception):
    """The backend closed the connection before sending a byte of its answer."""


class Backend:
    """The vLLM server at `base_url`, with a small pool of idle keep-alive connections."""

    def __init__(self, base_url: str, connect_timeout: float, read_timeout: float, api_key: str = ""):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"BACKEND_URL must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.api_key = api_key
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def _connect(self, conn: Connection) -> socket.socket:
        sock = socket.create_connection((self._host, self._port), timeout=self.connect_timeout)
        # Small SSE events and request bodies must leave at once, not wait for a delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_hostname=self._host)
        sock.settimeout(self.read_timeout)
        conn.sock = sock
        return sock

    def _release(self, conn: Connection):
        conn.idle_since = time.monotonic()
        with self._lock:
            if len(self._idle) < IDLE_POOL:
                self._idle.append(conn)
                return
        conn.close()

    def _take(self) -> tuple[Connection, bool]:
        """The newest pooled connection still fit to reuse, else a new unconnected one."""
        while True:
            with self._lock:
                if not self._idle:
                    return Connection(), False
                conn = self._idle.pop()
            if time.monotonic() - conn.idle_since < POOL_IDLE and idle_connection_ok(conn.sock):
                return conn, True
            conn.close()

    def request(self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]],
                on_open=None, fresh: bool = False) -> UpstreamResponse:
        """Send one request and wait for the status line and headers: one attempt, on the newest fit pooled
        connection, or on a new one when `fresh` (a retry's). Whether a failed attempt goes again is decided in one
        place, Exchange.call (proxy/engine/exchange.py), from the UpstreamError's `unanswered` and `stale`.

        `on_open(conn)` is called once the connection's socket exists and before anything is
        sent, so a watcher can shut it down while this call blocks.
        """
        head = request_head(method, self._prefix + path, self.host_header, headers,
                            None if body is None else len(body))
        conn, reused = (Connection(), False) if fresh else self._take()
        up = UpstreamResponse(self, conn, method)
        sent = False
        try:
            sock = conn.sock if conn.sock is not None else self._connect(conn)
            if on_open:
                on_open(conn)
            if body is None:
                sock.sendall(head)
            elif len(body) <= ONE_WRITE:
                sock.sendall(head + body)
            else:
                sock.sendall(head)
                sock.sendall(body)
            sent = True
            up._read_head()
            return up
        except (_Closed, BrokenPipeError, ConnectionResetError) as e:
            conn.close()
            raise UpstreamError("unreachable", f"{self.base_url} closed the connection: {e}", unanswered=up._fed == 0,
                                stale=reused and may_retry(method, sent, up._fed > 0)) from e
        except ConnectionRefusedError as e:
            conn.close()
            raise UpstreamError("unreachable", f"cannot connect to {self.base_url}: connection refused", refused=True) from e
        except TimeoutError as e:
            conn.close()
            raise UpstreamError("timeout", f"{self.base_url} did not answer within {self.read_timeout:g} s") from e
        except ProtocolError as e:
            conn.close()
            raise UpstreamError("unreachable", f"{self.base_url} sent a malformed response: {e}") from e
        except OSError as e:
            conn.close()
            raise UpstreamError("unreachable", f"cannot reach {self.base_url}: {e}", unanswered=up._fed == 0) from e

def gateway_status(e: UpstreamError) -> tuple[int, str]:
    """Map a backend failure to the gateway status and the message the client reads."""
    if e.kind == "timeout":
        return 504, f"vLLM timed out: {e}"
    msg = f"vLLM is unreachable: {e}"
    if e.refused:
        msg += " (the model may still be loading: check `docker compose logs -f vllm`)"
    return 502, msg
