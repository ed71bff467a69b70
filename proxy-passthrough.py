"""OpenAI-compatible proxy in front of vLLM that gives every client a working web_search.

Run: `python proxy-passthrough.py` for development (Flask's server on PROXY_BIND), or, as the
container does, `gunicorn --config gunicorn.conf.py proxy-passthrough:app`. The code lives in
the package proxy/ beside this file, one module per API; configuration is read here, once.
"""
import logging
import os

from proxy.app import create_app
from proxy.config import Config
from proxy.netguard import parse_networks


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None or value == "" else value.strip().lower() in ("1", "true", "yes", "on")


# Where vLLM listens: http://vllm:8000 inside the compose stack.
BACKEND_URL = os.environ.get("BACKEND_URL", "http://localhost:18080")
# Sent to vLLM as `Authorization: Bearer ...` when vLLM runs with --api-key.
BACKEND_API_KEY = os.environ.get("BACKEND_API_KEY", "")
# The SearXNG instance the searches go to; it must allow format=json.
SEARXNG_URL = os.environ.get("SEARXNG_URL", "http://host.docker.internal:8889")
SEARXNG_RESULTS = int(os.environ.get("SEARXNG_RESULTS", "5"))
SEARXNG_TIMEOUT = float(os.environ.get("SEARXNG_TIMEOUT", "15"))
# Search rounds one request may run before the client gets an error.
MAX_SEARCH_ITER = int(os.environ.get("MAX_SEARCH_ITER", "10"))
INJECT_WEB_SEARCH = _flag("INJECT_WEB_SEARCH", True)
INJECT_WEB_FETCH = _flag("INJECT_WEB_FETCH", True)
# "server" runs searches inside streams; "client" passes web_search calls to the client.
STREAM_SEARCH = os.environ.get("STREAM_SEARCH", "server").strip().lower()
# Number the sources the model reads and turn its [n] markers into each API's citations (off: neither).
CITATIONS = _flag("CITATIONS", True)
CONNECT_TIMEOUT = float(os.environ.get("CONNECT_TIMEOUT", "10"))
# Longest silence tolerated from vLLM; a 250k-token prefill is minutes of it.
READ_TIMEOUT = float(os.environ.get("READ_TIMEOUT", "900"))
KEEPALIVE_INTERVAL = float(os.environ.get("KEEPALIVE_INTERVAL", "5"))
# 64 MiB: a 253,952-token prompt is about 1 MB of JSON, so this is headroom, not a squeeze.
MAX_BODY_BYTES = int(os.environ.get("MAX_BODY_BYTES", "67108864"))
# Comma-separated keys clients must present; empty leaves the proxy open.
PROXY_API_KEY = os.environ.get("PROXY_API_KEY", "")
# Answer unknown model names on /v1/messages (Claude Code's claude-...) with the served model.
ANTHROPIC_ANY_MODEL = _flag("ANTHROPIC_ANY_MODEL", False)
# web_fetch: comma-separated CIDRs exempt from the SSRF refusals (a LAN wiki: 192.168.1.0/24); empty: public only.
WEB_FETCH_ALLOWED_NETWORKS = os.environ.get("WEB_FETCH_ALLOWED_NETWORKS", "")
# Seconds one fetch may take, redirects included; an agent is blocked on the tool result meanwhile.
WEB_FETCH_TIMEOUT = float(os.environ.get("WEB_FETCH_TIMEOUT", "20"))
# 5 MiB of decoded body per page; the rest is never downloaded.
WEB_FETCH_MAX_BYTES = int(os.environ.get("WEB_FETCH_MAX_BYTES", "5242880"))
# Page text handed to the model, in tokens of ~4 characters; a request may ask for less.
WEB_FETCH_MAX_TOKENS = int(os.environ.get("WEB_FETCH_MAX_TOKENS", "20000"))
WEB_FETCH_CACHE_TTL = float(os.environ.get("WEB_FETCH_CACHE_TTL", "300"))
WEB_FETCH_CACHE_BYTES = int(os.environ.get("WEB_FETCH_CACHE_BYTES", "33554432"))
# A PEM bundle trusted instead of the system's CAs, for an allow-listed host with a private CA.
WEB_FETCH_CA_FILE = os.environ.get("WEB_FETCH_CA_FILE", "")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "info").upper()
PROXY_BIND = os.environ.get("PROXY_BIND", "0.0.0.0:11433")

if STREAM_SEARCH not in ("server", "client"):
    raise SystemExit(f"proxy-passthrough.py: STREAM_SEARCH must be 'server' or 'client', not {STREAM_SEARCH!r}")

try:
    parse_networks(WEB_FETCH_ALLOWED_NETWORKS)
except ValueError as e:
    raise SystemExit(f"proxy-passthrough.py: {e}") from None

logging.basicConfig(level=LOG_LEVEL, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

app = create_app(Config(
    backend_url=BACKEND_URL,
    backend_api_key=BACKEND_API_KEY,
    searxng_url=SEARXNG_URL,
    searxng_results=SEARXNG_RESULTS,
    searxng_timeout=SEARXNG_TIMEOUT,
    max_search_iter=MAX_SEARCH_ITER,
    inject_web_search=INJECT_WEB_SEARCH,
    inject_web_fetch=INJECT_WEB_FETCH,
    stream_search=STREAM_SEARCH,
    citations=CITATIONS,
    connect_timeout=CONNECT_TIMEOUT,
    read_timeout=READ_TIMEOUT,
    keepalive_interval=KEEPALIVE_INTERVAL,
    max_body_bytes=MAX_BODY_BYTES,
    proxy_api_keys=tuple(k.strip() for k in PROXY_API_KEY.split(",") if k.strip()),
    anthropic_any_model=ANTHROPIC_ANY_MODEL,
    web_fetch_allowed_networks=tuple(n.strip() for n in WEB_FETCH_ALLOWED_NETWORKS.split(",") if n.strip()),
    web_fetch_timeout=WEB_FETCH_TIMEOUT,
    web_fetch_max_bytes=WEB_FETCH_MAX_BYTES,
    web_fetch_max_tokens=WEB_FETCH_MAX_TOKENS,
    web_fetch_cache_ttl=WEB_FETCH_CACHE_TTL,
    web_fetch_cache_bytes=WEB_FETCH_CACHE_BYTES,
    web_fetch_ca_file=WEB_FETCH_CA_FILE,
))

if __name__ == "__main__":
    host, _, port = PROXY_BIND.rpartition(":")
    app.run(host=host or "0.0.0.0", port=int(port), threaded=True)
