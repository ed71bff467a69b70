"""The SearXNG stand-in image's server: SearXNG's JSON search API and /healthz on :8080, configured by the
mounted settings.yml as the real image is; started by entrypoint.sh inside the image built by
tests/container/images.py.

What it takes from the real SearXNG: the settings file at SEARXNG_SETTINGS_PATH, the secret from
SEARXNG_SECRET or server.secret_key (it refuses to start with none or the shipped `ultrasecretkey`),
`format=json` answered only when search.formats lists json (403 otherwise), and one log line per
request on stdout, which the container tier reads to see what the proxy asked.
"""
import json
import os
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from standins.searxng import default_results, page  # noqa: E402

SETTINGS_PATH = os.environ.get("SEARXNG_SETTINGS_PATH", "/etc/searxng/settings.yml")
PORT = int(os.environ.get("GRANIAN_PORT", "8080"))


def load_settings() -> dict:
    with open(SETTINGS_PATH, encoding="utf-8") as f:
        settings = yaml.safe_load(f) or {}
    secret = os.environ.get("SEARXNG_SECRET") or (settings.get("server") or {}).get("secret_key")
    if not secret or secret == "ultrasecretkey":
        sys.exit("server.secret_key is not changed. Please use something else instead of ultrasecretkey.")
    return settings


SETTINGS = load_settings()
FORMATS = (SETTINGS.get("search") or {}).get("formats") or ["html"]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        print(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}", flush=True)

    def send(self, status: int, body: bytes, ctype: str):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        # What `wget --spider` (the healthcheck) sends; SearXNG's Flask routes answer HEAD like GET.
        self.do_GET()

    def do_GET(self):
        path, _, qs = self.path.partition("?")
        params = dict(urllib.parse.parse_qsl(qs, keep_blank_values=True))
        if path == "/healthz":
            return self.send(200, b"OK", "text/plain")
        if path != "/search":
            return self.send(404, b"Not Found", "text/plain")
        fmt = params.get("format", "html")
        if fmt not in FORMATS:
            return self.send(403, b"<html>Forbidden</html>", "text/html")
        q = params.get("q", "")
        if not q:
            return self.send(400, b'{"error": "No query"}', "application/json")
        return self.send(200, json.dumps(page(q, default_results(q))).encode(), "application/json")


if __name__ == "__main__":
    print(f"SearXNG stand-in listening on :{PORT} (settings {SETTINGS_PATH}, formats {FORMATS})", flush=True)
    ThreadingHTTPServer(("0.0.0.0", PORT), Handler).serve_forever()
