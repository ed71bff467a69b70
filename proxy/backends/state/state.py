"""The proxy's state that outlives a request, behind one small protocol (State): in this process (MemoryState) when
STATE_URL is empty, as it always was, or in a Valkey or Redis server (RedisState) when STATE_URL names one, so that
every gunicorn worker and every proxy replica sees the same search cache, page cache, Codex's ref ids and SearXNG
cool-downs. proxy/http/wiring.py opens it once per worker (open_state); tests/test_state.py checks both
implementations with one table and a real redis-server, and tests/test_state_shared.py two proxies sharing one.

Every key is `coding-stack:<use>:<sha256 of the caller's key>` (a client's thread id never becomes a key as it came)
and has a TTL; a value is JSON (orjson, never pickle) at most MAX_VALUE_BYTES. The store is as hostile as anything
else outside: a value that is not what was written (bad JSON, another type, too big) is a miss, never a crash.

A store that does not answer within STATE_TIMEOUT (one socket deadline, no retries) raises StateDown, and opens the
circuit: for the next few seconds (RETRY_FIRST, doubling to RETRY_MAX) every call raises StateDown at once without
asking it, so a dead store costs one deadline per window, not one per call. One log line when it goes down and one
when it is back; on_error(use, op) and on_up(bool) tell the metrics. What each use does with StateDown is its own
decision (docs/operations.md, "Shared state"): the caches fall back to their per-process copy, a ref id lookup says so to the
model, the cool-downs stay per process.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.core.config import masked_url

log = logging.getLogger("proxy.state")

NAMESPACE = "coding-stack"
# A value larger than this is not stored (the caller's per-process copy still is): a page's text is cut to
# WEB_FETCH_MAX_TOKENS (20,000 tokens, ~80 kB) before it is cached, so this leaves room for raised budgets.
MAX_VALUE_BYTES = 2 * 1024 * 1024
# A hash (a Codex thread's ref ids) is read whole; more fields than this is not a hash this proxy wrote.
MAX_FIELDS = 4096
# How long a dead store is left alone before it is asked again: long enough that a store that is down costs
# requests one deadline per window, short enough that it is back in use seconds after it returns.
RETRY_FIRST = 2.0
RETRY_MAX = 30.0


class StateDown(Exception):
    """The store did not answer (within its deadline), or its circuit is open after it did not."""


@dataclass(frozen=True)
class Stored:
    value: Any    # as put: JSON types
    age: float    # seconds since it was put


class State(Protocol):
    """Values, counters and small maps of strings, each under (use, key), each with a TTL. Every call may raise
    StateDown (MemoryState never does); none blocks longer than the store's one deadline."""

    shared: bool   # True: other processes see the same values

    def get(self, use: str, key: str) -> Stored | None: ...

    def put(self, use: str, key: str, value: Any, ttl: float) -> bool:
        """False when not stored: larger than MAX_VALUE_BYTES, or a TTL of 0."""
        ...

    def drop(self, use: str, key: str) -> None: ...

    def count(self, use: str, key: str, field: str, ttl: float) -> int:
        """Add one to a map's integer field (0 when absent) and return it; the map's TTL starts over."""
        ...

    def fields(self, use: str, key: str) -> dict[str, str]:
        """A map's fields ({} when absent); counters come back as their digits."""
        ...

    def add_fields(self, use: str, key: str, items: dict[str, str], ttl: float) -> int:
        """Set fields of a map (its TTL starts over); returns how many fields it has now."""
        ...

    def drop_fields(self, use: str, key: str, names: list[str]) -> None: ...

    def claim(self, use: str, key: str, value: Any, ttl: float) -> Any:
        """The value under (use, key), `value` put there first when there is none, so every process that asks gets
        the one the first put; its TTL starts over."""
        ...


def key_of(use: str, key: str) -> str:
    """The store's key: the namespace, the use, and a digest of the caller's key (any length, any characters). Pure."""
    return f"{NAMESPACE}:{use}:{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}"


def encode(value: Any, now: float) -> bytes | None:
    """A value and when it was put, as the store keeps it; None when it is over MAX_VALUE_BYTES. Pure."""
    data = orjson.dumps({"t": now, "v": value})
    return data if len(data) <= MAX_VALUE_BYTES else None


def decode(data: Any, now: float) -> Stored | None:
    """What encode wrote, or None for anything else the store handed back (a miss, not a crash). Pure."""
    if not isinstance(data, bytes) or len(data) > MAX_VALUE_BYTES:
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or "v" not in doc:
        return None
    stored = doc.get("t")
    if isinstance(stored, bool) or not isinstance(stored, (int, float)):
        return None
    return Stored(doc["v"], min(max(0.0, now - stored), 365 * 86400.0))


# ---- in this process -------------------------------------------------------------------------------

@dataclass
class _Item:
    value: Any
    stored: float      # wall clock
    expires: float     # monotonic


