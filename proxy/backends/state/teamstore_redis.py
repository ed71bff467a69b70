"""The team's shared state in Redis or Valkey (STATE_URL=redis://...), for replicas on several hosts: the same usage
per key and day, quota windows, requests in flight and fair-queue tickets as proxy/backends/state/teamstore.py keeps in
SQLite, with the same methods, so proxy/http/wiring.py picks one and nothing above it knows which.

Exact across every worker of every replica: each check-and-update is one Lua script, which Redis runs atomically
(no other command runs in between), so two replicas can never both see 59 of 60 requests used. The clock is the
caller's, as in SQLite; replicas need synchronised clocks (NTP), which a lease of 20 s tolerates easily.
Live rows (requests in flight, tickets) carry leases this worker renews for the ones it holds; a dead worker's run
out and the next script drops them.
"""
from __future__ import annotations

import functools
import logging
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import redis

from proxy.backends.state.keys import Limits
from proxy.backends.state.teamstore import (
    FIELDS,
    LEASE,
    PATIENCE,
    WINDOW,
    Admitted,
    Leases,
    Refusal,
    StoreError,
    day_of,
    seconds_to_midnight,
)
from proxy.runtime import concurrency as runtime

log = logging.getLogger("proxy")

PREFIX = "coding-stack:team:"
# A day's usage is dropped after a year and a bit, by usage() itself and never by a TTL: the team's keys carry none,
# so a store whose memory is full evicts only what has one (the caches'; compose.scale.yaml's volatile-lru policy).
DAYS_KEPT = 400 * 86400

ADMIT = """
local p, name, now, day = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local rpm, tpd, conc = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local id, lease, final, window = ARGV[8], tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11])
local hits, active, usage = p..'hits:'..name, p..'active:'..name, p..'usage:'..name..':'..day
redis.call('ZREMRANGEBYSCORE', hits, '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', active, '-inf', '('..now)
local function refuse(kind, allowed, retry)
  if final == '1' or kind ~= 'concurrent' then
    redis.call('HINCRBYFLOAT', usage, 'limited', 1)
    redis.call('SADD', p..'usage:index', name..'|'..day)
    redis.call('PERSIST', usage)
  end
  return {kind, allowed, tostring(retry)}
end
if rpm > 0 then
  if redis.call('ZCARD', hits) >= rpm then
    local oldest = redis.call('ZRANGE', hits, 0, 0, 'WITHSCORES')
    return refuse('rpm', rpm, math.max(tonumber(oldest[2]) + window - now, 0.001))
  end
end
if tpd > 0 then
  local v = redis.call('HMGET', usage, 'prompt_tokens', 'completion_tokens')
  if (tonumber(v[1]) or 0) + (tonumber(v[2]) or 0) >= tpd then return refuse('tokens_per_day', tpd, ARGV[12]) end
end
if conc > 0 and redis.call('ZCARD', active) >= conc then return refuse('concurrent', conc, 1) end
redis.call('ZADD', hits, now, id)
redis.call('PERSIST', hits)
redis.call('ZADD', active, lease, id)
redis.call('HINCRBYFLOAT', usage, 'requests', 1)
redis.call('SADD', p..'usage:index', name..'|'..day)
redis.call('PERSIST', usage)
local remaining = -1
if rpm > 0 then remaining = rpm - redis.call('ZCARD', hits) end
return {'ok', remaining}
"""

# The fair queue's choice, as teamstore.TeamStore._fill makes it: drop lapsed tickets, then while seats are free give
# one to the key served longest ago (or that used the fewest tokens), within it a resumed turn first, else the oldest
# ticket; say whether ARGV[4] runs.
FILL = """
local p, now, seats, mine, by_tokens, day = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4],
  ARGV[5] == 'tokens', ARGV[6]
local running, waiting = 0, {}
for _, id in ipairs(redis.call('SMEMBERS', p..'tickets')) do
  local t = redis.call('HMGET', p..'ticket:'..id, 'name', 'arrived', 'resumed', 'running', 'lease')
  if not t[5] or tonumber(t[5]) < now then
    redis.call('DEL', p..'ticket:'..id)
    redis.call('SREM', p..'tickets', id)
  elseif t[4] == '1' then
    running = running + 1
  else
    local used = 0
    if by_tokens then
      local v = redis.call('HMGET', p..'usage:'..t[1]..':'..day, 'prompt_tokens', 'completion_tokens')
      used = (tonumber(v[1]) or 0) + (tonumber(v[2]) or 0)
    end
    table.insert(waiting, {id = id, name = t[1], arrived = tonumber(t[2]), resumed = tonumber(t[3]), used = used,
                           served = tonumber(redis.call('HGET', p..'turns', t[1]) or '0')})
  end
end
while running < seats and #waiting > 0 do
  local bi = 1
  for i, w in ipairs(waiting) do
    local b = waiting[bi]
    if w.used < b.used or (w.used == b.used and (w.served < b.served or (w.served == b.served and
       (w.resumed > b.resumed or (w.resumed == b.resumed and w.arrived < b.arrived))))) then bi = i end
  end
  local best = table.remove(waiting, bi)
  redis.call('HSET', p..'ticket:'..best.id, 'running', '1')
  local seq = redis.call('INCR', p..'turns:seq')
  redis.call('HSET', p..'turns', best.name, seq)
  for _, w in ipairs(waiting) do if w.name == best.name then w.served = seq end end
  running = running + 1
end
local state = redis.call('HGET', p..'ticket:'..mine, 'running')
if not state then return -1 end
return tonumber(state)
"""

