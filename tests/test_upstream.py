"""The proxy's HTTP client for vLLM (proxy/transport/vllm.py): its pure parsing rules, whole
responses written byte for byte into a real socket pair, whole and in one-byte pieces, and
the reuse of pooled connections against real loopback servers, never replaying a POST.

Run: tests/run.sh tests/test_upstream.py
"""
import gzip
import http.client
import json
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse

import pytest

from proxy.engine.retry import retry_reason
from proxy.transport import vllm as upstream
from proxy.transport.http1 import ProtocolError, body_framing, may_retry, request_head
from proxy.transport.vllm import Backend, Connection, UpstreamError, gateway_status
from standins.keepalive_server import DROP, OK, KeepAliveServer
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply

# ---- pure rules ---------------------------------------------------------------------------

def test_request_head_keeps_the_clients_bytes():
    head = request_head("POST", "/v1/chat/completions?x=%C3%A9", "vllm:8000",
                        [("Content-Type", "application/json"), ("X-Name", "caf\u00e9")], 12)
    assert head == (b"POST /v1/chat/completions?x=%C3%A9 HTTP/1.1\r\nHost: vllm:8000\r\n"
                    b"Content-Type: application/json\r\nX-Name: caf\xe9\r\nContent-Length: 12\r\n\r\n")
    assert b"Content-Length" not in request_head("GET", "/v1/models", "h", [], None)


@pytest.mark.parametrize("target, headers", [
    ("/v1/models", [("X-A", "1\r\nX-Smuggled: yes")]),
    ("/v1/models", [("X-A\nX-B", "1")]),
    ("/v1/models", [("X-A", "1\r")]),
    ("/v1/models HTTP/1.1\r\nX-Smuggled: yes", []),
])
def test_request_head_refuses_line_breaks(target, headers):
    with pytest.raises(ValueError, match="line break"):
        request_head("GET", target, "h", headers, None)


def head_of(raw: bytes):
    """(status, headers) of `raw`, a response head and an empty body, as the client parses it."""
    backend, _ = backend_answering(raw + b"Content-Length: 0\r\n\r\n")
    up = backend.request("GET", "/v1/models", None, [])
    return up.status, up.headers[:-1]


@pytest.mark.parametrize("head, expected", [
    (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nX-Empty:\r\nX-Pad: \t v \t\r\n",
     (200, [("content-type", "text/event-stream"), ("X-Empty", ""), ("X-Pad", "v")])),
    (b"HTTP/1.0 404\r\n", (404, [])),
    (b"HTTP/1.1 500 Internal: Server Error\r\n", (500, [])),
    (b"HTTP/1.1 200 OK\r\nX-Name: caf\xe9\r\n", (200, [("X-Name", "caf\u00e9")])),
])
def test_response_heads(head, expected):
    assert head_of(head) == expected


@pytest.mark.parametrize("head", [
    b"HTTP/2 200 OK", b"HTTP/2.0 200 OK", b"ICY 200 OK", b"HTTP/1.1 20 OK", b"HTTP/1.1 2000 OK", b"HTTP/1.1 abc OK",
    b"HTTP/1.1 \xb200 OK", b"HTTP/1.1 +20 OK",
    b"HTTP/1.1 200 OK\r\nno colon here", b"HTTP/1.1 200 OK\r\n folded: value", b"HTTP/1.1 200 OK\r\n: empty name",
    b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded", b"HTTP/1.1 200 OK\r\nX-A: a\x00b", b"HTTP/1.1 200 OK\nX-Bare-LF: 1",
])
def test_heads_that_are_not_http_1_are_refused(head):
    with pytest.raises(UpstreamError, match="malformed response") as e:
        head_of(head + b"\r\n")
    assert e.value.kind == "unreachable"


