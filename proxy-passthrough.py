"""OpenAI-compatible proxy in front of vLLM that gives every client a working web_search.

Run: `python proxy-passthrough.py` for development (Flask's server on PROXY_BIND), or, as the
container does, `gunicorn --config gunicorn.conf.py proxy-passthrough:app`. The code lives in
the package proxy/ beside this file, one module per API; configuration is read here, once.
"""
import logging
import os
import sys

from proxy.core.config import Config
from proxy.http.app import create_app


def _die(message: str):
    # One line naming the variable, not a traceback: gunicorn prints it and the container exits non-zero.
    sys.exit(f"proxy-passthrough.py: {message}")


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None or value == "" else value.strip().lower() in ("1", "true", "yes", "on")


def _number(kind, name: str, default: str):
    text = os.environ.get(name, "") or default
    try:
        return kind(text)
    except ValueError:
        _die(f"{name} must be {'a whole number' if kind is int else 'a number'}, not {text!r}")


def _int(name: str, default: str) -> int:
    return _number(int, name, default)


def _float(name: str, default: str) -> float:
    return _number(float, name, default)


# Where vLLM listens: http://vllm:8000 inside the compose stack.
BACKEND_URL = os.environ.get("BACKEND_URL", "http://localhost:18080")
# Sent to vLLM as `Authorization: Bearer ...` when vLLM runs with --api-key.
BACKEND_API_KEY = os.environ.get("BACKEND_API_KEY", "")
# The SearXNG instances the searches go to, comma- or space-separated, asked in this order (the next when one fails);
# each must allow format=json.
SEARXNG_URL = os.environ.get("SEARXNG_URL", "http://host.docker.internal:8889")
SEARXNG_RESULTS = _int("SEARXNG_RESULTS", "5")
SEARXNG_TIMEOUT = _float("SEARXNG_TIMEOUT", "15")
# Search rounds one request may run before the client gets an error.
MAX_SEARCH_ITER = _int("MAX_SEARCH_ITER", "10")
INJECT_WEB_SEARCH = _flag("INJECT_WEB_SEARCH", True)
INJECT_WEB_FETCH = _flag("INJECT_WEB_FETCH", True)
# "server" runs searches inside streams; "client" passes web_search calls to the client.
STREAM_SEARCH = os.environ.get("STREAM_SEARCH", "server").strip().lower()
# Number the sources the model reads and turn its [n] markers into each API's citations (off: neither).
CITATIONS = _flag("CITATIONS", True)
CONNECT_TIMEOUT = _float("CONNECT_TIMEOUT", "10")
# Longest silence tolerated from vLLM; a 250k-token prefill is minutes of it.
READ_TIMEOUT = _float("READ_TIMEOUT", "900")
KEEPALIVE_INTERVAL = _float("KEEPALIVE_INTERVAL", "5")
# 64 MiB: a 253,952-token prompt is about 1 MB of JSON, so this is headroom, not a squeeze.
MAX_BODY_BYTES = _int("MAX_BODY_BYTES", "67108864")
# Comma-separated keys clients must present; empty leaves the proxy open.
PROXY_API_KEY = os.environ.get("PROXY_API_KEY", "")
# Answer unknown model names on /v1/messages (Claude Code's claude-...) with the served model.
ANTHROPIC_ANY_MODEL = _flag("ANTHROPIC_ANY_MODEL", False)
# open + find commands one /v1/alpha/search request may run (each fetches a page); Codex sends one or two.
ALPHA_SEARCH_MAX_PAGES = _int("ALPHA_SEARCH_MAX_PAGES", "10")
# web_fetch: comma-separated CIDRs exempt from the SSRF refusals (a LAN wiki: 192.168.1.0/24); empty: public only.
WEB_FETCH_ALLOWED_NETWORKS = os.environ.get("WEB_FETCH_ALLOWED_NETWORKS", "")
# Seconds one fetch may take, redirects included; an agent is blocked on the tool result meanwhile.
WEB_FETCH_TIMEOUT = _float("WEB_FETCH_TIMEOUT", "20")
# 5 MiB of decoded body per page; the rest is never downloaded.
WEB_FETCH_MAX_BYTES = _int("WEB_FETCH_MAX_BYTES", "5242880")
# Page text handed to the model, in tokens of ~4 characters; a request may ask for less.
WEB_FETCH_MAX_TOKENS = _int("WEB_FETCH_MAX_TOKENS", "20000")
WEB_FETCH_CACHE_TTL = _float("WEB_FETCH_CACHE_TTL", "300")
# The same, under the name beside SEARCH_CACHE_TTL; when set it wins over WEB_FETCH_CACHE_TTL.
FETCH_CACHE_TTL = _float("FETCH_CACHE_TTL", "") if os.environ.get("FETCH_CACHE_TTL") else WEB_FETCH_CACHE_TTL
# Pages the cache keeps per worker, and their bytes (32 MiB); least recently used out first.
WEB_FETCH_CACHE_ENTRIES = _int("WEB_FETCH_CACHE_ENTRIES", "500")
WEB_FETCH_CACHE_BYTES = _int("WEB_FETCH_CACHE_BYTES", "33554432")
# A PEM bundle trusted instead of the system's CAs, for an allow-listed host with a private CA.
WEB_FETCH_CA_FILE = os.environ.get("WEB_FETCH_CA_FILE", "")
# HTML extraction runs in child processes of each worker, each page under a CPU-time and a memory limit
# (a 5 MiB page of ordinary HTML takes a few seconds and a few hundred MiB); a page over one is a tool error.
WEB_FETCH_EXTRACT_PROCESSES = _int("WEB_FETCH_EXTRACT_PROCESSES", "2")
WEB_FETCH_EXTRACT_CPU_SECONDS = _float("WEB_FETCH_EXTRACT_CPU_SECONDS", "10")
WEB_FETCH_EXTRACT_MEMORY_MB = _int("WEB_FETCH_EXTRACT_MEMORY_MB", "1024")
# Pages waiting for a free extraction process; more than this at once are refused as busy.
WEB_FETCH_EXTRACT_QUEUE = _int("WEB_FETCH_EXTRACT_QUEUE", "16")
# web_fetch calls run per model turn and per client request; the model reads that it hit the cap.
WEB_FETCH_MAX_PER_TURN = _int("WEB_FETCH_MAX_PER_TURN", "10")
WEB_FETCH_MAX_PER_REQUEST = _int("WEB_FETCH_MAX_PER_REQUEST", "50")
# Largest SearXNG answer read (4 MiB; five results are a few kB); a bigger one is a failed search.
SEARXNG_MAX_BYTES = _int("SEARXNG_MAX_BYTES", "4194304")
# Seconds a search answer with results is reused (agents repeat queries within minutes); 0 turns the cache off.
SEARCH_CACHE_TTL = _float("SEARCH_CACHE_TTL", "600")
# Bounds of the search cache, per gunicorn worker: answers kept, and their bytes (16 MiB).
SEARCH_CACHE_ENTRIES = _int("SEARCH_CACHE_ENTRIES", "1000")
SEARCH_CACHE_BYTES = _int("SEARCH_CACHE_BYTES", "16777216")
# A Brave Search API key turns on the keyed fallback search; empty: SearXNG only. Never logged.
BRAVE_SEARCH_API_KEY = os.environ.get("BRAVE_SEARCH_API_KEY", "").strip()
# "fallback": Brave is asked only when every SearXNG instance failed; "always": Brave first, SearXNG when it fails.
BRAVE_SEARCH_MODE = os.environ.get("BRAVE_SEARCH_MODE", "fallback").strip().lower() or "fallback"
# Brave's Web Search endpoint; another only for a relay in front of it (or the tests' stand-in).
BRAVE_SEARCH_URL = (os.environ.get("BRAVE_SEARCH_URL", "https://api.search.brave.com/res/v1/web/search")
                    or "https://api.search.brave.com/res/v1/web/search")
