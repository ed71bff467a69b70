"""The proxy's settings as one immutable value, so tests can build an app for any backend.

proxy-passthrough.py fills it from the environment; nothing else reads the environment.
"""
from __future__ import annotations

from dataclasses import dataclass


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
    # web_fetch (proxy/fetch.py). Networks (CIDR strings) exempt from the SSRF refusals; empty: public addresses only.
    web_fetch_allowed_networks: tuple[str, ...] = ()
    web_fetch_timeout: float = 20.0  # whole fetch, redirects included
    web_fetch_max_bytes: int = 5 * 1024 * 1024  # decoded body bytes read per page; the rest is never downloaded
    web_fetch_max_tokens: int = 20000  # text handed to the model, ~4 characters a token
    web_fetch_cache_ttl: float = 300.0
    web_fetch_cache_bytes: int = 32 * 1024 * 1024
    web_fetch_ca_file: str = ""  # a PEM bundle trusted instead of the system's CAs (a private CA; the tests)