@pytest.mark.parametrize("method, status, headers, expected", [
    ("POST", 200, [("Content-Length", "12")], ("length", 12)),
    ("POST", 200, [("Content-Length", "12"), ("content-length", "12")], ("length", 12)),
    ("POST", 200, [("Transfer-Encoding", "chunked"), ("Content-Length", "12")], ("chunked", 0)),
    ("POST", 200, [("Transfer-Encoding", "Chunked")], ("chunked", 0)),
    ("POST", 200, [("Transfer-Encoding", " chunked ,")], ("chunked", 0)),
    ("POST", 200, [], ("close", 0)),
    ("HEAD", 200, [("Content-Length", "12")], ("none", 0)),
    ("HEAD", 200, [("Transfer-Encoding", "gzip, chunked")], ("none", 0)),
    ("GET", 204, [], ("none", 0)),
    ("GET", 304, [("Content-Length", "12")], ("none", 0)),
])
def test_body_framing(method, status, headers, expected):
    assert body_framing(method, status, headers) == expected


@pytest.mark.parametrize("codings", [["gzip, chunked"], ["gzip", "chunked"], ["chunked, gzip"], ["gzip"],
                                     ["x-gzip, chunked"], ["deflate, chunked"], ["chunked, chunked"], ["identity"]])
def test_body_framing_refuses_transfer_codings_but_chunked(codings):
    """Relayed, the body would still be gzip (or worse) with nothing saying so: a 502."""
    with pytest.raises(ProtocolError, match="unsupported Transfer-Encoding"):
        body_framing("POST", 200, [("Transfer-Encoding", v) for v in codings])


@pytest.mark.parametrize("value, length", [("0", 0), ("5", 5), ("007", 7), ("9" * 18, 10 ** 18 - 1)])
def test_content_length_accepts_ascii_digits(value, length):
    assert body_framing("POST", 200, [("Content-Length", value)]) == ("length", length)


# Each passes str.isdigit() or int(), or both; RFC 9110's 1*DIGIT is ASCII digits only.
BAD_LENGTHS = ["\u00b2", "1\u00b2", "\u00b9\u00b2", "\u0663", "+5", "-1", "5_0", "0x5", "5.0", "5 0",
               "\u00a05", "5\x85", "\x0b5", "5\x0c", "", "1e3", "12abc", "9" * 19, "1" * 5000]


@pytest.mark.parametrize("method", ["POST", "HEAD"])
@pytest.mark.parametrize("lengths", [[v] for v in BAD_LENGTHS] + [["12", "13"]])
def test_body_framing_refuses_bad_lengths(lengths, method):
    with pytest.raises(ProtocolError, match="Content-Length"):
        body_framing(method, 200, [("Content-Length", v) for v in lengths])


# ---- whole responses over a real socket pair ------------------------------------------------

class Peer:
    """The backend's end of a socket pair: reads one request, writes `raw`, maybe closes."""

    def __init__(self, sock, raw: bytes, piece: int, close: bool):
        self.sock, self.raw, self.piece, self.close = sock, raw, piece, close
        self.request = b""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while b"\r\n\r\n" not in self.request:
            self.request += self.sock.recv(65536)
        try:
            for i in range(0, len(self.raw), self.piece):
                self.sock.sendall(self.raw[i:i + self.piece])
        except (BrokenPipeError, ConnectionResetError):
            return  # the client gave up on a bad answer (a head over the limit) and closed
        if self.close:
            self.sock.close()


def pooled(sock, url: str = "http://127.0.0.1:9", read_timeout: float = 5) -> Backend:
    """A Backend whose one idle keep-alive connection is `sock`. The default URL is a closed
    port, so a retry on a fresh connection fails loudly."""
    backend = Backend(url, connect_timeout=1, read_timeout=read_timeout)
    conn = Connection()
    conn.sock = sock
    backend._release(conn)
    return backend