# Undo an admission whose caller gave up waiting for it (a store that stalled past the socket timeout may run the
# script afterwards): out of flight, out of the minute's window, and the request it counted taken back. 1 if it had run.
UNDO = """
local p, name, day, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ran = redis.call('ZREM', p..'active:'..name, id) + redis.call('ZREM', p..'hits:'..name, id)
if ran > 0 then redis.call('HINCRBYFLOAT', p..'usage:'..name..':'..day, 'requests', -1) end
return ran
"""

RENEW = """
local p, lease = ARGV[1], ARGV[2]
for i = 3, #ARGV, 2 do
  local kind, id = ARGV[i], ARGV[i + 1]
  if kind == 't' then
    if redis.call('EXISTS', p..'ticket:'..id) == 1 then redis.call('HSET', p..'ticket:'..id, 'lease', lease) end
  else
    redis.call('ZADD', p..'active:'..kind, 'XX', lease, id)
  end
end
return 0
"""


P = ParamSpec("P")
R = TypeVar("R")


def _wrapped(fn: Callable[P, R]) -> Callable[P, R]:
    """Redis's failures as StoreError, which the callers handle for either store; the signature kept, so that mypy
    checks RedisTeamStore against the TeamStorage protocol as it checks TeamStore."""
    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except redis.RedisError as e:
            raise StoreError(str(e)) from None
    return call


