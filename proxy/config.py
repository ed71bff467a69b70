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
    stream_search: str = "server"  # "server": run searches inside streams; "client": pass calls on
    connect_timeout: float = 10.0
    read_timeout: float = 900.0  # longest silence tolerated from vLLM (a 250k-token prefill)
    keepalive_interval: float = 5.0  # SSE comment cadence while a search runs
    max_body_bytes: int = 64 * 1024 * 1024
    proxy_api_keys: tuple[str, ...] = ()
    anthropic_any_model: bool = False
