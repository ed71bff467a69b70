"""A bounded cache with a time to live and one computation in flight per key (TTLCache): the one cache
mechanism of the proxy, under SearXNG's answers (proxy/backends/search/search.py's CachedSearch) and fetched pages
(proxy/backends/pages/fetcher.py's Fetcher). With STATE_URL set, each has a SharedTier too: a value this process lacks is
looked up in the shared store (proxy/backends/state/state.py) before it is computed, and one it computed is put there.

Not run on its own; tests/test_cache.py checks TTLCache with a fake clock and no network, tests/test_state.py the
shared tier on a real redis-server, and tests/test_metrics.py and tests/test_fetch.py the caches built on it.
"""
from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from proxy.backends.state.state import State, StateDown

V = TypeVar("V")


@dataclass(frozen=True)
class Lookup(Generic[V]):
    """What get_or_compute gave: the value and where it came from.

    how: "hit" (from the cache; age is its age in seconds), "miss" (computed by this caller) or
    "shared" (computed by an identical call already in flight, which this one waited for).
    """
    value: V
    how: str
    age: float | None = None


@dataclass
class _Entry(Generic[V]):
    value: V
    stored: float
    size: int


class _Flight:
    """One computation under way; identical callers wait on `done` for its value."""

    def __init__(self):
        self.done = threading.Event()
        self.value: Any = None
        self.ok = False  # False: the computation raised, and each waiter computes for itself


@dataclass
class SharedTier(Generic[V]):
    """Where a cache's values are shared with other processes: the store, the cache's name there (its `use`), and
    the value's JSON form both ways; from_json gives None for anything that is not a value of the cache's kind
    (the store is hostile too: a bad value is a miss)."""
    state: State
    use: str
    to_json: Callable[[V], Any]
    from_json: Callable[[Any], V | None]
    on_error: Callable[[str, str], None] | None = None  # (use, op): a value the store had that from_json refused


def shared_key(key: Hashable) -> str:
    """A cache key (a string or a tuple of JSON types) as the store's key. Pure."""
    return key if isinstance(key, str) else orjson.dumps(list(key) if isinstance(key, tuple) else key).decode()


class TTLCache(Generic[V]):
    """Values for `ttl` seconds, at most `max_entries` of them and `max_bytes` (as `sizeof` counts),
    least recently used out first. A ttl, entry count or byte size of 0 turns it off.

    get_or_compute runs one computation per key at a time: a second caller with the same key
    waits for the first and gets its value, cached or not (a failure included: two identical
    searches at once are one request to an upstream that is failing, not two).
    Thread-safe, and gevent-safe under gunicorn's gevent worker, whose monkey-patching makes
    threading's Lock and Event cooperative; the lock is never held while computing.

    `shared` (None: this process only): the store behind this process's entries. A store that is down is a miss
    there, so the cache works per process meanwhile; one computation in flight per key holds per process only.
    """

    def __init__(self, ttl: float, max_entries: int, max_bytes: int, sizeof: Callable[[V], int],
                 clock: Callable[[], float] = time.monotonic, on_size: Callable[[int, int], None] | None = None):
        self.ttl = ttl
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._sizeof = sizeof
        self._clock = clock
        self.on_size = on_size  # hears (entries, bytes) after each change: the metrics' gauges
        self._entries: collections.OrderedDict[Hashable, _Entry[V]] = collections.OrderedDict()
        self._flights: dict[Hashable, _Flight] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.shared: SharedTier[V] | None = None

    @property
    def enabled(self) -> bool:
        return self.ttl > 0 and self.max_entries > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, key: Hashable) -> Lookup[V] | None:
        """The live entry for `key` as a hit, or None."""
        with self._lock:
            return self._get(key)

    def put(self, key: Hashable, value: V, age: float = 0.0, share: bool = True) -> bool:
        """Store `value` (`age` seconds old already: from the shared store), and in the shared store unless
        `share` is False; False when it is not stored here (cache off, or larger than the whole cache)."""
        if not self.enabled:
            return False
        if share and self.shared is not None:
            self._share(key, value)
        size = self._sizeof(value)
        if size > self.max_bytes:
            return False
        with self._lock:
            self._drop(key)
            self._entries[key] = _Entry(value, self._clock() - age, size)
            self._bytes += size
            while self._entries and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
                self._drop(next(iter(self._entries)))
            sizes = len(self._entries), self._bytes
        if self.on_size:
            self.on_size(*sizes)
        return True

    def get_or_compute(self, key: Hashable, compute: Callable[[], V], cacheable: Callable[[V], bool],
                       wait: float | None = None) -> Lookup[V]:
        """The cached value, or compute() once for every caller of this key meanwhile, stored when
        cacheable(value). A waiter gives up after `wait` seconds and computes for itself."""
        if not self.enabled:
            return Lookup(compute(), "miss")
        with self._lock:
            hit = self._get(key)
            if hit is not None:
                return hit
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = _Flight()
        assert flight is not None
        if not leader:
            if flight.done.wait(wait) and flight.ok:
                return Lookup(flight.value, "shared")
            return Lookup(compute(), "miss")
        elsewhere: Lookup[V] | None = None
        try:
            elsewhere = self._from_shared(key)
            value = elsewhere.value if elsewhere is not None else compute()
            flight.value, flight.ok = value, True
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.done.set()
        if elsewhere is not None:
            self.put(key, value, age=elsewhere.age or 0.0, share=False)
            return elsewhere
        if cacheable(value):
            self.put(key, value)
        return Lookup(value, "miss")

    def _from_shared(self, key: Hashable) -> Lookup[V] | None:
        """Another process's value from the shared store, as a hit; None when there is none, it is not of this
        cache's kind, or the store is down (each counted by the store's or the tier's on_error)."""
        tier = self.shared
        if tier is None:
            return None
        try:
            stored = tier.state.get(tier.use, shared_key(key))
        except StateDown:
            return None
        if stored is None:
            return None
        value = tier.from_json(stored.value)
        if value is None or stored.age >= self.ttl:
            if value is None and tier.on_error:
                tier.on_error(tier.use, "decode")
            return None
        return Lookup(value, "hit", stored.age)

    def _share(self, key: Hashable, value: V) -> None:
        tier = self.shared
        assert tier is not None
        with contextlib.suppress(StateDown):  # counted by the store (proxy_state_errors_total); this process keeps its copy
            tier.state.put(tier.use, shared_key(key), tier.to_json(value), self.ttl)

    def _get(self, key: Hashable) -> Lookup[V] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        age = self._clock() - entry.stored
        if age >= self.ttl:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return Lookup(entry.value, "hit", max(0.0, age))

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
