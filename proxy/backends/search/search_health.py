"""The search failover's memory: which SearXNG instances cool down after failing (with back-off) and in what order to
ask them, and which engines each instance reports failing in `unresponsive_engines`, by reason; pure, on injectable
clocks, so tests/test_search_health.py checks cool-downs and engine changes without waiting or a network.

One of each per gunicorn worker (proxy/backends/search/failover.py holds them); the /proxy/search/health view reads them.
With STATE_URL, Instances shares its cool-downs through the state store (proxy/backends/state/state.py): an instance one
worker or replica found failing is asked last by all of them until its cool-down ends; the engines stay per worker.
"""
from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from proxy.backends.state.state import State, StateDown

# The metric's reasons (proxy_search_engine_failures_total{reason}); a dashboard queries these exact values.
REASONS = ("suspended", "captcha", "too_many_requests", "timeout", "error")
# An instance that failed sits out 30 s first: long enough that the searches of one agent turn (seconds apart) go
# elsewhere, short enough that a container restart is noticed soon. Each failure in a row doubles it, up to 10
# minutes: an instance that keeps failing is usually blocked, and the bundled SearXNG suspends a CAPTCHA-blocked
# engine for 10 minutes (searxng/settings.yml), so asking sooner than that finds it blocked again.
COOL_DOWN_FIRST = 30.0
COOL_DOWN_MAX = 600.0
# Engine names come from whatever answered; these bound what a hostile instance can make the proxy remember or label.
MAX_ENGINES = 64
MAX_MESSAGE_CHARS = 120
_ENGINE_NAME = re.compile(r"[\w .+\-]{1,60}")
OTHER = "other"


def classify(message) -> str:
    """One of REASONS for an `unresponsive_engines` message (SearXNG's webutils.get_translated_errors words them:
    "Suspended: CAPTCHA", "too many requests", "timeout", "HTTP connection error", ...). Pure.

    A suspended engine was not asked this time (SearXNG skips it until its suspension ends), so it counts as
    suspended, whatever first suspended it; that first failure was counted under its own reason when it happened."""
    text = message.casefold() if isinstance(message, str) else ""
    if text.startswith("suspended"):
        return "suspended"
    if "captcha" in text:
        return "captcha"
    if "too many request" in text or "429" in text:
        return "too_many_requests"
    if "timeout" in text or "timed out" in text:
        return "timeout"
    return "error"


def engine_name(value) -> str | None:
    """An engine name fit to log, show and label, or None for anything else a broken answer put there. Pure."""
    if not isinstance(value, str):
        return None
    name = " ".join(value.split())
    return name if _ENGINE_NAME.fullmatch(name) else None


def short_message(value) -> str:
    """An answer's reason for a failure, fit for a log line and the model: one line of printable text, cut short."""
    text = " ".join("".join(c for c in value if c.isprintable() or c.isspace()).split()) if isinstance(value, str) else ""
    return text[:MAX_MESSAGE_CHARS] or "no reason given"


@dataclass(frozen=True)
class EngineFailure:
    engine: str
    reason: str    # one of REASONS
    message: str   # SearXNG's words, cut short


def engine_failures(data: dict) -> list[EngineFailure]:
    """The engines a SearXNG answer lists in `unresponsive_engines` ([name, message] pairs), each once, at most
    MAX_ENGINES of them; entries of any other shape are skipped. Pure."""
    raw = data.get("unresponsive_engines")
    found: dict[str, EngineFailure] = {}
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, (list, tuple)) or not entry:
            continue
        name = engine_name(entry[0])
        if name is None or name in found:
            continue
        message = entry[1] if len(entry) > 1 else ""
        found[name] = EngineFailure(name, classify(message), short_message(message))
        if len(found) >= MAX_ENGINES:
            break
    return list(found.values())


def answering_engines(data: dict) -> set[str]:
    """The engines that gave a SearXNG answer's results (each result's `engines`, or its `engine`). Pure."""
    names: set[str] = set()
    results = data.get("results")
    for r in results if isinstance(results, list) else []:
        if not isinstance(r, dict):
            continue
        listed = r.get("engines")
        for value in listed if isinstance(listed, list) else [r.get("engine")]:
            name = engine_name(value)
            if name is not None:
                names.add(name)
        if len(names) >= MAX_ENGINES:
            break
    return names


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


