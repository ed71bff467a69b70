"""What the workers of a shared stack keep together, in one SQLite file (PROXY_STATE_DB): usage per key per day,
the quota windows, the requests in flight, and the fair queue's tickets. Built once per worker by
proxy/http/wiring.py; proxy/http/app.py checks quotas, proxy/http/flow.py records usage, proxy/engine/exchange.py
waits in the queue.

Exact across gunicorn workers (and replicas sharing the file's volume): every check-and-update is one
`BEGIN IMMEDIATE` transaction, which takes SQLite's write lock first, so two workers can never both see 59 of 60
requests used. The lock is held for well under a millisecond; a worker that finds it taken retries after a
cooperative sleep (runtime.sleep), never SQLite's own busy wait, which would stall every greenlet of the worker.

Rows that stand for something live (a request in flight, a ticket in the queue) carry a lease that their worker
renews every LEASE/4 seconds: a worker that dies stops renewing, and the others drop its rows once the lease is
over, so a crash frees its places in LEASE seconds instead of holding them for ever.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.backends.state.keys import Limits
from proxy.runtime import concurrency as runtime

log = logging.getLogger("proxy")

LEASE = 20.0      # seconds a live row outlasts its worker's last renewal
WINDOW = 60.0     # the requests-per-minute window, sliding
# The fair queue's choice between keys (QUEUE_POLICY): turns taken, or tokens used today.
ORDER = {"round_robin": "COALESCE(s.served, 0)",
         "tokens": "COALESCE(u.prompt_tokens + u.completion_tokens, 0), COALESCE(s.served, 0)"}
PATIENCE = 1.0    # seconds a request over its concurrency limit waits for a slot before its 429
# The usage figures, in the order /proxy/usage and the metrics give them.
FIELDS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "searches", "page_reads",
          "refused_fetches", "queued_seconds", "limited")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS usage (name TEXT NOT NULL, day TEXT NOT NULL,
  {", ".join(f + " REAL NOT NULL DEFAULT 0" for f in FIELDS)}, PRIMARY KEY (name, day));
CREATE TABLE IF NOT EXISTS hits (name TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS hits_by_name ON hits (name, at);
CREATE TABLE IF NOT EXISTS active (id TEXT PRIMARY KEY, name TEXT NOT NULL, owner TEXT NOT NULL, lease REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tickets (id TEXT PRIMARY KEY, name TEXT NOT NULL, owner TEXT NOT NULL,
  arrived REAL NOT NULL, resumed INTEGER NOT NULL, running INTEGER NOT NULL DEFAULT 0, lease REAL NOT NULL);
CREATE TABLE IF NOT EXISTS turns (name TEXT PRIMARY KEY, served INTEGER NOT NULL);
"""


def day_of(t: float) -> str:
    """The UTC day a wall-clock time falls in, as YYYY-MM-DD: days turn at midnight UTC for everyone. Pure."""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d")


def seconds_to_midnight(t: float) -> float:
    return 86400.0 - (t % 86400.0)


class StoreError(Exception):
    """The shared store failed (Redis unreachable, a script error): teamstore_redis raises it, the callers handle it
    as they handle sqlite3.Error."""


@dataclass(frozen=True)
class Refusal:
    """A request over one of its key's limits: which, the limit, and when to try again."""
    limit: str            # "rpm", "tokens_per_day" or "concurrent"
    allowed: int
    retry_after: float    # seconds


@dataclass(frozen=True)
class Admitted:
    """A request within its limits: its row among the requests in flight (released when it ends)."""
    id: str
    remaining_requests: int | None   # in the current minute, when the key has an rpm limit


