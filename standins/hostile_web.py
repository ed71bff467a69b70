"""A hostile web server on loopback for tests/test_hostile_web.py and scripts/bench_hostile.py: each path is
one way a page can try to hang, crash or starve the proxy's web_fetch, written on a raw socket so the
server can break HTTP where http.server would not (a status line dripped a byte a second, endless chunk
lines, a body that decompresses a thousandfold).

Start it with `HostileWeb()`; `url(path)` names a behaviour in BEHAVIOURS; `close()` stops it. Every request
is recorded (`requests`, their paths) and every connection still open is counted (`open_now`).
"""
from __future__ import annotations

import functools
import gzip
import socket
import threading
import time
import zlib

from .server import SocketStandIn

# A paragraph of ordinary article text: big pages repeat it between navigation, scripts and code blocks.
PARAGRAPH = ("<p>The scheduler keeps a queue of waiting requests and admits them while the key-value cache has room; "
             "each step it picks the sequences to run, and a sequence that cannot grow is preempted.</p>")
CODE = "<pre><code>def admit(request):\n    return cache.free() &gt;= request.blocks\n</code></pre>"
NAV = "<nav><ul>" + "".join(f'<li><a href="/{i}">Section {i}</a></li>' for i in range(40)) + "</ul></nav>"


def big_page(size: int, title: str = "Scheduler notes") -> bytes:
    """An HTML page of about `size` bytes shaped like a long documentation page: navigation, scripts,
    sections of paragraphs and code blocks."""
    head = f"<!doctype html><html><head><title>{title}</title><script>var x = 1;</script></head><body>{NAV}<main>"
    section = "<section><h2>Admission</h2>" + PARAGRAPH * 6 + CODE + "</section>"
    n = max(1, (size - len(head)) // len(section))
    return (head + section * n + "</main><footer>Copyright</footer></body></html>").encode()


def _head(status: str, headers: list[tuple[str, str]]) -> bytes:
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1")


def _send_page(sock, body: bytes, ctype: str = "text/html; charset=utf-8", extra=()):
    sock.sendall(_head("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body))),
                                  ("Connection", "close"), *extra]) + body)


def _drip(sock, data: bytes, every: float, stop: threading.Event):
    for i in range(len(data)):
        if stop.wait(every):
            return
        sock.sendall(data[i:i + 1])


def slow_status(sock, stop):
    """The status line one byte a second, then endless header bytes."""
    _drip(sock, b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000, 1.0, stop)


def slow_head(sock, stop):
    """A status line at once, then one header byte a second: each receive is within any timeout."""
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
    _drip(sock, b"X-Slow: " + b"a" * 10_000, 1.0, stop)


def many_headers(sock, stop):
    """Short header lines two a second, for ever."""
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
    i = 0
    while not stop.wait(0.5):
        sock.sendall(b"X-%d: a\r\n" % i)
        i += 1


def endless_chunk_extension(sock, stop):
    """A chunk-size line whose extension never ends."""
    sock.sendall(_head("200 OK", [("Content-Type", "text/html"), ("Transfer-Encoding", "chunked")]) + b"5;ext=")
    while not stop.wait(0.01):
        sock.sendall(b"x" * 4096)


def slow_chunks(sock, stop):
    """Chunks of one byte, two a second, for ever: the body never ends and never grows big."""
    sock.sendall(_head("200 OK", [("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")]))
    while not stop.wait(0.5):
        sock.sendall(b"1;a=b\r\na\r\n")


@functools.cache
def _bomb(kind: str) -> bytes:
    # Compressed once per run (seconds of CPU), so the first request is not slower than the proxy's deadline.
    if kind == "gzip":
        return gzip.compress(b"<p>" + b"\0" * 200_000_000, compresslevel=9)
    return zlib.compress(b"a" * 200_000_000, 9)


def gzip_bomb(sock, stop):
    """200 MB of zeros as about 200 KB of gzip."""
    _send_page(sock, _bomb("gzip"), extra=[("Content-Encoding", "gzip")])


def deflate_bomb(sock, stop):
    """200 MB of one letter as about 200 KB of deflate."""
    _send_page(sock, _bomb("deflate"), "text/plain", extra=[("Content-Encoding", "deflate")])


def deep_nesting(sock, stop):
    """A page nested 200,000 elements deep (a recursion bomb for tree walkers)."""
    _send_page(sock, b"<html><head><title>Deep</title></head><body>" + b"<div>" * 200_000 + b"deep text"
               + b"</div>" * 200_000 + b"</body></html>")


