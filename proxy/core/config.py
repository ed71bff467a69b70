"""The proxy's settings as one immutable value, so tests can build an app for any backend.

proxy-passthrough.py fills it from the environment; nothing else reads the environment. Each field is checked
and put in its working form once, here (the networks parsed, the mode known), so no module parses a setting
again; a bad value is a ValueError that names its variable, which proxy-passthrough.py turns into one line.
"""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field, fields

from proxy.backends.netguard import parse_networks

STREAM_SEARCH_MODES = ("server", "client")
# When the Brave Search API is asked (BRAVE_SEARCH_MODE): only after every SearXNG instance failed, or first.
BRAVE_SEARCH_MODES = ("fallback", "always")
# Fields that must be above zero (a count of zero or a timeout of zero would make the proxy useless, not safer);
# caches and caps take 0 to mean off, so they only may not be negative.
_POSITIVE = ("searxng_results", "searxng_timeout", "max_search_iter", "connect_timeout", "read_timeout",
             "keepalive_interval", "max_body_bytes", "web_fetch_timeout", "web_fetch_max_bytes", "web_fetch_max_tokens",
             "web_fetch_extract_processes", "web_fetch_extract_cpu_seconds", "web_fetch_extract_memory_mb",
             "searxng_max_bytes")


@dataclass(frozen=True)
class Config:
    backend_url: str = "http://localhost:18080"
    backend_api_key: str = ""
    searxng_url: str = "http://host.docker.internal:8889"
    searxng_results: int = 5
    searxng_timeout: float = 15.0
    max_search_iter: int = 10
    inject_web_search: bool = True
    inject_web_fetch: bool = True  # web_fetch next to web_search (chat), open_page/find_in_page (Responses)
    stream_search: str = "server"  # "server": run searches inside streams; "client": pass calls on
    citations: bool = True  # number the sources the model reads and turn its [n] markers into each API's citations
    connect_timeout: float = 10.0
    read_timeout: float = 900.0  # longest silence tolerated from vLLM (a 250k-token prefill)
    keepalive_interval: float = 5.0  # SSE comment cadence while a search runs
    max_body_bytes: int = 64 * 1024 * 1024
    proxy_api_keys: tuple[str, ...] = ()
    anthropic_any_model: bool = False
    alpha_search_max_pages: int = 10  # open + find commands run per /v1/alpha/search request; the rest are named, not run
    # web_fetch (proxy/backends/fetcher.py). Networks exempt from the SSRF refusals (CIDR strings or ipaddress networks, kept as
    # networks); empty: public addresses only.
    web_fetch_allowed_networks: tuple = ()
    # The search cache (proxy/backends/cache.py; 0 in any of the three turns it off) and the proxy's metrics (proxy/observe/metrics.py).
    search_cache_ttl: float = 600.0
    search_cache_entries: int = 1000
    search_cache_bytes: int = 16 * 1024 * 1024
    proxy_metrics: bool = True
    metrics_dir: str = ""  # PROMETHEUS_MULTIPROC_DIR: gunicorn's workers sum their metrics through files there
    web_fetch_timeout: float = 20.0  # whole fetch, redirects included
    web_fetch_max_bytes: int = 5 * 1024 * 1024  # decoded body bytes read per page; the rest is never downloaded
    web_fetch_max_tokens: int = 20000  # text handed to the model, ~4 characters a token
    web_fetch_cache_ttl: float = 300.0
    web_fetch_cache_entries: int = 500
    web_fetch_cache_bytes: int = 32 * 1024 * 1024
    web_fetch_ca_file: str = ""  # a PEM bundle trusted instead of the system's CAs (a private CA; the tests)
    # Page extraction (proxy/backends/extract.py): child processes per worker, each page's CPU seconds and address space
    # (MiB), and the pages that may wait for a free child; a page over a limit is a tool error that names it.
    web_fetch_extract_processes: int = 2
    web_fetch_extract_cpu_seconds: float = 10.0
    web_fetch_extract_memory_mb: int = 1024
    web_fetch_extract_queue: int = 16
    # Caps on web_fetch calls (proxy/tools/session.py's ToolSession): per model turn and per client request.
    web_fetch_max_per_turn: int = 10
    web_fetch_max_per_request: int = 50
    searxng_max_bytes: int = 4 * 1024 * 1024  # a SearXNG answer's decoded bytes; a bigger one is a failed search
    # The keyed fallback search (proxy/backends/brave.py): off without a key; the key never shows in a repr.
    brave_search_api_key: str = field(default="", repr=False)
    brave_search_mode: str = "fallback"
    brave_search_url: str = "https://api.search.brave.com/res/v1/web/search"
    # SEARXNG_URL's instances in the order they are asked (proxy/backends/failover.py), each checked; set from it.
    searxng_urls: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self):
        if self.stream_search not in STREAM_SEARCH_MODES:
            raise ValueError(f"STREAM_SEARCH must be 'server' or 'client', not {self.stream_search!r}")
        if self.brave_search_mode not in BRAVE_SEARCH_MODES:
            raise ValueError(f"BRAVE_SEARCH_MODE must be 'fallback' or 'always', not {self.brave_search_mode!r}")
        # frozen: the one place a field is replaced by its working form
        object.__setattr__(self, "web_fetch_allowed_networks", parse_networks(self.web_fetch_allowed_networks))
        object.__setattr__(self, "searxng_urls", parse_urls("SEARXNG_URL", self.searxng_url))
        parse_urls("BRAVE_SEARCH_URL", self.brave_search_url, one=True)
        if self.brave_search_api_key and not re.fullmatch(r"[\x21-\x7e]+", self.brave_search_api_key):
            # Said without the key itself, which must not reach a log.
            raise ValueError("BRAVE_SEARCH_API_KEY has spaces or characters an HTTP header cannot carry")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value < 0 or (value == 0 and f.name in _POSITIVE):
                least = "above 0" if f.name in _POSITIVE else "0 or more"
                raise ValueError(f"{_variable(f.name)} must be {least}, not {value}")


def parse_urls(variable: str, text: str, one: bool = False) -> tuple[str, ...]:
    """The http(s) URLs in a comma- or space-separated list, in order, each once and without a trailing slash; a
    ValueError naming the first that cannot be asked (another scheme, no host, a bad port, credentials the proxy
    would not send, a query) and the variable. Pure."""
    urls: list[str] = []
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        try:
            parts = urllib.parse.urlsplit(item)
            _ = parts.port  # raises ValueError for a port that is not a number or out of range
        except ValueError:
            raise ValueError(f"{variable}: {item!r} has a bad port or address") from None
        if parts.username is not None or parts.password is not None:
            hidden = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()
            raise ValueError(f"{variable}: {hidden!r} carries a user name or password, which the proxy does not send")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{variable}: {item!r} is not an http:// or https:// URL with a host")
        if parts.query or parts.fragment:
            raise ValueError(f"{variable}: {item!r} has a query or fragment; give the instance's base URL")
        url = item.rstrip("/")
        if url not in urls:
            urls.append(url)
    if not urls:
        raise ValueError(f"{variable} names no URL")
    if one and len(urls) > 1:
        raise ValueError(f"{variable} takes one URL, not {len(urls)}")
    return tuple(urls)


def _variable(field: str) -> str:
    """The environment variable a field comes from, for messages."""
    return {"proxy_api_keys": "PROXY_API_KEY", "metrics_dir": "PROMETHEUS_MULTIPROC_DIR"}.get(field, field.upper())