class TeamStorage(Protocol):
    """What the key check (proxy/http/team.py) and the fair queue (proxy/engine/admission.py) hold the team's shared
    state by: TeamStore in SQLite, or RedisTeamStore with STATE_URL, chosen by proxy/http/wiring.py. Each method may
    raise StoreError or sqlite3.Error; each caller decides what that means (a 503, or a queue that fails open)."""

    path: str  # where the state lives, as log lines name it (a Redis URL masked)

    def admit(self, name: str, limits: Limits) -> Admitted | Refusal: ...

    def ended(self, admitted_id: str, name: str, figures: dict[str, float]) -> None: ...

    def usage(self, days: int = 31) -> dict[str, dict[str, dict[str, float]]]: ...

    def enqueue(self, name: str, resumed: bool) -> str: ...

    def admitted(self, ticket: str, seats: int, policy: str = "round_robin") -> bool | None: ...

    def release(self, ticket: str) -> None: ...

    def queue_view(self) -> dict[str, int]: ...


class Leases:
    """The live rows a worker's handle holds (requests in flight, queue tickets) carry leases that a background
    thread renews every LEASE/4 while the handle is open; a dead worker's rows lapse and the next writer drops them.
    Both stores (SQLite here, Redis in teamstore_redis.py) renew this way; each says how in `_renew_once`.

    Only the rows this worker still believes it holds are renewed (`_live`, by id), never "every row it owns": a
    row is dropped from `_live` before the store is told it is over, so when that telling fails (a disk full, the
    store down) the row lapses within LEASE instead of being renewed for as long as the worker lives."""

    _renewing = False
    _closed = False

    def _init_live(self) -> None:
        self._live: dict[str, str] = {}  # what this worker holds: request id -> key name (or "a"), ticket id -> "t"
        self._live_lock = threading.Lock()

    def _hold(self, id_: str, kind: str) -> None:
        with self._live_lock:
            self._live[id_] = kind

    def _drop(self, id_: str) -> None:
        with self._live_lock:
            self._live.pop(id_, None)

    def _held(self) -> dict[str, str]:
        with self._live_lock:
            return dict(self._live)

    def close(self) -> None:
        """Stop renewing leases (what this handle holds then lapses): for a handle that is not a worker's."""
        self._closed = True

    def _ensure_renewing(self) -> None:
        if not self._renewing:
            self._renewing = True
            threading.Thread(target=self._renew_forever, daemon=True, name="lease-renewal").start()

    def _renew_forever(self) -> None:
        while not self._closed:
            runtime.sleep(LEASE / 4)
            if not self._closed:
                self._renew_once()

    def _renew_once(self) -> None:
        raise NotImplementedError