def backend_answering(raw: bytes, piece: int = 1 << 20, close: bool = False):
    """A Backend whose one pooled connection leads to a Peer that answers with `raw`."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    return pooled(ours), Peer(theirs, raw, piece, close)


OK_CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"f;name=value\r\ndata: {\"a\":1}\n\n\r\n"
              b"e\r\ndata: [DONE]\n\n\r\n0\r\nX-Trailer: dropped\r\n\r\n")

# raw response -> (body, connection back in the pool)
WHOLE = [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello", True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"", True),
    (OK_CHUNKED, b'data: {"a":1}\n\ndata: [DONE]\n\n', True),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", b"ok", False),
    (b"HTTP/1.0 200 OK\r\n\r\nuntil the end", b"until the end", False),
    (b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
]


@pytest.mark.parametrize("piece", [1 << 20, 1], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("raw, body, pooled", WHOLE)
def test_whole_responses(raw, body, pooled, piece):
    backend, peer = backend_answering(raw, piece, close=not pooled)
    up = backend.request("POST", "/v1/chat/completions", b"{}", [("Content-Type", "application/json")])
    assert up.status == 200 or (up.status == 204 and body == b"")
    got = b"".join(up.iter_raw()) if piece == 1 else up.read()
    assert got == body
    assert len(backend._idle) == (1 if pooled else 0)
    assert peer.request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:9\r\n")


@pytest.mark.parametrize("method, raw, body", [
    ("POST", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokX", b"ok"),
    ("POST", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nX", b"ok"),
    ("POST", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 100 Continue\r\n\r\n", b"ok"),
    ("POST", OK_CHUNKED + b"X", b'data: {"a":1}\n\ndata: [DONE]\n\n'),
    ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b""),
])
def test_bytes_after_the_body_retire_the_connection(method, raw, body):
    """They would be read as the next response's head. (Sent in one write, so they are
    there when the body ends; a byte that comes later fails the next request's head: 502.)"""
    backend, _ = backend_answering(raw)
    up = backend.request(method, "/v1/chat/completions", b"{}", [])
    assert up.read() == body and up.status == 200
    assert not backend._idle


def test_a_head_over_the_limit_is_refused():
    backend, _ = backend_answering(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 2 * upstream.MAX_HEAD + b"\r\n\r\n")
    with pytest.raises(UpstreamError, match="head is over"):
        backend.request("GET", "/v1/models", None, [])


def test_events_that_arrived_together_come_out_together():
    """The peer writes the whole answer at once: one piece, so the proxy writes once too."""
    backend, _ = backend_answering(OK_CHUNKED)
    up = backend.request("POST", "/v1/chat/completions", b"{}", [])
    assert list(up.iter_raw()) == [b'data: {"a":1}\n\ndata: [DONE]\n\n']


def test_head_request_has_no_body():
    backend, _ = backend_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n")
    up = backend.request("HEAD", "/health", None, [])
    assert up.read() == b"" and len(backend._idle) == 1
    assert up.content_length == 99  # the GET's length, which the relay passes on


def test_optional_whitespace_around_a_content_length_is_fine():
    backend, _ = backend_answering(b"HTTP/1.1 200 OK\r\nContent-Length: \t 5 \r\n\r\nhello")
    assert backend.request("GET", "/v1/models", None, []).read() == b"hello"


@pytest.mark.parametrize("raw, phrase", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", "broke"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\ncut", "broke"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n", "chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nxx\r\n0\r\n\r\n", "chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxxx\r\n0\r\n\r\n", "after chunk data"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxx\r\n0\r\n", "broke"),
])
@pytest.mark.parametrize("piece", [1 << 20, 1], ids=["whole", "byte-by-byte"])
def test_broken_bodies_raise_upstream_errors(raw, phrase, piece):
    """Whole, the head and the broken body come in one read, so the error may come before
    the response is returned (a clean 502); byte by byte, it comes mid-body."""
    backend, _ = backend_answering(raw, piece, close=True)
    with pytest.raises(UpstreamError, match=phrase) as e:
        b"".join(backend.request("POST", "/v1/chat/completions", b"{}", []).iter_raw())
    assert e.value.kind == "unreachable" and not backend._idle