def wide_table(sock, stop):
    """Four MB of one table with 200,000 tiny cells: a pathological page for a scorer."""
    _send_page(sock, b"<html><body><table>" + b"<tr>" + b"<td>x</td>" * 200_000 + b"</tr></table></body></html>")


def deep_boxes(sock, stop):
    """Five MB of paragraphs, each inside 200 nested boxes: every box is a candidate for a scorer that weighs text."""
    unit = b"<div>" * 200 + b"<p>Some words of text, with a comma here and there, to score.</p>" + b"</div>" * 200
    _send_page(sock, b"<html><body>" + unit * (5_000_000 // len(unit)) + b"</body></html>")


def charset(name: str):
    def serve(sock, stop):
        _send_page(sock, "<html><body><p>Caf\u00e9 text</p></body></html>".encode(), f"text/html; charset={name}")
    serve.__doc__ = f"A page served with charset={name}."
    return serve


def meta_charset(name: str):
    def serve(sock, stop):
        _send_page(sock, f"<html><head><meta charset={name}></head><body><p>Caf\u00e9 text</p></body></html>".encode(),
                   "text/html")
    return serve


def redirect(location: str):
    def serve(sock, stop):
        sock.sendall(_head("302 Found", [("Location", location), ("Content-Length", "0"), ("Connection", "close")]))
    return serve


def huge(size: int):
    page = big_page(size)

    def serve(sock, stop):
        _send_page(sock, page)
    return serve


def json_body(body: bytes):
    def serve(sock, stop):
        _send_page(sock, body, "application/json")
    return serve


def endless_json(sock, stop):
    """A JSON answer that never ends: `{"results": [` and then results for as long as the reader reads."""
    sock.sendall(_head("200 OK", [("Content-Type", "application/json"), ("Connection", "close")]) + b'{"results": [')
    item = b'{"url": "https://x.example/", "title": "t", "content": "' + b"c" * 1000 + b'"},'
    while not stop.is_set():
        sock.sendall(item * 64)


BEHAVIOURS = {
    "/slow-status": slow_status,
    "/slow-head": slow_head,
    "/many-headers": many_headers,
    "/endless-chunk-extension": endless_chunk_extension,
    "/slow-chunks": slow_chunks,
    "/gzip-bomb": gzip_bomb,
    "/deflate-bomb": deflate_bomb,
    "/deep": deep_nesting,
    "/wide-table": wide_table,
    "/deep-boxes": deep_boxes,
    "/rot13": charset("rot13"),
    "/base64": charset("base64"),
    "/zlib": charset("zlib"),
    "/meta-hex": meta_charset("hex"),
    "/redirect-loop": redirect("/redirect-loop"),
    "/redirect-malformed": redirect("http://[::1"),
    "/redirect-bad-port": redirect("http://127.0.0.1:99999/"),
    "/huge-2mb": huge(2 * 1024 * 1024),
    "/huge-5mb": huge(5 * 1024 * 1024),
    # SearXNG answers: point SEARXNG_URL at url(path); the proxy asks for path + "/search?...".
    "/searx-results-5": json_body(b'{"results": 5}'),
    "/searx-wrong-types": json_body(b'{"results": [{"url": 5, "title": []}, "x", {"url": "https://ok.example/", '
                                    b'"title": {"a": 1}, "content": [1], "publishedDate": 7}], "answers": 5, '
                                    b'"infoboxes": [{"infobox": [], "content": {}}], "unresponsive_engines": "x"}'),
    "/searx-endless": endless_json,
}


class HostileWeb(SocketStandIn):
    def __init__(self, host: str = "127.0.0.1"):
        self.requests: list[str] = []
        self.open_now = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()  # ends the behaviours that would write for ever
        _bomb("gzip"), _bomb("deflate")
        super().__init__(host)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._stop.set()
        super().close()

    def serve(self, conn: socket.socket, index: int) -> None:
        with self._lock:
            self.open_now += 1
        try:
            conn.settimeout(30)
            head = self.read_head(conn)
            if head is None:
                return
            path = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"
            with self._lock:
                self.requests.append(path)
            base = path.split("?", 1)[0]
            serve = BEHAVIOURS.get(base) or BEHAVIOURS.get(base.removesuffix("/search"))
            if serve is None:
                conn.sendall(_head("404 Not Found", [("Content-Length", "0"), ("Connection", "close")]))
            else:
                serve(conn, self._stop)
        except OSError:
            pass  # the proxy hung up (its deadline or cap): what the test wanted
        finally:
            with self._lock:
                self.open_now -= 1
            time.sleep(0.05)  # let the last bytes leave before the close
            conn.close()
