"""HTTP/1.1 client for the proxy's one backend (vLLM): pooled keep-alive connections, timeouts
that map to gateway errors, and an abort that frees vLLM's sequence slot at once.

Used by proxy.app; not run on its own. It is a small client of its own rather than requests,
urllib3 or http.client for two reasons. The proxy needs the raw socket: to shut a connection
down from another greenlet when the client leaves. And it is the proxy's hot path: measured
with scripts/proxy_overhead.py, http.client's header parsing (the email package) and its
one-chunk-per-read decoding cost more CPU per request than everything else the proxy does
with a small chat request; here a response head is one split and a read hands on every
event that has arrived, however many.
"""
from __future__ import annotations

import socket
import ssl
import threading
import urllib.parse

# RFC 9110 §7.6.1: meaningful for one connection only, never relayed. Content-Length is
# recomputed by whoever writes the next hop, and Host belongs to that hop too.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
})
# Requests up to this size go out in one write, so the body never waits on Nagle's algorithm
# and vLLM's server wakes once; bigger ones are sent as head, then body, without a join copy.
ONE_WRITE = 65536
MAX_HEAD = 65536  # a response head larger than this is not vLLM's
READ_SIZE = 65536
IDLE_POOL = 64


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


class ProtocolError(Exception):
    """The backend's bytes are not a well-formed HTTP/1.1 response, or stop short of one."""


class Connection:
    """One connection to the backend and the bytes read from it but not yet consumed.

    `sock` is None until connected and after close; another greenlet may shut it down
    (exchange.Call.abort) to wake a reader blocked here.
    """

    __slots__ = ("sock", "buf")

    def __init__(self):
        self.sock = None
        self.buf = bytearray()

    def fill(self, size: int = READ_SIZE) -> bool:
        """Read what has arrived (waiting for at least a byte); False at the end of the stream."""
        sock = self.sock
        if sock is None:
            raise ConnectionAbortedError("connection closed")
        data = sock.recv(size)
        if not data:
            return False
        self.buf += data
        return True

    def close(self):
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


def request_head(method: str, target: str, host: str, headers, body_length: int | None) -> bytes:
    """The request line and headers as bytes. Pure.

    Latin-1, as gunicorn decoded them, so the client's bytes reach vLLM unchanged. A CR or
    LF inside a name, value or target would let one header smuggle another: refused.
    """
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body_length is not None:
        lines.append(f"Content-Length: {body_length}")
    text = "\r\n".join(lines)
    if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1:
        raise ValueError("a request header or the target contains a line break")
    return (text + "\r\n\r\n").encode("latin-1")


def parse_head(head: bytes) -> tuple[str, int, list[tuple[str, str]]]:
    """(version, status, headers) from a response head without its blank line. Pure."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit() or rest[3:4] not in ("", " "):
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"malformed header line: {line[:80]!r}")
        headers.append((name, value.strip(" \t")))
    return version, int(code), headers


def body_framing(method: str, status: int, headers) -> tuple[str, int]:
    """How the body ends (RFC 9112 §6.3): ("none"|"length"|"chunked"|"close", length). Pure."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return "none", 0
    codings = [v for n, v in headers if n.lower() == "transfer-encoding"]
    if codings:
        last = ",".join(codings).rsplit(",", 1)[-1].strip().lower()
        return ("chunked", 0) if last == "chunked" else ("close", 0)
    lengths = {v.strip() for n, v in headers if n.lower() == "content-length"}
    if not lengths:
        return "close", 0
    if len(lengths) > 1 or not next(iter(lengths)).isdigit():
        raise ProtocolError(f"invalid Content-Length: {', '.join(sorted(lengths))[:80]!r}")
    return "length", int(next(iter(lengths)))