@pytest.mark.parametrize("raw, phrase", [
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "malformed response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx", "malformed response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nxx", "in Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5_0\r\n\r\nxx", "in Content-Length"),
    (b"HTTP/1.1 \xb200 OK\r\nContent-Length: 2\r\n\r\nxx", "status code"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nxx\r\n0\r\n\r\n", "unsupported Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nContent-Len", "closed inside the response head"),
])
def test_broken_heads_raise_upstream_errors(raw, phrase):
    backend, _ = backend_answering(raw, close=True)
    with pytest.raises(UpstreamError, match=phrase) as e:
        backend.request("POST", "/v1/chat/completions", b"{}", [])
    assert e.value.kind == "unreachable"


def test_a_silent_backend_is_a_timeout():
    ours, theirs = socket.socketpair()
    ours.settimeout(0.2)
    backend = pooled(ours, read_timeout=0.2)
    with pytest.raises(UpstreamError, match="did not answer within 0.2 s") as e:
        backend.request("GET", "/v1/models", None, [])
    assert e.value.kind == "timeout"
    theirs.close()


def test_a_pooled_connection_the_server_closed_is_not_used():
    """The server closed it while idle: seen before use, so the request goes out once, on a
    fresh connection to a real listener."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        sock, _ = listener.accept()
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
        sock.close()
    threading.Thread(target=serve, daemon=True).start()
    stale, theirs = socket.socketpair()
    theirs.close()
    backend = pooled(stale, url=f"http://127.0.0.1:{port}")
    assert backend.request("GET", "/v1/models", None, []).read() == b"fresh"
    listener.close()


class QuietSocket:
    """Takes the place of a connected socket; its fileno is a real idle one, so the pool's
    look before reuse finds nothing to read."""

    def __init__(self):
        self._quiet, self._peer = socket.socketpair()

    def fileno(self):
        return self._quiet.fileno()

    def close(self):
        self._quiet.close()
        self._peer.close()


class RecordingSocket(QuietSocket):
    """Records each write, answers with a small 200."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def sendall(self, data):
        self.writes.append(bytes(data))

    def recv(self, _size):
        return b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize("size, writes", [(0, 1), (700, 1), (65536, 1), (65537, 2)])
def test_small_requests_leave_in_one_write(size, writes):
    """One write: the body never waits on Nagle's algorithm and vLLM's server wakes once."""
    sock = RecordingSocket()
    body = b"x" * size
    pooled(sock).request("POST", "/v1/chat/completions", body, [])
    assert len(sock.writes) == writes
    assert b"".join(sock.writes).endswith(b"\r\n\r\n" + body)


@pytest.fixture
def tls_backend(tmp_path):
    """An HTTPS stand-in on loopback with a fresh self-signed certificate, answering every
    request on a connection until the client closes it: (url, cert path, accepted sockets)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve():
        while True:
            try:
                raw, _ = listener.accept()
                accepted.append(raw)
                sock = ctx.wrap_socket(raw, server_side=True)
                data = b""
                while got := sock.recv(65536):
                    data += got
                    if b"\r\n\r\n" in data:
                        data = data.partition(b"\r\n\r\n")[2]
                        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntls")
            except (OSError, ssl.SSLError):
                if listener.fileno() < 0:
                    return  # closed at the end of the test
    threading.Thread(target=serve, daemon=True).start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}", cert, accepted
    listener.close()


def test_https_backend_verifies_its_certificate(tls_backend, monkeypatch):
    url, cert, _ = tls_backend
    with pytest.raises(UpstreamError, match="CERTIFICATE_VERIFY_FAILED"):
        Backend(url, connect_timeout=5, read_timeout=5).request("GET", "/v1/models", None, [])
    # Trusted (SSL_CERT_FILE is read when the proxy starts), the same backend answers.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert Backend(url, connect_timeout=5, read_timeout=5).request("GET", "/v1/models", None, []).read() == b"tls"


def test_https_connections_are_reused(tls_backend, monkeypatch):
    """The look before reuse reads the TLS socket's own buffer too, and finds it quiet."""
    url, cert, accepted = tls_backend
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    backend = Backend(url, connect_timeout=5, read_timeout=5)
    assert [backend.request("GET", "/v1/models", None, []).read() for _ in range(3)] == [b"tls"] * 3
    assert len(accepted) == 1


# ---- reusing pooled connections: a request is never sent twice unless that is harmless ----

