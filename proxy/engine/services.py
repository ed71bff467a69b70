"""What one gunicorn worker's requests share, handed to every API the same way (through each request's Exchange):
the settings, the vLLM client, the backends the tools run on (the search backend and the page fetcher, with
their caches and meters), the event hub, and vLLM's served model names. Put together by proxy/http/wiring.py;
not run on its own.

Nothing here is module state: two apps in one process (the tests build many) share nothing.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.backends.pages.fetcher import PageFetcher
from proxy.backends.search.search import SearchBackend
from proxy.backends.state.cache import TTLCache
from proxy.backends.state.state import MemoryState, State, StateDown  # noqa: F401 (MemoryState: for the APIs)
from proxy.core import codec
from proxy.core.config import Config
from proxy.engine.admission import Queue
from proxy.engine.events import Events
from proxy.tools.base import Backends
from proxy.tools.client_reads import ClientReads, Reads
from proxy.transport.vllm import Backend, UpstreamError

log = logging.getLogger("proxy")

MODELS_TTL = 60.0  # seconds a /v1/models answer is trusted for ANTHROPIC_ANY_MODEL
KEPT_ENTRIES = 100_000  # a bound on the count beside the bytes: each entry's key and bookkeeping cost memory too


class KeptResults:
    """What the model read for each of the proxy's tool calls, by the id the client knows the call by, for an API
    whose client keeps no copy (Responses' web_search_call carries only its action; an Anthropic error block only
    its code): a later request that replays the call gives the model the same bytes again. Bounded, with a time to
    live: on the shared state store when STATE_URL names one (so a replay served by another worker or replica
    still finds it), else in this worker's memory. A store that is down loses a replay's exactness, never the
    request: the replay reads its stand-in."""

    USE = "kept"  # the state store's namespace for these records

    def __init__(self, ttl: float, max_bytes: int, clock: Callable[[], float] = time.monotonic,
                 state: State | None = None):
        self._cache: TTLCache[dict[str, str]] = TTLCache(ttl, KEPT_ENTRIES, max_bytes, _kept_size, clock=clock)
        self._state = state
        self._ttl = ttl if max_bytes > 0 else 0.0

    def get(self, key: str) -> dict[str, str] | None:
        """The record kept under `key`, or None (never kept, expired, pushed out, or the store is down)."""
        if self._state is not None and self._ttl > 0:
            try:
                found = self._state.get(self.USE, key)
            except StateDown:
                return None
            return found.value if found is not None and isinstance(found.value, dict) else None
        hit = self._cache.get(key)
        return None if hit is None else hit.value

    def put(self, key: str, value: dict[str, str]) -> None:
        if self._state is not None and self._ttl > 0:
            try:
                self._state.put(self.USE, key, value, self._ttl)  # False past the store's value size: not kept
            except StateDown:
                log.warning("state store down: a result for replays not kept")
            return
        self._cache.put(key, value)


def _kept_size(value: dict[str, str]) -> int:
    return sum(len(k) + len(v.encode("utf-8", "replace")) for k, v in value.items())


class ServedModels:
    """vLLM's model names (GET /v1/models), asked with a client's credentials and kept briefly. Worker-wide,
    so the caller passes the one request that may ask: `ask()` gives vLLM's raw answer (status, body)."""

    def __init__(self):
        self._names: list[str] | None = None
        self._at = 0.0
        self._lock = threading.Lock()

    def get(self, ask: Callable[[], tuple[int, bytes]]) -> list[str] | None:
        """The names, or None when vLLM can't tell (it is down, or answers something else)."""
        with self._lock:
            if self._names and time.monotonic() - self._at < MODELS_TTL:
                return self._names
        try:
            status, raw = ask()
            names = [str(m["id"]) for m in codec.loads(raw).get("data") or [] if isinstance(m, dict) and m.get("id")]
        except (UpstreamError, ValueError, AttributeError) as e:  # the model name stays as the client wrote it
            log.warning("ANTHROPIC_ANY_MODEL: cannot list vLLM's models: %s", e)
            return None
        if status != 200 or not names:
            return None
        with self._lock:
            self._names, self._at = names, time.monotonic()
        return names


@dataclass
class Services:
    cfg: Config
    backend: Backend        # vLLM
    search: SearchBackend   # SearXNG behind the search cache (and the meters, with PROXY_METRICS)
    fetcher: PageFetcher    # its page cache is shared by all the worker's requests, alpha search's too
    events: Events = field(default_factory=Events)
    models: ServedModels = field(default_factory=ServedModels)
    # What the model read of the proxy's calls on /v1/responses, for the turns that replay them (off by default here;
    # wiring sizes it from the Config).
    kept: KeptResults = field(default_factory=lambda: KeptResults(0, 0))
    # The shared state store (STATE_URL; proxy/backends/state/state.py), or None: each use keeps its state in this process.
    state: State | None = None
    # What each client read and how many links it followed, over an hour: URL provenance's memory across requests
    # (in this worker, or in the shared store with STATE_URL: SharedReads).
    reads: Reads = field(default_factory=ClientReads)
    # GET /proxy/search/health's JSON: the search failover's state in this worker (proxy/backends/search/failover.py).
    search_health: Callable[[], dict] = dict
    # The fair queue in front of the card (MAX_NUM_SEQS); None: every call goes straight to vLLM.
    queue: Queue | None = None

    @property
    def tool_backends(self) -> Backends:
        return Backends(self.search, self.fetcher)