class TeamStore(Leases):
    """One worker's handle on the shared file: one connection (opened lazily in the worker, never across a fork),
    one transaction at a time under a lock, so greenlets and threads share it safely."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time):
        self.path = path
        self.clock = clock
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._conn: sqlite3.Connection | None = None
        self._inode = 0  # the file the connection opened (_same_file)
        self._pid = 0
        self._lock = threading.Lock()
        self._init_live()

    # ---- plumbing ----------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():
            directory = os.path.dirname(self.path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
            self._setup(conn)
            self._conn, self._pid = conn, os.getpid()
            self._inode = os.stat(self.path).st_ino
            self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._same_file()
        return self._conn

    def _same_file(self) -> None:
        """The file this connection has open is still the one at the path. Deleted or replaced while the proxy ran,
        a worker that opens the path afresh (a new worker, one respawned) would count in a new file while the others
        count in the old one: two views of every quota. So a worker whose file is gone stops using it (its metered
        requests get the store's 503, its queue fails open), and says to restart, which puts every worker on one
        file again. Reopening on its own is no cure: the old file's -wal would be read into the new one."""
        try:
            same = os.stat(self.path).st_ino == self._inode
        except FileNotFoundError:
            same = False
        if not same:
            raise sqlite3.OperationalError(f"{self.path} was deleted or replaced while the proxy ran: restart the "
                                           "proxy so that every worker uses one file")

    def _setup(self, conn: sqlite3.Connection) -> None:
        """WAL (readers never wait for the writer; switching to it takes the lock once) and the tables, retried
        while the other workers starting at the same moment hold the lock."""
        for attempt in range(400):
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(SCHEMA)
                return
            except sqlite3.OperationalError as e:
                if not _busy(e):
                    raise
                runtime.sleep(0.005 * min(attempt + 1, 20))
        raise sqlite3.OperationalError(f"{self.path} stayed locked")

    def transaction(self, fn: Callable[[sqlite3.Connection, float], Any]) -> Any:
        """fn(conn, now) inside BEGIN IMMEDIATE, committed; retried (with cooperative sleeps) while another
        worker holds the write lock."""
        for attempt in range(2000):
            with self._lock:
                conn = self._connection()
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as e:
                    if not _busy(e):
                        raise
                else:
                    try:
                        result = fn(conn, self.clock())
                        conn.execute("COMMIT")
                    except BaseException:
                        # A COMMIT that failed (disk full, an I/O error) may leave the transaction open, and
                        # every later BEGIN of this connection would fail with it: roll back whatever is left.
                        if conn.in_transaction:
                            with contextlib.suppress(sqlite3.Error):
                                conn.execute("ROLLBACK")
                        raise
                    return result
            runtime.sleep(0.001 * min(attempt + 1, 20))
        raise sqlite3.OperationalError(f"{self.path} stayed locked")

    def _renew_once(self) -> None:
        held = self._held()
        if not held:
            return
        try:
            self.transaction(functools.partial(self._renew, held=held))
        except sqlite3.Error as e:  # the next renewal tries again; the lease outlasts three misses
            log.warning("PROXY_STATE_DB %s: renewing leases failed: %s", self.path, e)

    @staticmethod
    def _renew(conn: sqlite3.Connection, now: float, held: dict[str, str]) -> None:
        for table, ids in (("active", [i for i, k in held.items() if k != "t"]),
                           ("tickets", [i for i, k in held.items() if k == "t"])):
            for start in range(0, len(ids), 500):  # SQLite's bound on a statement's parameters
                part = ids[start:start + 500]
                conn.execute(f"UPDATE {table} SET lease = ? WHERE id IN ({', '.join('?' * len(part))})",
                             (now + LEASE, *part))

    # ---- quotas --------------------------------------------------------------------------------------

    def admit(self, name: str, limits: Limits) -> Admitted | Refusal:
        """Check `name`'s limits and, within them, count the request and put it in flight: one transaction.
        Over the concurrency limit it asks again for up to PATIENCE seconds first: an agent sends its next
        request the moment the last byte of the previous one arrives, a moment before that one has left the
        requests in flight, and must not get a 429 for that."""
        self._ensure_renewing()
        deadline = time.monotonic() + PATIENCE
        while True:
            final = time.monotonic() >= deadline
            verdict = self.transaction(functools.partial(self._admit, name=name, limits=limits, final=final))
            if isinstance(verdict, Admitted):
                self._hold(verdict.id, "a")
            if not isinstance(verdict, Refusal) or verdict.limit != "concurrent" or final:
                return verdict
            runtime.sleep(0.02)

    def _admit(self, conn: sqlite3.Connection, now: float, name: str, limits: Limits,
               final: bool = True) -> Admitted | Refusal:
        conn.execute("DELETE FROM hits WHERE at <= ?", (now - WINDOW,))
        conn.execute("DELETE FROM active WHERE lease < ?", (now,))
        refusal = self._over(conn, now, name, limits)
        if refusal is not None:
            if final or refusal.limit != "concurrent":
                _add(conn, name, day_of(now), {"limited": 1})
            return refusal
        conn.execute("INSERT INTO hits VALUES (?, ?)", (name, now))
        rid = uuid.uuid4().hex
        conn.execute("INSERT INTO active VALUES (?, ?, ?, ?)", (rid, name, self.owner, now + LEASE))
        _add(conn, name, day_of(now), {"requests": 1})
        remaining = None
        if limits.rpm is not None:
            used = conn.execute("SELECT COUNT(*) FROM hits WHERE name = ?", (name,)).fetchone()[0]
            remaining = max(limits.rpm - used, 0)
        return Admitted(rid, remaining)

    def _over(self, conn: sqlite3.Connection, now: float, name: str, limits: Limits) -> Refusal | None:
        if limits.rpm is not None:
            used, oldest = conn.execute("SELECT COUNT(*), MIN(at) FROM hits WHERE name = ?", (name,)).fetchone()
            if used >= limits.rpm:
                return Refusal("rpm", limits.rpm, max(oldest + WINDOW - now, 0.001))
        if limits.tokens_per_day is not None:
            row = conn.execute("SELECT prompt_tokens + completion_tokens FROM usage WHERE name = ? AND day = ?",
                               (name, day_of(now))).fetchone()
            if row is not None and row[0] >= limits.tokens_per_day:
                return Refusal("tokens_per_day", limits.tokens_per_day, seconds_to_midnight(now))
        if limits.concurrent is not None:
            live = conn.execute("SELECT COUNT(*) FROM active WHERE name = ?", (name,)).fetchone()[0]
            if live >= limits.concurrent:
                return Refusal("concurrent", limits.concurrent, 1.0)
        return None

    def ended(self, admitted_id: str, name: str, figures: dict[str, float]) -> None:
        """A request is over: out of flight, and what it used added to its key's day."""
        def fn(conn: sqlite3.Connection, now: float) -> None:
            conn.execute("DELETE FROM active WHERE id = ?", (admitted_id,))
            _add(conn, name, day_of(now), figures)
        self._drop(admitted_id)  # first: if the store cannot be told, the row lapses
        self.transaction(fn)

    def add(self, name: str, figures: dict[str, float]) -> None:
        self.transaction(lambda conn, now: _add(conn, name, day_of(now), figures))

    def usage(self, days: int = 31) -> dict[str, dict[str, dict[str, float]]]:
        """{name: {day: {figure: value}}} for the last `days` UTC days, newest first."""
        since = day_of(self.clock() - 86400 * (days - 1))
        rows = self.transaction(lambda conn, now: conn.execute(
            f"SELECT name, day, {', '.join(FIELDS)} FROM usage WHERE day >= ? ORDER BY name, day DESC",
            (since,)).fetchall())
        out: dict[str, dict[str, dict[str, float]]] = {}
        for name, day, *values in rows:
            out.setdefault(name, {})[day] = {f: (round(v, 3) if f == "queued_seconds" else int(v))
                                             for f, v in zip(FIELDS, values, strict=True)}
        return out

    # ---- the fair queue ------------------------------------------------------------------------------

    def enqueue(self, name: str, resumed: bool) -> str:
        """A ticket for one call to vLLM; `resumed` (a later turn of a request already served) goes ahead of its
        own key's first turns, so a tool round never sends a request behind its key's new ones."""
        self._ensure_renewing()
        tid = uuid.uuid4().hex
        self.transaction(lambda conn, now: conn.execute(
            "INSERT INTO tickets (id, name, owner, arrived, resumed, lease) VALUES (?, ?, ?, ?, ?, ?)",
            (tid, name, self.owner, now, int(resumed), now + LEASE)))
        self._hold(tid, "t")
        return tid

    def admitted(self, ticket: str, seats: int, policy: str = "round_robin") -> bool | None:
        """Admit waiting tickets while fewer than `seats` run (any worker admits anyone's: a free seat never
        waits for its ticket's owner to look), and say whether `ticket` runs (None: it is gone)."""
        if self._seats_taken(ticket, seats):
            return False
        state = self.transaction(lambda conn, now: self._fill(conn, now, ticket, seats, policy))
        if state is None:
            self._drop(ticket)
        return state

    def _seats_taken(self, ticket: str, seats: int) -> bool:
        """A read (WAL readers take no lock) that spares the waiters' polls the write lock while every seat is
        taken by a live ticket and this one waits: most polls, when many wait."""
        with self._lock:
            conn = self._connection()
            now = self.clock()
            try:
                mine = conn.execute("SELECT running FROM tickets WHERE id = ?", (ticket,)).fetchone()
                if mine is None or mine[0]:
                    return False
                taken = conn.execute("SELECT COUNT(*) FROM tickets WHERE running = 1 AND lease >= ?",
                                     (now,)).fetchone()[0]
            except sqlite3.OperationalError as e:
                if not _busy(e):
                    raise
                return True  # the next poll looks again
            return taken >= seats

    def _fill(self, conn: sqlite3.Connection, now: float, ticket: str, seats: int, policy: str) -> bool | None:
        conn.execute("DELETE FROM tickets WHERE lease < ?", (now,))
        running = conn.execute("SELECT COUNT(*) FROM tickets WHERE running = 1").fetchone()[0]
        while running < seats:
            # Round-robin across keys (the key served longest ago, never served first) or, with QUEUE_POLICY=tokens,
            # the key that used the fewest tokens today; within the key, a resumed turn before its first turns, then
            # the oldest. A resumed turn never jumps other keys: four search loops of one key then starved another's
            # short question for 9 s; now it waits behind at most one turn of each other key.
            row = conn.execute(
                "SELECT t.id, t.name FROM tickets t LEFT JOIN turns s ON s.name = t.name "
                "LEFT JOIN usage u ON u.name = t.name AND u.day = ? WHERE t.running = 0 "
                f"ORDER BY {ORDER[policy]}, t.resumed DESC, t.arrived LIMIT 1", (day_of(now),)).fetchone()
            if row is None:
                break
            conn.execute("UPDATE tickets SET running = 1 WHERE id = ?", (row[0],))
            conn.execute("INSERT INTO turns VALUES (?, (SELECT COALESCE(MAX(served), 0) + 1 FROM turns)) "
                         "ON CONFLICT (name) DO UPDATE SET served = excluded.served", (row[1],))
            running += 1
        state = conn.execute("SELECT running FROM tickets WHERE id = ?", (ticket,)).fetchone()
        return None if state is None else bool(state[0])

    def release(self, ticket: str) -> None:
        """The ticket's call is over, or its client left while it waited: its seat or place is free."""
        self._drop(ticket)  # first: if the store cannot be told, the ticket lapses within LEASE
        self.transaction(lambda conn, now: conn.execute("DELETE FROM tickets WHERE id = ?", (ticket,)))

    def queue_view(self) -> dict[str, int]:
        rows = self.transaction(lambda conn, now: conn.execute(
            "SELECT running, COUNT(*) FROM tickets WHERE lease >= ? GROUP BY running", (now,)).fetchall())
        counts = dict(rows)
        return {"running": counts.get(1, 0), "waiting": counts.get(0, 0)}


def _busy(e: sqlite3.OperationalError) -> bool:
    """Another connection holds the lock: worth another try."""
    return "locked" in str(e) or "busy" in str(e)


def _add(conn: sqlite3.Connection, name: str, day: str, figures: dict[str, float]) -> None:
    known = {f: v for f, v in figures.items() if f in FIELDS and v}
    if not known:
        conn.execute("INSERT OR IGNORE INTO usage (name, day) VALUES (?, ?)", (name, day))
        return
    cols = ", ".join(known)
    sets = ", ".join(f"{f} = {f} + excluded.{f}" for f in known)
    conn.execute(f"INSERT INTO usage (name, day, {cols}) VALUES (?, ?, {', '.join('?' * len(known))}) "
                 f"ON CONFLICT (name, day) DO UPDATE SET {sets}", (name, day, *known.values()))
