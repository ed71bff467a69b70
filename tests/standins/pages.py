"""Web pages on loopback for the fetch tests: `PageServer(pages, tls=...)` serves a dict of
path -> (content type, body) over HTTP, or over HTTPS with a throw-away self-signed certificate
for 127.0.0.1 (made with the openssl command; `.ca_file` is what a client must trust), and records
every request (path and headers).

Claude Code's WebFetch upgrades every http:// URL to https://, so its tests need the TLS form;
the proxy's fetch core is tested over plain HTTP. Used from tests, never by the stack.
"""
from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class PageRequest:
    path: str
    headers: dict


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1 and localhost, valid for two days."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is needed to make a test certificate (apt-get install openssl)")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


class PageServer:
    def __init__(self, pages: dict[str, tuple[str, bytes]], tls: bool = False):
        self.pages = dict(pages)
        self.requests: list[PageRequest] = []
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="pages-"))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.ca_file = None
        if tls:
            cert, key = self_signed_cert(self._dir)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.ca_file = cert
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self):
        with self._lock:
            self.requests.clear()

    @property
    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _handler(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with outer._lock:
                    outer.requests.append(PageRequest(self.path, {k.lower(): v for k, v in self.headers.items()}))
                ctype, body = outer.pages.get(self.path.split("?", 1)[0], ("text/plain", None))
                status = 200 if body is not None else 404
                body = body if body is not None else b"not found"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