def masked(url: str) -> str:
    """STATE_URL without its password, for log lines. Pure."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()


class RedisTeamStore(Leases):
    def __init__(self, url: str, clock: Callable[[], float] = time.time, prefix: str = PREFIX):
        self.path = masked(url)  # what log lines name
        self.clock = clock
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._admit = self.client.register_script(ADMIT)
        self._fill = self.client.register_script(FILL)
        self._renew = self.client.register_script(RENEW)
        self._undo = self.client.register_script(UNDO)
        self._orphans: dict[str, tuple[str, str, float]] = {}  # admissions given up on: id -> (name, day, given up)
        self._init_live()  # request id -> key name, ticket id -> "t"

    def _renew_once(self) -> None:
        self._sweep_orphans()
        held = [x for id_, kind in self._held().items() for x in (kind, id_)]
        if not held:
            return
        try:
            self._renew(args=[self.prefix, self.clock() + LEASE, *held])
        except redis.RedisError as e:  # the next renewal tries again; the lease outlasts three misses
            log.warning("STATE_URL %s: renewing leases failed: %s", self.path, e)

    def _sweep_orphans(self) -> None:
        """Undo the admissions this worker gave up on once the store answers: a stall past the socket timeout gave
        the client a 503, and the script, run late, would otherwise count that request and hold its concurrency
        slot until its lease ran out. Tried at every renewal until it has run, or for LEASE (its row's own life)."""
        for rid, (name, day, since) in list(self._orphans.items()):
            try:
                ran = self._undo(args=[self.prefix, name, day, rid])
            except redis.RedisError:
                return  # still not answering: the next renewal tries again
            if ran or time.monotonic() - since > LEASE:
                self._orphans.pop(rid, None)

    # ---- quotas and usage -------------------------------------------------------------------------------

    @_wrapped
    def admit(self, name: str, limits: Limits) -> Admitted | Refusal:
        self._ensure_renewing()
        if self._orphans:
            self._sweep_orphans()
        deadline = time.monotonic() + PATIENCE
        while True:
            final = time.monotonic() >= deadline
            now, rid = self.clock(), uuid.uuid4().hex
            try:
                out = self._admit(args=[self.prefix, name, now, day_of(now), limits.rpm or 0,
                                        limits.tokens_per_day or 0, limits.concurrent or 0, rid, now + LEASE,
                                        "1" if final else "0", WINDOW, seconds_to_midnight(now)])
            except redis.TimeoutError:  # sent, unanswered: it may run when the store wakes up (_sweep_orphans)
                self._orphans[rid] = (name, day_of(now), time.monotonic())
                raise
            kind = out[0].decode() if isinstance(out[0], bytes) else out[0]
            if kind == "ok":
                self._hold(rid, name)
                return Admitted(rid, None if out[1] < 0 else int(out[1]))
            if kind != "concurrent" or final:
                return Refusal(kind, int(out[1]), float(out[2]))
            runtime.sleep(0.02)

    @_wrapped
    def ended(self, admitted_id: str, name: str, figures: dict[str, float]) -> None:
        self._drop(admitted_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(f"{self.prefix}active:{name}", admitted_id)
        self._adding(pipe, name, figures)
        pipe.execute()

    @_wrapped
    def add(self, name: str, figures: dict[str, float]) -> None:
        pipe = self.client.pipeline(transaction=True)
        self._adding(pipe, name, figures)
        pipe.execute()

    def _adding(self, pipe: Any, name: str, figures: dict[str, float]) -> None:
        day = day_of(self.clock())
        key = f"{self.prefix}usage:{name}:{day}"
        for figure, value in figures.items():
            if figure in FIELDS and value:
                pipe.hincrbyfloat(key, figure, value)
        pipe.sadd(f"{self.prefix}usage:index", f"{name}|{day}")
        pipe.persist(key)  # a key an older proxy wrote with a TTL: no longer evictable

    @_wrapped
    def usage(self, days: int = 31) -> dict[str, dict[str, dict[str, float]]]:
        since = day_of(self.clock() - 86400 * (days - 1))
        entries = sorted((m.decode() if isinstance(m, bytes) else m).split("|", 1)
                         for m in self.client.smembers(f"{self.prefix}usage:index"))
        out: dict[str, dict[str, dict[str, float]]] = {}
        dropped = day_of(self.clock() - DAYS_KEPT)
        for name, day in sorted(entries, key=lambda e: (e[0], e[1]), reverse=False):
            if day < dropped:
                self.client.delete(f"{self.prefix}usage:{name}:{day}")
                self.client.srem(f"{self.prefix}usage:index", f"{name}|{day}")
            if day < since:
                continue
            raw = self.client.hgetall(f"{self.prefix}usage:{name}:{day}")
            values = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in raw.items()}
            out.setdefault(name, {})[day] = {f: (round(values.get(f, 0.0), 3) if f == "queued_seconds"
                                                 else int(values.get(f, 0.0))) for f in FIELDS}
        return {name: dict(sorted(d.items(), reverse=True)) for name, d in out.items()}

    # ---- the fair queue ------------------------------------------------------------------------------------

    @_wrapped
    def enqueue(self, name: str, resumed: bool) -> str:
        self._ensure_renewing()
        tid, now = uuid.uuid4().hex, self.clock()
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(f"{self.prefix}ticket:{tid}", mapping={"name": name, "arrived": now, "resumed": int(resumed),
                                                         "running": 0, "lease": now + LEASE})
        pipe.sadd(f"{self.prefix}tickets", tid)
        pipe.execute()
        self._hold(tid, "t")
        return tid

    @_wrapped
    def admitted(self, ticket: str, seats: int, policy: str = "round_robin") -> bool | None:
        now = self.clock()
        state = self._fill(args=[self.prefix, now, seats, ticket, policy, day_of(now)])
        if state < 0:
            self._drop(ticket)
            return None
        return bool(state)

    @_wrapped
    def release(self, ticket: str) -> None:
        self._drop(ticket)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(f"{self.prefix}ticket:{ticket}")
        pipe.srem(f"{self.prefix}tickets", ticket)
        pipe.execute()

    @_wrapped
    def queue_view(self) -> dict[str, int]:
        now, counts = self.clock(), {"running": 0, "waiting": 0}
        for tid in self.client.smembers(f"{self.prefix}tickets"):
            tid = tid.decode() if isinstance(tid, bytes) else tid
            running, lease = self.client.hmget(f"{self.prefix}ticket:{tid}", "running", "lease")
            if lease is not None and float(lease) >= now:
                counts["running" if running in (b"1", "1") else "waiting"] += 1
        return counts