# The proxy's own metrics at /proxy/metrics; off, nothing is recorded.
PROXY_METRICS = _flag("PROXY_METRICS", True)
# Where gunicorn's workers keep their metric values so one scrape sums them all (prometheus_client's
# multiprocess mode reads the same variable); the image sets it. Empty: one process's own metrics.
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
LOG_LEVEL = os.environ.get("LOG_LEVEL", "info").upper()
PROXY_BIND = os.environ.get("PROXY_BIND", "0.0.0.0:11433")

logging.basicConfig(level=LOG_LEVEL, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

try:
    CONFIG = Config(
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
        alpha_search_max_pages=ALPHA_SEARCH_MAX_PAGES,
        web_fetch_allowed_networks=tuple(WEB_FETCH_ALLOWED_NETWORKS.split(",")),  # Config parses and checks them
        search_cache_ttl=SEARCH_CACHE_TTL,
        search_cache_entries=SEARCH_CACHE_ENTRIES,
        search_cache_bytes=SEARCH_CACHE_BYTES,
        proxy_metrics=PROXY_METRICS,
        metrics_dir=PROMETHEUS_MULTIPROC_DIR,
        web_fetch_timeout=WEB_FETCH_TIMEOUT,
        web_fetch_max_bytes=WEB_FETCH_MAX_BYTES,
        web_fetch_max_tokens=WEB_FETCH_MAX_TOKENS,
        web_fetch_cache_ttl=FETCH_CACHE_TTL,
        web_fetch_cache_entries=WEB_FETCH_CACHE_ENTRIES,
        web_fetch_cache_bytes=WEB_FETCH_CACHE_BYTES,
        web_fetch_ca_file=WEB_FETCH_CA_FILE,
        web_fetch_extract_processes=WEB_FETCH_EXTRACT_PROCESSES,
        web_fetch_extract_cpu_seconds=WEB_FETCH_EXTRACT_CPU_SECONDS,
        web_fetch_extract_memory_mb=WEB_FETCH_EXTRACT_MEMORY_MB,
        web_fetch_extract_queue=WEB_FETCH_EXTRACT_QUEUE,
        web_fetch_max_per_turn=WEB_FETCH_MAX_PER_TURN,
        web_fetch_max_per_request=WEB_FETCH_MAX_PER_REQUEST,
        searxng_max_bytes=SEARXNG_MAX_BYTES,
        brave_search_api_key=BRAVE_SEARCH_API_KEY,
        brave_search_mode=BRAVE_SEARCH_MODE,
        brave_search_url=BRAVE_SEARCH_URL,
    )
except ValueError as e:  # Config checks every value once, and its message names the variable
    _die(str(e))

app = create_app(CONFIG)

if __name__ == "__main__":
    host, _, port = PROXY_BIND.rpartition(":")
    app.run(host=host or "0.0.0.0", port=int(port), threaded=True)