class MemoryState:
    """State in this process: at most `max_keys` keys over all uses, least recently used out first, each until its
    TTL. What STATE_URL empty gives: nothing is shared, nothing can be down."""

    shared = False

    def __init__(self, max_keys: int = 512, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.max_keys = max_keys
        self._clock, self._wall = clock, wall
        self._items: OrderedDict[tuple[str, str], _Item] = OrderedDict()
        self._lock = threading.Lock()

    def _live(self, use: str, key: str) -> _Item | None:
        item = self._items.get((use, key))
        if item is None:
            return None
        if item.expires <= self._clock():
            del self._items[(use, key)]
            return None
        self._items.move_to_end((use, key))
        return item

    def _set(self, use: str, key: str, value: Any, ttl: float) -> None:
        self._items.pop((use, key), None)
        self._items[(use, key)] = _Item(value, self._wall(), self._clock() + ttl)
        while len(self._items) > self.max_keys:
            self._items.popitem(last=False)

    def get(self, use: str, key: str) -> Stored | None:
        with self._lock:
            item = self._live(use, key)
            if item is None or isinstance(item.value, _Map):
                return None
            return Stored(item.value, max(0.0, self._wall() - item.stored))

    def put(self, use: str, key: str, value: Any, ttl: float) -> bool:
        if ttl <= 0 or len(orjson.dumps(value)) > MAX_VALUE_BYTES:
            return False
        with self._lock:
            self._set(use, key, value, ttl)
        return True

    def drop(self, use: str, key: str) -> None:
        with self._lock:
            self._items.pop((use, key), None)

    def _map(self, use: str, key: str, ttl: float) -> _Map:
        item = self._live(use, key)
        fields = item.value if item is not None and isinstance(item.value, _Map) else _Map()
        self._set(use, key, fields, ttl)
        return fields

    def count(self, use: str, key: str, field: str, ttl: float) -> int:
        with self._lock:
            fields = self._map(use, key, ttl)
            fields[field] = str(int(fields.get(field, "0")) + 1)
            return int(fields[field])

    def fields(self, use: str, key: str) -> dict[str, str]:
        with self._lock:
            item = self._live(use, key)
            return dict(item.value) if item is not None and isinstance(item.value, _Map) else {}

    def add_fields(self, use: str, key: str, items: dict[str, str], ttl: float) -> int:
        with self._lock:
            fields = self._map(use, key, ttl)
            fields.update(items)
            return len(fields)

    def drop_fields(self, use: str, key: str, names: list[str]) -> None:
        with self._lock:
            item = self._live(use, key)
            if item is not None and isinstance(item.value, _Map):
                for name in names:
                    item.value.pop(name, None)

    def claim(self, use: str, key: str, value: Any, ttl: float) -> Any:
        with self._lock:
            item = self._live(use, key)
            kept = item.value if item is not None and not isinstance(item.value, _Map) else value
            self._set(use, key, kept, ttl)
            return kept


class _Map(dict):
    """A map's fields in MemoryState (a dict of its own type, so a value that is a dict is never taken for one)."""


# ---- in Valkey or Redis -------------------------------------------------------------------------------

class Circuit:
    """Whether to ask the store now: closed while it answers; open for a while (RETRY_FIRST, doubling to RETRY_MAX)
    after it did not, then one call tries it. Logs once when the store goes down and once when it is back."""

    DOWN = ("state store %s unreachable (%s): caches per process, ref ids unavailable, "
            f"asked again every {RETRY_FIRST:.0f}-{RETRY_MAX:.0f} s")
    BACK = "state store %s back after %.1f s: shared again"

    def __init__(self, name: str, on_up: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, wait: tuple[float, float] = (RETRY_FIRST, RETRY_MAX),
                 down: str = DOWN, back: str = BACK):
        """`wait`: the first and the longest pause after a failure; `down` and `back`: the two log lines, formatted
        with (name, reason) and (name, seconds down)."""
        self.name, self._on_up, self._clock = name, on_up, clock
        self._first, self._most = wait
        self._down, self._back = down, back
        self.down_since: float | None = None
        self._until = 0.0
        self._wait = self._first
        self._lock = threading.Lock()

    @property
    def up(self) -> bool:
        return self.down_since is None

    def allows(self) -> bool:
        with self._lock:
            return self.down_since is None or self._clock() >= self._until

    def failed(self, error: BaseException) -> None:
        with self._lock:
            now, first = self._clock(), self.down_since is None
            if first:
                self.down_since, self._wait = now, self._first
            else:
                self._wait = min(self._most, self._wait * 2)
            self._until = now + self._wait
        if first:
            log.warning(self._down, self.name, _reason(error))
            if self._on_up:
                self._on_up(False)

    def worked(self) -> None:
        if self.down_since is None:
            return
        with self._lock:
            since, self.down_since = self.down_since, None
        if since is not None:
            log.warning(self._back, self.name, self._clock() - since)
            if self._on_up:
                self._on_up(True)


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())[:160]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class RedisState:
    """State in a Valkey or Redis server (redis-py, imported only here): one connection pool per worker, every call
    under one socket deadline with no retries, behind a Circuit. on_error(use, op) hears of every call that got no
    answer (failed, or skipped while the circuit is open) and of every bad value (op "decode")."""

    shared = True

    def __init__(self, url: str, timeout: float, on_error: Callable[[str, str], None] | None = None,
                 on_up: Callable[[bool], None] | None = None, wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.name = masked_url(url)
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                           retry=Retry(NoBackoff(), 0), health_check_interval=0)
        # Down: no answer (refused, reset, timed out), or an error that every call would get (a database number
        # out of range, a read-only replica, out of memory): the circuit opens and the log says why, once. A key
        # of another type (WRONGTYPE: another program's key, or a hostile one) is that call's failure only.
        self._down = (redis.ConnectionError, redis.TimeoutError, OSError)
        self._failed = redis.RedisError
        self._on_error = on_error
        self._wall = wall
        self.circuit = Circuit(self.name, on_up, clock)

    def close(self) -> None:
        self._redis.close()

    def _call(self, use: str, op: str, run: Callable[[Any], Any]) -> Any:
        if not self.circuit.allows():
            self._error(use, op)
            raise StateDown(f"state store {self.name} is down")
        try:
            result = run(self._redis)
        except self._down as e:
            self._error(use, op)
            self.circuit.failed(e)
            raise StateDown(f"state store {self.name}: {_reason(e)}") from None
        except self._failed as e:
            self._error(use, op)
            if "WRONGTYPE" in str(e):
                self.circuit.worked()
            else:
                self.circuit.failed(e)
            raise StateDown(f"state store {self.name}: {_reason(e)}") from None
        self.circuit.worked()
        return result

    def _error(self, use: str, op: str) -> None:
        if self._on_error:
            self._on_error(use, op)

    def get(self, use: str, key: str) -> Stored | None:
        data = self._call(use, "get", lambda r: r.get(key_of(use, key)))
        if data is None:
            return None
        found = decode(data, self._wall())
        if found is None:
            self._error(use, "decode")
        return found

    def put(self, use: str, key: str, value: Any, ttl: float) -> bool:
        data = encode(value, self._wall())
        if data is None or ttl <= 0:
            return False
        self._call(use, "put", lambda r: r.set(key_of(use, key), data, px=max(1, int(ttl * 1000))))
        return True

    def drop(self, use: str, key: str) -> None:
        self._call(use, "drop", lambda r: r.delete(key_of(use, key)))

    def count(self, use: str, key: str, field: str, ttl: float) -> int:
        name = key_of(use, key)

        def run(r) -> int:
            pipe = r.pipeline(transaction=True)
            pipe.hincrby(name, field, 1)
            pipe.pexpire(name, max(1, int(ttl * 1000)))
            return pipe.execute()[0]

        value = self._call(use, "count", run)
        if isinstance(value, bool) or not isinstance(value, int):
            self._error(use, "decode")
            raise StateDown(f"state store {self.name}: a counter that is not a number")
        return value

    def fields(self, use: str, key: str) -> dict[str, str]:
        name = key_of(use, key)

        def run(r) -> dict:
            if r.hlen(name) > MAX_FIELDS:
                return {}
            return r.hgetall(name)

        raw = self._call(use, "fields", run)
        out: dict[str, str] = {}
        for k, v in raw.items() if isinstance(raw, dict) else ():
            try:
                out[k.decode()] = v.decode()
            except (AttributeError, UnicodeDecodeError):
                self._error(use, "decode")  # one bad field is left out; the others are still the thread's
        return out

    def add_fields(self, use: str, key: str, items: dict[str, str], ttl: float) -> int:
        name = key_of(use, key)

        def run(r) -> int:
            pipe = r.pipeline(transaction=True)
            if items:
                pipe.hset(name, mapping=items)
            pipe.pexpire(name, max(1, int(ttl * 1000)))
            pipe.hlen(name)
            return pipe.execute()[-1]

        return int(self._call(use, "add_fields", run))

    def drop_fields(self, use: str, key: str, names: list[str]) -> None:
        if names:
            self._call(use, "drop_fields", lambda r: r.hdel(key_of(use, key), *names))

    def claim(self, use: str, key: str, value: Any, ttl: float) -> Any:
        name, data, ms = key_of(use, key), encode(value, self._wall()), max(1, int(ttl * 1000))
        if data is None:
            raise ValueError("a claimed value must fit in MAX_VALUE_BYTES")

        def run(r) -> Any:
            pipe = r.pipeline(transaction=True)
            pipe.set(name, data, px=ms, nx=True)
            pipe.pexpire(name, ms)
            pipe.get(name)
            return pipe.execute()[-1]

        found = decode(self._call(use, "claim", run), self._wall())
        if found is None:  # another program's value under our key: not one to agree on
            self._error(use, "decode")
            raise StateDown(f"state store {self.name}: a claimed value that is not JSON")
        return found.value


def open_state(url: str, timeout: float, on_error: Callable[[str, str], None] | None = None,
               on_up: Callable[[bool], None] | None = None) -> RedisState | None:
    """The shared store STATE_URL names, or None when it is empty (each use keeps its state in this process).
    Not asked here: a store that is down at start is found down on first use, and the proxy serves anyway."""
    if not url:
        return None
    return RedisState(url, timeout, on_error=on_error, on_up=on_up)
