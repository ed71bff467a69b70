"""What one gunicorn worker's requests share, built once by create_app(config) and handed to every API the same
way (through each request's Exchange): the settings, the vLLM client, SearXNG behind the search cache, the page
fetcher with its cache and extraction pool, and vLLM's served model names. Not run on its own.

Nothing here is module state: two apps in one process (the tests build many) share nothing.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.backends.fetcher import Fetcher
from proxy.backends.searxng import SearXNG
from proxy.core import codec
from proxy.core.config import Config
from proxy.observe import metrics
from proxy.transport.vllm import Backend, UpstreamError

if TYPE_CHECKING:  # only ServedModels' annotation: exchange.py imports this module
    from proxy.engine.exchange import Exchange

log = logging.getLogger("proxy")

MODELS_TTL = 60.0  # seconds a /v1/models answer is trusted for ANTHROPIC_ANY_MODEL


class ServedModels:
    """vLLM's model names (GET /v1/models), asked with a client's credentials and kept briefly."""

    def __init__(self):
        self._names: list[str] | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def get(self, ex: Exchange) -> list[str] | None:
        """The names, or None when vLLM can't tell (it is down, or answers something else)."""
        with self._lock:
            if self._names and time.monotonic() - self._at < MODELS_TTL:
                return self._names
        headers = [(n, v) for n, v in ex.headers if n.lower() in ("authorization", "x-api-key")]
        try:
            call = ex.call("GET", "/v1/models", None, headers)
            raw = call.read()
            names = [str(m["id"]) for m in codec.loads(raw).get("data") or [] if isinstance(m, dict) and m.get("id")]
        except (UpstreamError, ValueError, AttributeError) as e:
            log.warning("ANTHROPIC_ANY_MODEL: cannot list vLLM's models: %s", e)
            return None
        if call.response.status != 200 or not names:
            return None
        with self._lock:
            self._names, self._at = names, time.monotonic()
        return names


@dataclass
class Services:
    cfg: Config
    backend: Backend
    searxng: SearXNG    # behind the search cache, metered (proxy/observe/metrics.py's instrument)
    fetcher: Fetcher    # its page cache is shared by all the worker's requests, alpha search's too
    models: ServedModels = field(default_factory=ServedModels)

    @classmethod
    def build(cls, cfg: Config) -> Services:
        backend = Backend(cfg.backend_url, cfg.connect_timeout, cfg.read_timeout, cfg.backend_api_key)
        searxng = SearXNG(cfg.searxng_urls[0], cfg.searxng_results, cfg.searxng_timeout, cfg.searxng_max_bytes)
        searxng, fetcher = metrics.instrument(cfg, searxng, Fetcher(cfg))
        return cls(cfg, backend, searxng, fetcher)
