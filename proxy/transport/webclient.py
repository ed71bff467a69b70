"""The one HTTP client for the servers on the web side of the proxy, SearXNG and the pages web_fetch reads: a GET
on a fresh connection to a given address, its socket on the caller's Cancel from the moment it is connected (so
one deadline and the client's leaving cut connect, TLS, head and body alike), and a body read one receive at a
time, gzip/deflate undone within a byte cap. Failures are one exception with a kind the caller words for its
own reader (WebError); not run on its own (tests: tests/test_fetch.py, tests/test_hostile_web.py).

vLLM has a client of its own (proxy/transport/vllm.py): a keep-alive pool and httptools parsing on the hot path,
measured in docs/performance.md, which these one-off, seconds-long reads do not need.
"""
from __future__ import annotations

import http.client
import ssl
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import urllib3
import urllib3.connection
from urllib3.util.ssl_match_hostname import CertificateError

from proxy.runtime.cancel import Cancel
from proxy.transport.decoding import Decoder, UnknownEncoding

# What a connection or a hostile server's bytes raise in urllib3 and http.client.
NET_ERRORS = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, ValueError)
READ_CHUNK = 64 * 1024  # one receive's bytes: the byte cap and the deadline are checked between reads


class WebError(Exception):
    """One GET that failed. kind: "connect" (refused, unreachable, not HTTP: another address may do), "tls",
    "timeout" (a socket's own timeout), "broken" (the connection broke while reading), "decode" (a body that
    does not decompress), "encoding" (a Content-Encoding it cannot undo; detail is a sentence for the model). The caller asks its Cancel first: a fired one is what cut the socket."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


@dataclass
class Opened:
    """A response whose head has arrived; read its body with read_body, then close()."""
    conn: urllib3.connection.HTTPConnection
    resp: urllib3.response.HTTPResponse

    @property
    def status(self) -> int:
        return self.resp.status

    @property
    def reason(self) -> str:
        return self.resp.reason or ""

    def header(self, name: str, default: str = "") -> str:
        return self.resp.headers.get(name, default)

    def close(self) -> None:
        self.resp.release_conn()
        self.conn.close()


class _Watched:
    """A urllib3 connection whose socket is on a Cancel's watch from the moment it is connected."""
    cancel: Cancel

    def _new_conn(self):
        sock = super()._new_conn()  # type: ignore[misc]
        self.cancel.watch(sock)
        return sock


class _HTTP(_Watched, urllib3.connection.HTTPConnection):
    pass


class _HTTPS(_Watched, urllib3.connection.HTTPSConnection):
    pass


def get(scheme: str, address: str, port: int | None, target: str, headers: dict, timeout: float, cancel: Cancel,
        host: str | None = None, ca_file: str | None = None) -> Opened:
    """GET `target` (path and query) from `address`, naming `host` (default: the address) in SNI and the
    certificate check; returns once the head is in. Raises WebError. The caller's headers carry Host."""
    conn: urllib3.connection.HTTPConnection
    if scheme == "https":
        name = host or address
        conn = _HTTPS(address, port, timeout=timeout, server_hostname=name, assert_hostname=name,
                      cert_reqs="CERT_REQUIRED", ca_certs=ca_file)
    else:
        conn = _HTTP(address, port, timeout=timeout)
    conn.cancel = cancel
    try:
        conn.request("GET", target, headers=headers, preload_content=False, decode_content=False)
        return Opened(conn, conn.getresponse())
    except (urllib3.exceptions.SSLError, ssl.SSLError, CertificateError) as e:
        conn.close()
        raise WebError("tls", short(e)) from None
    except urllib3.exceptions.NewConnectionError as e:
        conn.close()  # refused or unreachable (urllib3 files this under timeouts)
        raise WebError("connect", short(e)) from None
    except (TimeoutError, urllib3.exceptions.TimeoutError) as e:
        conn.close()
        raise WebError("timeout", short(e)) from None
    except NET_ERRORS as e:
        conn.close()
        raise WebError("connect", short(e)) from None
    except BaseException:
        conn.close()
        raise


def read_body(opened: Opened, max_bytes: int, cancel: Cancel, before_each: Callable[[], object] | None = None,
              ) -> tuple[bytes, bool]:
    """(at most max_bytes of the decoded body, whether there was more); stops reading (and downloading) at the
    cap. before_each() runs before every receive (a deadline check that raises). Raises WebError."""
    try:
        decoder = Decoder(opened.header("Content-Encoding"))
    except UnknownEncoding as e:  # br, zstd, ...: the request offered none
        raise WebError("encoding", str(e)) from None
    try:
        chunks, total = [], 0
        while True:
            if before_each is not None:
                before_each()
            # read1: one receive at a time, so the byte cap and the deadline are checked between them.
            data = opened.resp.read1(READ_CHUNK, decode_content=False)
            if not data:
                break
            out = decoder.feed(data, max_bytes + 1 - total)
            chunks.append(out)
            total += len(out)
            if total > max_bytes:
                return b"".join(chunks)[:max_bytes], True
        if cancel.fired:
            raise WebError("broken", "the answer was cut")  # the end was the Cancel shutting the socket
        return b"".join(chunks), False
    except zlib.error as e:
        raise WebError("decode", str(e)) from None
    except (TimeoutError, urllib3.exceptions.TimeoutError) as e:
        raise WebError("timeout", short(e)) from None
    except NET_ERRORS as e:
        raise WebError("broken", short(e)) from None


def short(e) -> str:
    """An exception as a short phrase: urllib3 nests the cause in long reprs."""
    text = str(getattr(e, "reason", None) or e)
    return text.split(": ", 1)[-1][:200] if text else type(e).__name__


def get_url(url: str, headers: dict, seconds: float, max_bytes: int, cancel: Cancel) -> tuple[int, bytes, bool]:
    """(status, at most max_bytes of the decoded body, whether there was more) of one GET of an API's `url` (a search
    backend's: its name resolved as the system resolves it, not SSRF-checked like a page) on a fresh connection, with
    Host added to `headers`; `cancel` is armed with `seconds` over connect, head and body together and disarmed
    after. Raises WebError; the caller asks its Cancel first."""
    parts = urllib.parse.urlsplit(url)
    cancel.arm(seconds)
    opened = None
    try:
        opened = get(parts.scheme, parts.hostname or "", parts.port, parts.path + "?" + parts.query,
                     {"Host": parts.netloc, **headers}, seconds, cancel)
        body, too_big = read_body(opened, max_bytes, cancel)
        return opened.status, body, too_big
    finally:
        cancel.disarm()
        if opened is not None:
            opened.close()