@dataclass
class _Instance:
    url: str
    failures_in_a_row: int = 0
    until: float = 0.0              # on the monotonic clock: asked first again from then on
    last_error: str = ""
    last_failure: float | None = None   # wall clock
    last_success: float | None = None   # wall clock


HEALTH_USE = "health"  # the state store's name for the shared cool-downs


def shared_cool_down(doc: Any, now_wall: float) -> tuple[int, float, str, float] | None:
    """A cool-down another process shared (failures in a row, seconds left, last error, when it failed), or None for
    one that is over or anything else the store handed back. Pure."""
    if not isinstance(doc, dict):
        return None
    failures, until, error, at = doc.get("failures"), doc.get("until"), doc.get("error"), doc.get("at")
    if (isinstance(failures, bool) or not isinstance(failures, int) or not 0 < failures <= 64
            or not isinstance(error, str) or isinstance(until, bool) or not isinstance(until, (int, float))
            or isinstance(at, bool) or not isinstance(at, (int, float))):
        return None
    left = min(float(until) - now_wall, COOL_DOWN_MAX)
    return (failures, left, short_message(error), float(at)) if left > 0 else None


class Instances:
    """The instances in the order SEARXNG_URL lists them, each up or cooling down after a failure; thread-safe.
    `shared` (STATE_URL's store, or None): where the cool-downs are shared with other processes; a store that is
    down leaves them per process."""

    def __init__(self, urls: Iterable[str], clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, first: float = COOL_DOWN_FIRST, cap: float = COOL_DOWN_MAX,
                 shared: State | None = None):
        self._items = [_Instance(u) for u in urls]
        self._clock, self._wall, self._first, self._cap = clock, wall, first, cap
        self._lock = threading.Lock()
        self.shared = shared

    def _pull(self) -> None:
        """Take in the cool-downs other processes shared (a later end wins). With one instance there is no order
        to choose, so nothing is asked."""
        if self.shared is None or len(self._items) < 2:
            return
        for item in self._items:
            try:
                stored = self.shared.get(HEALTH_USE, item.url)
            except StateDown:
                return  # counted by the store; this process's own cool-downs still order the instances
            found = shared_cool_down(stored.value if stored else None, self._wall())
            if found is None:
                continue
            failures, left, error, at = found
            with self._lock:
                if self._clock() + left > item.until:
                    item.until, item.failures_in_a_row = self._clock() + left, max(item.failures_in_a_row, failures)
                    item.last_error, item.last_failure = error, at

    def _push(self, url: str, failures: int, seconds: float, error: str) -> None:
        if self.shared is None:
            return
        with contextlib.suppress(StateDown):  # counted by the store; the cool-down holds in this process
            if failures:
                now = self._wall()
                self.shared.put(HEALTH_USE, url, {"failures": failures, "until": now + seconds, "error": error,
                                                  "at": now}, seconds)
            else:
                self.shared.drop(HEALTH_USE, url)

    @property
    def urls(self) -> list[str]:
        return [i.url for i in self._items]

    def order(self) -> list[str]:
        """Who to ask, first to last: those up in the configured order, then those cooling down, the one whose
        cool-down ends soonest first (a search asks somebody even when every instance is cooling down)."""
        self._pull()
        now = self._clock()
        with self._lock:
            up = [i.url for i in self._items if i.until <= now]
            cooling = sorted((i for i in self._items if i.until > now), key=lambda i: i.until)
        return up + [i.url for i in cooling]

    def failed(self, url: str, why: str) -> float:
        """Note a failure; returns the cool-down it starts, doubled for each failure in a row."""
        with self._lock:
            item = self._find(url)
            item.failures_in_a_row += 1
            seconds = min(self._cap, self._first * 2 ** (item.failures_in_a_row - 1))
            item.until = self._clock() + seconds
            item.last_error = short_message(why)
            item.last_failure = self._wall()
            failures = item.failures_in_a_row
        self._push(url, failures, seconds, item.last_error)
        return seconds

    def succeeded(self, url: str) -> bool:
        """Note an answer; returns whether the instance was failing until now (its back-off starts over)."""
        with self._lock:
            item = self._find(url)
            was_failing = item.failures_in_a_row > 0
            item.failures_in_a_row, item.until, item.last_success = 0, 0.0, self._wall()
        if was_failing:
            self._push(url, 0, 0.0, "")
        return was_failing

    def view(self) -> list[dict]:
        self._pull()
        now = self._clock()
        with self._lock:
            return [{"url": i.url, "state": "cooling down" if i.until > now else "up",
                     "cooling_down_for_seconds": round(max(0.0, i.until - now), 1),
                     "failures_in_a_row": i.failures_in_a_row, "last_error": i.last_error or None,
                     "last_failure": _iso(i.last_failure) if i.last_failure is not None else None,
                     "last_success": _iso(i.last_success) if i.last_success is not None else None}
                    for i in self._items]

    def _find(self, url: str) -> _Instance:
        for item in self._items:
            if item.url == url:
                return item
        raise KeyError(url)