@pytest.fixture
def keepalive_server():
    """keepalive_server(*answers, keep_alive=5.0, default=OK) -> a KeepAliveServer on loopback."""
    servers = []

    def make(*answers, keep_alive=5.0, default=OK):
        servers.append(KeepAliveServer(answers, keep_alive, default))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


def chat(backend, method="POST"):
    body = b'{"messages":[]}' if method == "POST" else None
    return backend.request(method, "/v1/chat/completions", body, [("Content-Type", "application/json")])


def test_a_connection_the_server_closed_while_idle_is_not_used(keepalive_server):
    """uvicorn closes a connection idle past its keep-alive; the next POST must not be
    written into it (the server records a request sent after its close as late)."""
    server = keepalive_server(keep_alive=0.2)
    backend = Backend(server.url, connect_timeout=1, read_timeout=5)
    assert chat(backend).read() == b"{}"
    time.sleep(1.0)
    assert chat(backend).read() == b"{}"
    assert [(s.connection, s.late) for s in server.seen] == [(0, False), (1, False)]


@pytest.mark.parametrize("pause, connections", [(0, [0, 0]), (0.8, [0, 1])], ids=["reused", "expired"])
def test_a_pooled_connection_idle_past_the_limit_is_not_used(keepalive_server, monkeypatch, pause, connections):
    """The limit stays below vLLM's 5 s keep-alive, so the pool never races uvicorn's close;
    within it the connection is reused (a fresh one per request would cost every request)."""
    monkeypatch.setattr(upstream, "POOL_IDLE", 0.5)
    server = keepalive_server(keep_alive=5)
    backend = Backend(server.url, connect_timeout=1, read_timeout=5)
    assert chat(backend).read() == b"{}"
    time.sleep(pause)
    assert chat(backend).read() == b"{}"
    assert [s.connection for s in server.seen] == connections
    assert not any(s.late for s in server.seen)


# method, a first request pools the connection -> the error says the connection was stale (a replay is harmless)
DROPPED = [
    ("POST", True, False),
    ("POST", False, False),
    ("GET", True, True),      # idempotent: the policy may send it again on a fresh connection (RFC 9112 §9.3.1)
    ("GET", False, False),    # a fresh connection that failed is no stale one
]


@pytest.mark.parametrize("method, pooled_first, stale", DROPPED)
def test_a_request_the_server_read_and_dropped_is_not_replayed(keepalive_server, method, pooled_first, stale):
    """The server reads the request and closes without answering, as a vLLM that died while
    generating would: the transport sends it once (Exchange.call's policy decides on a retry), a 502,
    stale only when a replay cannot be a second generation."""
    server = keepalive_server(*([OK, DROP] if pooled_first else [DROP]), default=OK)
    backend = Backend(server.url, connect_timeout=1, read_timeout=5)
    if pooled_first:
        assert backend.request("GET", "/v1/models", None, []).read() == b"{}"
    with pytest.raises(UpstreamError, match="closed the connection") as e:
        chat(backend, method)
    assert gateway_status(e.value)[0] == 502 and (e.value.stale, e.value.unanswered) == (stale, True)
    assert [s.method for s in server.seen if s.path == "/v1/chat/completions"] == [method]
    if pooled_first:
        assert server.seen[1].connection == 0  # the dropped request did go on the pooled connection


class FailingSocket(QuietSocket):
    """A pooled connection that passes the look before reuse, then fails its send or its
    first read, as a connection the server closes at that very moment would."""

    def __init__(self, fail_on: str):
        super().__init__()
        self.fail_on = fail_on

    def sendall(self, _data):
        if self.fail_on == "send":
            raise BrokenPipeError(32, "Broken pipe")

    def recv(self, _size):
        raise ConnectionResetError(104, "Connection reset by peer")