class UpstreamResponse:
    """One backend response; read it whole or relay it piece by piece, then close it."""

    def __init__(self, backend: "Backend", conn: Connection, version: str, status: int, headers, method: str):
        self._backend = backend
        self._conn = conn
        self.status = status
        self.headers = headers
        self._framing, self._left = body_framing(method, status, headers)
        connection = ",".join(v for n, v in headers if n.lower() == "connection").lower()
        self._reusable = (version == "HTTP/1.1" and "close" not in connection
                          and self._framing != "close" and status != 101)
        self._chunk = "size"   # chunked decoding: "size" line next, "data", "crlf", "trailer"
        self._complete = self._framing == "none" or (self._framing == "length" and not self._left)
        self._done = False

    def header(self, name: str, default: str = "") -> str:
        """The header's value (several joined with ", ", as http.client did), else `default`."""
        name = name.lower()
        values = [v for n, v in self.headers if n.lower() == name]
        return ", ".join(values) if values else default

    @property
    def is_event_stream(self) -> bool:
        return self.header("content-type").startswith("text/event-stream")

    def read(self) -> bytes:
        """The whole body. Raises UpstreamError if the backend dies or goes silent first."""
        try:
            if self._framing == "length":
                conn, n = self._conn, self._left
                while len(conn.buf) < n:
                    if not conn.fill(min(n - len(conn.buf), 1 << 20)):
                        raise ProtocolError(f"the body ended {n - len(conn.buf)} bytes short")
                body = bytes(conn.buf[:n])
                del conn.buf[:n]
                self._left = 0
                self._complete = True
            else:
                body = b"".join(self._pieces())
        except socket.timeout as e:
            self.abort()
            raise UpstreamError("timeout", f"{self._backend.base_url} stopped answering for {self._backend.read_timeout:g} s") from e
        except (OSError, ProtocolError) as e:
            self.abort()
            raise UpstreamError("unreachable", f"connection to {self._backend.base_url} broke: {e}") from e
        self.close()
        return body

    def iter_raw(self, size: int = READ_SIZE):
        """Yield body bytes as they arrive: all that one network read brought, de-chunked.

        Raises UpstreamError if the backend dies or goes silent before the body ends.
        """
        try:
            yield from self._pieces(size)
        except socket.timeout as e:
            self.abort()
            raise UpstreamError("timeout", f"{self._backend.base_url} stopped answering for {self._backend.read_timeout:g} s") from e
        except (OSError, ProtocolError) as e:
            self.abort()
            raise UpstreamError("unreachable", f"connection to {self._backend.base_url} broke mid-response: {e}") from e
        self.close()

    def _pieces(self, size: int = READ_SIZE):
        conn = self._conn
        while not self._complete:
            if self._framing == "chunked":
                piece = self._dechunk()
            elif self._framing == "length":
                piece = bytes(conn.buf[:self._left])
                del conn.buf[:len(piece)]
                self._left -= len(piece)
                self._complete = self._left == 0
            else:  # "close": the body is whatever comes until the backend closes
                piece = bytes(conn.buf)
                conn.buf.clear()
            if piece:
                yield piece
            if self._complete:
                return
            if not conn.fill(size):
                if self._framing == "close":
                    self._complete = True
                    return
                raise ProtocolError("the backend closed the connection before the body ended")

    def _dechunk(self) -> bytes:
        """Decode every whole piece of chunked framing in the buffer; keep the rest for later."""
        buf, out = self._conn.buf, bytearray()
        while True:
            if self._chunk == "data":
                take = min(self._left, len(buf))
                out += buf[:take]
                del buf[:take]
                self._left -= take
                if self._left:
                    return bytes(out)
                self._chunk = "crlf"
            if self._chunk == "crlf":
                if len(buf) < 2:
                    return bytes(out)
                if buf[:2] != b"\r\n":
                    raise ProtocolError("a chunk is longer than its declared size")
                del buf[:2]
                self._chunk = "size"
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > 4096:
                    raise ProtocolError("a chunk-size line is too long")
                return bytes(out)
            line = bytes(buf[:end])
            del buf[:end + 2]
            if self._chunk == "trailer":
                if not line:
                    self._complete = True
                    return bytes(out)
                continue  # a trailer field: end-to-end metadata the proxy does not relay
            digits = line.split(b";", 1)[0].strip()
            if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
                raise ProtocolError(f"bad chunk-size line: {line[:40]!r}")
            self._left = int(digits, 16)
            self._chunk = "data" if self._left else "trailer"

    def close(self):
        """Finish with the response; a fully read one returns its connection to the pool."""
        if self._done:
            return
        self._done = True
        # Bytes after the body would be read as the next response's: that connection is done.
        if self._complete and self._reusable and not self._conn.buf:
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

    def _connect(self, conn: Connection):
        sock = socket.create_connection((self._host, self._port), timeout=self.connect_timeout)
        # Small SSE events and request bodies must leave at once, not wait for a delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_hostname=self._host)
        sock.settimeout(self.read_timeout)
        conn.sock = sock

    def _release(self, conn: Connection):
        with self._lock:
            if len(self._idle) < IDLE_POOL:
                self._idle.append(conn)
                return
        conn.close()

    def _take(self) -> tuple[Connection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return Connection(), False

    def request(self, method: str, path: str, body: bytes | None, headers: list[tuple[str, str]],
                on_open=None) -> UpstreamResponse:
        """Send one request and wait for the status line and headers.

        `on_open(conn)` is called once the connection's socket exists and before anything is
        sent (again for a retry's fresh connection), so a watcher can shut it down while this
        call blocks. A reused keep-alive connection that the server had already closed is
        retried once on a fresh one (the body is bytes, so replay is safe).
        """
        head = request_head(method, self._prefix + path, self.host_header, headers,
                            None if body is None else len(body))
        for attempt in (0, 1):
            conn, reused = self._take() if attempt == 0 else (Connection(), False)
            try:
                if conn.sock is None:
                    self._connect(conn)
                if on_open:
                    on_open(conn)
                if body is None:
                    conn.sock.sendall(head)
                elif len(body) <= ONE_WRITE:
                    conn.sock.sendall(head + body)
                else:
                    conn.sock.sendall(head)
                    conn.sock.sendall(body)
                version, status, resp_headers = self._read_head(conn)
                return UpstreamResponse(self, conn, version, status, resp_headers, method)
            except (_Closed, BrokenPipeError, ConnectionResetError) as e:
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
            except ProtocolError as e:
                conn.close()
                raise UpstreamError("unreachable", f"{self.base_url} sent a malformed response: {e}") from e
            except OSError as e:
                conn.close()
                raise UpstreamError("unreachable", f"cannot reach {self.base_url}: {e}") from e
        raise AssertionError("unreachable")  # the loop returns or raises

    @staticmethod
    def _read_head(conn: Connection) -> tuple[str, int, list]:
        """Read up to the end of a final response head; 1xx interim responses are skipped."""
        while True:
            end = conn.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.buf) > MAX_HEAD:
                    raise ProtocolError(f"the response head is over {MAX_HEAD} bytes")
                if not conn.fill():
                    if conn.buf:
                        raise ProtocolError("the connection closed inside the response head")
                    raise _Closed("no response")
                continue
            version, status, headers = parse_head(bytes(conn.buf[:end]))
            del conn.buf[:end + 4]
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue and friends: the final answer follows
            return version, status, headers