@dataclass
class _Engine:
    reason: str
    message: str
    since: float     # wall clock: when it started failing
    last: float      # wall clock: when it was last reported
    reports: int = 1


@dataclass(frozen=True)
class Change:
    """An engine that started or stopped failing on an instance: what the failover logs."""
    instance: str
    engine: str
    failing: bool
    reason: str = ""
    message: str = ""
    seconds: float = 0.0   # how long it had been failing, when it stopped


class Engines:
    """Per instance, the engines failing now (reported in `unresponsive_engines` and not seen working since), and
    every engine seen giving results (the smarter retry asks those). Thread-safe.

    An engine stops failing when it gives a result, or when a plain search on the same instance no longer lists it:
    SearXNG lists a failing or suspended engine on every search that asks it, and a plain search (no `engines`,
    `categories` or `time_range`, which leaves out engines without time ranges) asks all its usual engines."""

    def __init__(self, wall: Callable[[], float] = time.time):
        self._wall = wall
        self._failing: dict[str, dict[str, _Engine]] = {}
        self._answering: set[str] = set()
        self._labels: set[str] = set()
        self._lock = threading.Lock()

    def record(self, instance: str, failures: list[EngineFailure], answering: set[str], plain: bool) -> list[Change]:
        """Take in one answer from `instance`; returns the engines that started or stopped failing with it."""
        now = self._wall()
        changes = []
        with self._lock:
            failing = self._failing.setdefault(instance, {})
            reported = {f.engine for f in failures}
            for name in list(failing):
                if name in answering or (plain and name not in reported):
                    state = failing.pop(name)
                    changes.append(Change(instance, name, False, state.reason, state.message, now - state.since))
            for f in failures:
                known = failing.get(f.engine)
                if known is not None:
                    known.reason, known.message, known.last, known.reports = f.reason, f.message, now, known.reports + 1
                elif len(failing) < MAX_ENGINES:
                    failing[f.engine] = _Engine(f.reason, f.message, now, now)
                    changes.append(Change(instance, f.engine, True, f.reason, f.message))
            for name in answering:
                if name in self._answering or len(self._answering) < MAX_ENGINES:
                    self._answering.add(name)
        return changes

    def failing(self, instance: str) -> set[str]:
        with self._lock:
            return set(self._failing.get(instance, {}))

    def answering(self) -> set[str]:
        """Every engine seen giving results, on any instance, failing or not now."""
        with self._lock:
            return set(self._answering)

    def label(self, engine: str) -> str:
        """The engine's metric label: its name, or OTHER once MAX_ENGINES names are in use (a hostile instance
        inventing names must not grow the metrics without end)."""
        with self._lock:
            if engine in self._labels or len(self._labels) < MAX_ENGINES:
                self._labels.add(engine)
                return engine
            return OTHER

    def view(self) -> dict[str, list[dict]]:
        with self._lock:
            return {instance: [{"engine": name, "reason": s.reason, "message": s.message, "since": _iso(s.since),
                                "last_reported": _iso(s.last), "reports": s.reports}
                               for name, s in sorted(engines.items())]
                    for instance, engines in self._failing.items()}