@pytest.mark.parametrize("method, fail_on, stale", [
    ("POST", "send", True),    # the write did not complete: the server never had the request
    ("POST", "read", False),   # sent whole: it may be generating, so never again on this ground
    ("GET", "send", True),
    ("GET", "read", True),
])
def test_a_reused_connection_failing_is_stale_only_when_a_retry_is_safe(keepalive_server, method, fail_on, stale):
    """One attempt, never a second connection in the transport; the error says whether a retry is safe."""
    server = keepalive_server()
    backend = pooled(FailingSocket(fail_on), url=server.url)
    with pytest.raises(UpstreamError, match="Broken pipe|reset by peer") as e:
        chat(backend, method)
    assert e.value.stale is stale and server.accepted == 0
    # fresh: a retry's connection, never the pool's
    assert chat(backend, method).read() == b"{}" and [s.method for s in server.seen] == [method]


def failed(stale=False, unanswered=True, refused=False) -> UpstreamError:
    return UpstreamError("unreachable", "x", refused=refused, unanswered=unanswered, stale=stale)


# the attempt's failure (or a gateway's plain-text status), the retries spent -> why it goes again
RETRY_POLICY = [
    (failed(stale=True), set(), "stale"),                      # a pooled connection the server closed: quietly
    (failed(stale=True), {"stale"}, "unreachable"),            # (cannot happen: retries use fresh connections)
    (failed(), {"stale"}, "unreachable"),                      # then nothing answered on the fresh one: once more
    (failed(), set(), "unreachable"),
    (failed(unanswered=False, refused=True), set(), "unreachable"),  # refused: vLLM loading, or a router's worker
    (failed(), {"failed"}, None),                              # never a third time
    (failed(), {"stale", "failed"}, None),
    (failed(unanswered=False), set(), None),                   # the head had begun: the server acted on it
    (UpstreamError("timeout", "x"), set(), None),              # silent for READ_TIMEOUT: it may be generating
    (502, set(), "502"),                                       # vllm-router: the worker it chose is gone
    (503, {"stale"}, "503"),
    (500, {"failed"}, None),
    (None, set(), None),                                       # an answer
]


@pytest.mark.parametrize("failure, tried, reason", RETRY_POLICY)
def test_the_one_retry_policy(failure, tried, reason):
    error, gone = (failure, None) if isinstance(failure, UpstreamError) else (None, failure)
    assert retry_reason(error, gone, set(tried)) == reason


# vLLM's answers in order -> the client's status, (connection, path) of each request vLLM saw after the first GET
THROUGH_THE_PROXY = [
    # a pooled connection vLLM dropped: the idempotent GET goes again on a fresh one
    ([OK, DROP], "GET", 200, [0, 1]),
    # and if that fails before an answer too, once more: the stale retry and the one retry are each spent once
    ([OK, DROP, DROP], "GET", 200, [0, 1, 2]),
    ([OK, DROP, DROP, DROP], "GET", 502, [0, 1, 2]),
    # a POST read and dropped on the pooled connection is no stale one: the one retry, on a fresh connection
    ([OK, DROP], "POST", 200, [0, 1]),
]


@pytest.mark.parametrize("answers, method, status, connections", THROUGH_THE_PROXY)
def test_through_the_proxy_retries_of_a_call_vllm_dropped(start_proxy, keepalive_server, answers, method, status,
                                                          connections):
    server = keepalive_server(*answers, default=OK)
    p = start_proxy(BACKEND_URL=server.url)
    assert raw_request(p.url, "GET", "/v1/models")[0] == 200
    target = "/v1/models" if method == "GET" else "/v1/completions"
    got = raw_request(p.url, method, target, b'{"model":"m","prompt":"x"}' if method == "POST" else None,
                      {"Content-Type": "application/json"})[0]
    assert got == status
    assert [(s.connection, s.path) for s in server.seen[1:]] == [(c, target) for c in connections]


@pytest.mark.parametrize("method, sent, answered, expected", [
    ("POST", False, False, True), ("POST", True, False, False), ("POST", True, True, False),
    ("GET", True, False, True), ("DELETE", True, False, True), ("PATCH", True, False, False),
    ("GET", True, True, False),
])
def test_may_retry(method, sent, answered, expected):
    assert may_retry(method, sent, answered) is expected


@pytest.mark.parametrize("target", ["/v1/chat/completions", "/v1/completions"])
def test_through_the_proxy_a_post_vllm_dropped_is_sent_once_more_then_a_502(start_proxy, keepalive_server, target):
    """The real proxy: GET /v1/models pools a connection, the POST on it is read and dropped, and so is its one retry
    on a fresh connection (Exchange.call: a call closed before any answer goes once more, never a third time)."""
    server = keepalive_server(OK, DROP, DROP, default=OK)
    p = start_proxy(BACKEND_URL=server.url)
    assert raw_request(p.url, "GET", "/v1/models")[0] == 200
    status, _, data = raw_request(p.url, "POST", target, b'{"model":"m","messages":[],"prompt":"x"}',
                                  {"Content-Type": "application/json"})
    assert status == 502 and "vLLM is unreachable" in json.loads(data)["error"]["message"]
    assert [(s.method, s.path, s.connection) for s in server.seen] == [
        ("GET", "/v1/models", 0), ("POST", target, 0), ("POST", target, 1)]


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)


@pytest.fixture(scope="module")
def raw_vllm():
    """One KeepAliveServer for the module, so the proxy in front of it is started once."""
    server = KeepAliveServer()
    yield server
    server.close()


GZIP_CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                + chunked(gzip.compress(b'{"object":"list","data":[]}')))

# vLLM's answer -> what the client must read in the 502's message
MALFORMED = [
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \xb2\r\n\r\n{}", "in Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}", "in Content-Length"),
    (b"HTTP/1.1 \xb200 OK\r\nContent-Length: 2\r\n\r\n{}", "status code"),
    (GZIP_CHUNKED, "unsupported Transfer-Encoding: 'gzip, chunked'"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n" + gzip.compress(chunked(b"{}")), "unsupported Transfer-Encoding"),
]


@pytest.mark.parametrize("method, target", [("GET", "/v1/models"), ("POST", "/v1/chat/completions")])
@pytest.mark.parametrize("answer, phrase", MALFORMED, ids=["length-superscript", "length-plus", "status-superscript",
                                                        "gzip-chunked", "chunked-gzip"])
def test_through_the_proxy_a_malformed_answer_is_a_502(start_proxy, raw_vllm, answer, phrase, method, target):
    """Relayed (GET) and in the chat loop (POST): a short OpenAI-style 502 and one log line,
    never a 500 nor a body that is not what its headers say."""
    raw_vllm.answers[:] = [answer]
    raw_vllm.seen.clear()
    p = start_proxy(BACKEND_URL=raw_vllm.url)
    body = b'{"messages":[{"role":"user","content":"x"}]}' if method == "POST" else None
    status, headers, data = raw_request(p.url, method, target, body, {"Content-Type": "application/json"})
    err = json.loads(data)["error"]
    assert (status, err["code"], err["type"]) == (502, 502, "bad_gateway") and phrase in err["message"]
    assert headers["content-type"] == "application/json" and "content-encoding" not in headers
    assert [(s.method, s.path) for s in raw_vllm.seen] == [(method, target)]
    assert "Traceback" not in p.log()


@pytest.mark.parametrize("target, body", [("/v1/models", b'{"object":"list","data":[{"id":"foundation"}]}'),
                                          ("/health", b"")])
def test_through_the_proxy_a_head_answer_keeps_vllms_content_length(proxy, backend, target, body):
    """No body follows a HEAD answer; its Content-Length is the GET's. The client connection
    stays in step: a GET after the HEAD on it reads its whole body."""
    backend.script(Reply(body=body), Reply(body=body))
    u = urllib.parse.urlsplit(proxy.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request("HEAD", target)
        head = conn.getresponse()
        assert (head.status, head.getheader("Content-Length"), head.read()) == (200, str(len(body)), b"")
        conn.request("GET", target)
        got = conn.getresponse()
        assert (got.status, got.getheader("Content-Length"), got.read()) == (200, str(len(body)), body)
    finally:
        conn.close()
    assert [r.method for r in backend.received] == ["HEAD", "GET"]
