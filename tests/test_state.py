"""Tests for the state interface (proxy/backends/state/state.py): one table of calls run against both implementations,
MemoryState and RedisState on a real redis-server (standins/redis_server.py); what lands in redis (namespaced keys,
every one with a TTL); hostile values a store may hand back; the one deadline and the circuit over a store that is
gone or hangs; and the users of the interface on it: the caches' shared tier, Codex's RefStore, the SearXNG
cool-downs. Two proxies sharing one store under real gunicorn: tests/test_state_shared.py.

Run: tests/run.sh tests/test_state.py -q
"""
from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from proxy.apis.alpha_search.rules import REFS_USE, TURN, RefStore
from proxy.backends.pages.fetcher import Fetched, Page, fetched_from_json, fetched_json
from proxy.backends.search.search import Hit, SearchOutcome, outcome_from_json, outcome_json, outcome_size, search_key
from proxy.backends.search.search_health import HEALTH_USE, Instances
from proxy.backends.state.cache import SharedTier, TTLCache, shared_key
from proxy.backends.state.state import MAX_VALUE_BYTES, MemoryState, RedisState, StateDown, Stored, key_of
from proxy.tools.client_reads import (
    CHARGES_USE,
    DOWN,
    MAX_LINK_CHARS,
    READS_USE,
    ROOT,
    STEPS,
    WINDOWED,
    ClientReads,
    SharedReads,
)
from proxy.tools.provenance import LINK_BUDGET, READ, Given, Ledger, Rules
from standins.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def errors():
    return []


@pytest.fixture(params=["memory", "redis"])
def state(request, redis_server, errors):
    if request.param == "memory":
        yield MemoryState()
        return
    redis_server.client().flushdb()
    store = RedisState(redis_server.url, 0.5, on_error=lambda use, op: errors.append((use, op)))
    yield store
    store.close()


@pytest.fixture
def store(redis_server, errors):
    """A RedisState on an empty database."""
    redis_server.client().flushdb()
    s = RedisState(redis_server.url, 0.5, on_error=lambda use, op: errors.append((use, op)))
    yield s
    s.close()


def run(state, calls):
    out = []
    for name, *args in calls:
        got = getattr(state, name)(*args)
        out.append(got.value if isinstance(got, Stored) else got)
    return out


# name: (calls, what each returned; a Stored as its value)
CALLS = {
    "nothing there": ([("get", "search", "a")], [None]),
    "a value round-trips": ([("put", "search", "a", {"x": [1, "é", None, 2.5]}, 60), ("get", "search", "a")],
                            [True, {"x": [1, "é", None, 2.5]}]),
    "uses are separate": ([("put", "search", "a", 1, 60), ("get", "page", "a")], [True, None]),
    "keys of any shape": ([("put", "refs", "thread/\n\x00é" * 50, "v", 60), ("get", "refs", "thread/\n\x00é" * 50)],
                          [True, "v"]),
    "a put replaces": ([("put", "page", "a", 1, 60), ("put", "page", "a", 2, 60), ("get", "page", "a")], [True, True, 2]),
    "drop": ([("put", "page", "a", 1, 60), ("drop", "page", "a"), ("get", "page", "a")], [True, None, None]),
    "a TTL of 0 stores nothing": ([("put", "search", "a", 1, 0), ("get", "search", "a")], [False, None]),
    "over MAX_VALUE_BYTES is not stored": ([("put", "page", "a", "x" * MAX_VALUE_BYTES, 60), ("get", "page", "a")],
                                           [False, None]),
    "a counter counts from 1": ([("count", "refs", "t", TURN, 60), ("count", "refs", "t", TURN, 60)], [1, 2]),
    "fields of nothing": ([("fields", "refs", "t")], [{}]),
    "fields add up": ([("add_fields", "refs", "t", {"a": "1"}, 60), ("add_fields", "refs", "t", {"b": "2", "a": "3"}, 60),
                       ("fields", "refs", "t")], [1, 2, {"a": "3", "b": "2"}]),
    "a counter is a field": ([("count", "refs", "t", TURN, 60), ("add_fields", "refs", "t", {"a": "1"}, 60),
                              ("fields", "refs", "t")], [1, 2, {TURN: "1", "a": "1"}]),
    "drop_fields": ([("add_fields", "refs", "t", {"a": "1", "b": "2"}, 60), ("drop_fields", "refs", "t", ["a", "z"]),
                     ("fields", "refs", "t")], [2, None, {"b": "2"}]),
    "the first claim wins": ([("claim", "secret", "k", "first", 60), ("claim", "secret", "k", "second", 60),
                              ("get", "secret", "k")], ["first", "first", "first"]),
    "a claim keeps a put value": ([("put", "secret", "k", "there", 60), ("claim", "secret", "k", "mine", 60)],
                                  [True, "there"]),
}


@pytest.mark.parametrize("name", CALLS)
def test_both_implementations_answer_alike(state, name):
    calls, expected = CALLS[name]
    assert run(state, calls) == expected


def test_a_value_carries_its_age_and_goes_at_its_ttl(state):
    state.put("search", "a", "v", 0.4)
    state.add_fields("refs", "t", {"a": "1"}, 0.4)
    time.sleep(0.15)
    got = state.get("search", "a")
    assert got is not None and 0.1 <= got.age < 0.4
    time.sleep(0.35)
    assert state.get("search", "a") is None and state.fields("refs", "t") == {}


def test_memory_state_keeps_its_most_recently_used_keys():
    s = MemoryState(max_keys=2)
    s.put("search", "a", 1, 60)
    s.put("search", "b", 2, 60)
    s.get("search", "a")
    s.add_fields("refs", "c", {"x": "y"}, 60)
    assert s.get("search", "b") is None and s.get("search", "a").value == 1 and s.fields("refs", "c") == {"x": "y"}


def test_every_key_is_namespaced_hashed_and_has_a_ttl(store, redis_server):
    """What the proxy's uses write, as redis holds it: coding-stack:<use>:<40 hex digits>, none without a TTL."""
    cache = TTLCache(600, 10, 10_000, outcome_size)
    cache.shared = SharedTier(store, "search", outcome_json, outcome_from_json)
    cache.get_or_compute(search_key("q", None, 5, None), lambda: SearchOutcome("q", "ok", [Hit("t", "https://a/")]),
                         lambda o: True)
    refs = RefStore(store)
    refs.begin("thread-1")
    refs.add("thread-1", {"turn0search0": "https://a/"})
    instances = Instances(["http://s1", "http://s2"], shared=store)
    instances.failed("http://s1", "boom")
    client = redis_server.client()
    keys = sorted(k.decode() for k in client.keys("*"))
    assert len(keys) == 3
    assert all(re.fullmatch(r"coding-stack:(search|refs|health):[0-9a-f]{40}", k) for k in keys), keys
    ttls = {k.split(":")[1]: client.pttl(k) / 1000 for k in keys}
    assert 590 < ttls["search"] <= 600 and 86000 < ttls["refs"] <= 86400 and 25 < ttls["health"] <= 30
    assert key_of(REFS_USE, "thread-1") in keys and key_of(HEALTH_USE, "http://s1") in keys


# ---- a hostile store: what it hands back is checked, a bad value is a miss -----------------------------------------

HOSTILE = {
    "not JSON": b"\x80\x81 not json",
    "JSON but no envelope": b'{"v": 1}',
    "a time that is not a number": b'{"t": "yesterday", "v": 1}',
    "a time that is a bool": b'{"t": true, "v": 1}',
    "a list": b"[1, 2]",
    "too big": b'{"t": 1, "v": "' + b"x" * MAX_VALUE_BYTES + b'"}',
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_value_the_proxy_did_not_write_is_a_miss(store, redis_server, errors, name):
    redis_server.client().set(key_of("search", "k"), HOSTILE[name])
    assert store.get("search", "k") is None
    assert errors == [("search", "decode")]
    assert store.circuit.up  # the store answered: it is not down


@pytest.mark.parametrize("doc", [
    {"query": 3, "status": "ok"},
    {"query": "q", "status": "great"},
    {"query": "q", "status": "ok", "hits": [{"title": "t"}]},
    {"query": "q", "status": "ok", "hits": "many"},
    {"query": "q", "status": "ok", "answers": [1]},
    {"query": "q", "status": "ok", "error_code": {"x": 1}},
    [],
])
def test_an_outcome_of_the_wrong_shape_is_a_search_cache_miss(store, redis_server, errors, doc):
    cache = TTLCache(600, 10, 10_000, outcome_size)
    cache.shared = SharedTier(store, "search", outcome_json, outcome_from_json, lambda u, op: errors.append((u, op)))
    key = search_key("q", None, 5, None)
    store.put("search", shared_key(key), doc, 60)
    fresh = SearchOutcome("q", "ok", [Hit("fresh", "https://a/")])
    got = cache.get_or_compute(key, lambda: fresh, lambda o: True)
    assert got.how == "miss" and got.value is fresh and errors == [("search", "decode")]


@pytest.mark.parametrize("doc", [
    {"page": {"url": "u"}, "hops": ["u"], "status": 200},
    {"page": {**fetched_json(Fetched(Page("u", None, "t", "text/html", "x", False), ("u",), 200))["page"],
              "extra": 1}, "hops": ["u"], "status": 200},
    {**fetched_json(Fetched(Page("u", None, "t", "text/html", "x", False), ("u",), 200)), "hops": []},
    {**fetched_json(Fetched(Page("u", None, "t", "text/html", "x", False), ("u",), 200)), "status": "200"},
    "a page",
])
def test_a_page_of_the_wrong_shape_is_refused(doc):
    assert fetched_from_json(doc) is None


def test_outcomes_and_pages_round_trip_through_json():
    outcome = SearchOutcome("q", "ok", [Hit("t", "https://a/", "s", "2026-01-01")], ["an answer"], ["box"],
                            notes=["from a fallback"])
    assert outcome_from_json(orjson.loads(orjson.dumps(outcome_json(outcome)))) == outcome
    fetched = Fetched(Page("https://a/", "T", "text", "text/html", "2026-12-03T16:20:00Z", True, 2, 3),
                      ("https://b/", "https://a/"), 200)
    assert fetched_from_json(orjson.loads(orjson.dumps(fetched_json(fetched)))) == fetched


def test_fields_of_another_type_or_bad_bytes(store, redis_server, errors):
    client = redis_server.client()
    client.hset(key_of("refs", "t"), mapping={b"turn0search0": b"https://a/", b"\xff\xfe": b"x"})
    assert store.fields("refs", "t") == {"turn0search0": "https://a/"} and errors == [("refs", "decode")]
    client.set(key_of("refs", "s"), b"a string where a map should be")
    with pytest.raises(StateDown):
        store.count("refs", "s", TURN, 60)  # WRONGTYPE: this call fails, the store is not down
    assert store.circuit.up


# ---- a store that is gone or hangs: one deadline, then the circuit ---------------------------------------------------

def test_a_store_that_refuses_every_call_is_down_and_says_why(redis_server, caplog):
    """A database number the server does not have answers every call with an error: down, with one log line."""
    store = RedisState(redis_server.url.rsplit("/", 1)[0] + "/99", 0.5)
    with caplog.at_level(logging.WARNING, logger="proxy.state"):
        for _ in range(3):
            with pytest.raises(StateDown):
                store.get("search", "a")
    assert not store.circuit.up
    lines = [r.getMessage() for r in caplog.records if r.name == "proxy.state"]
    assert len(lines) == 1 and "DB index is out of range" in lines[0], lines
    store.close()


def test_a_store_that_hangs_costs_one_deadline_then_none_until_it_answers(tmp_path, caplog):
    ups = []
    with RedisServer(tmp_path) as server:
        store = RedisState(server.url, 0.25, on_up=ups.append)
        store.put("search", "a", 1, 60)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)  # accepts connections, answers nothing
        try:
            with caplog.at_level(logging.WARNING, logger="proxy.state"):
                started = time.monotonic()
                with pytest.raises(StateDown):
                    store.get("search", "a")
                first = time.monotonic() - started
                started = time.monotonic()
                for _ in range(50):
                    with pytest.raises(StateDown):
                        store.get("search", "a")
                rest = time.monotonic() - started
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert 0.2 <= first < 1.0 and rest < 0.1, (first, rest)
        assert ups == [False] and not store.circuit.up
        time.sleep(2.1)  # RETRY_FIRST: the next call asks it again
        with caplog.at_level(logging.WARNING, logger="proxy.state"):
            assert store.get("search", "a").value == 1
        assert ups == [False, True] and store.circuit.up
        lines = [r.getMessage() for r in caplog.records if r.name == "proxy.state"]
        assert len(lines) == 2 and "unreachable" in lines[0] and "back after" in lines[1], lines
        store.close()


def test_a_store_that_is_gone_leaves_each_cache_working_in_its_process(tmp_path):
    with RedisServer(tmp_path) as server:
        store = RedisState(server.url, 0.25)
        cache = TTLCache(600, 10, 10_000, outcome_size)
        cache.shared = SharedTier(store, "search", outcome_json, outcome_from_json)
        server.stop()
        key = search_key("q", None, 5, None)
        calls = []

        def compute():
            calls.append(1)
            return SearchOutcome("q", "ok", [Hit("t", "https://a/")])

        assert cache.get_or_compute(key, compute, lambda o: True).how == "miss"
        assert cache.get_or_compute(key, compute, lambda o: True).how == "hit"
        assert len(calls) == 1 and not store.circuit.up
        store.close()


# ---- the users of the interface ----------------------------------------------------------------------------------------

def test_two_caches_on_one_store_compute_once(store):
    """Two processes' caches, as two TTLCaches on one store: the second gets the first's value, with its age."""
    a, b = (TTLCache(600, 10, 10_000, outcome_size) for _ in range(2))
    for cache in (a, b):
        cache.shared = SharedTier(store, "search", outcome_json, outcome_from_json)
    key = search_key("Q", None, 5, None)
    made = SearchOutcome("Q", "ok", [Hit("t", "https://a/")])
    assert a.get_or_compute(key, lambda: made, lambda o: True).how == "miss"
    time.sleep(0.05)
    got = b.get_or_compute(key, lambda: pytest.fail("computed twice"), lambda o: True)
    assert got.how == "hit" and got.value == made and got.age is not None and got.age >= 0.05
    assert b.get(key) is not None  # now in b's own entries too, for its remaining TTL


def test_refs_on_either_implementation(state):
    refs = RefStore(state, max_refs=3)
    assert refs.begin("") == (0, {})
    assert refs.begin("t") == (0, {})
    refs.add("t", {"turn0search0": "https://a/", "turn0search1": "https://b/"})
    assert refs.begin("t") == (1, {"turn0search0": "https://a/", "turn0search1": "https://b/"})
    refs.add("t", {"turn1search0": "https://c/", "turn1view0": "https://d/"})
    turn, known = refs.begin("t")
    # Past max_refs, the oldest turn's ids go first.
    assert turn == 2 and known == {"turn0search1": "https://b/", "turn1search0": "https://c/", "turn1view0": "https://d/"}
    assert refs.begin("other") == (0, {})


def test_cool_downs_are_shared_and_end_with_a_success(store):
    a = Instances(["http://s1", "http://s2"], shared=store)
    b = Instances(["http://s1", "http://s2"], shared=store)
    assert b.order() == ["http://s1", "http://s2"]
    assert a.failed("http://s1", "HTTP 502") == 30.0
    assert b.order() == ["http://s2", "http://s1"]
    view = b.view()[0]
    assert view["state"] == "cooling down" and view["failures_in_a_row"] == 1 and view["last_error"] == "HTTP 502"
    assert b.failed("http://s1", "again") == 60.0  # the back-off doubles across processes
    assert b.succeeded("http://s1")
    c = Instances(["http://s1", "http://s2"], shared=store)
    assert c.order() == ["http://s1", "http://s2"]


@pytest.mark.parametrize("doc", [
    {"failures": "1", "until": 9e9, "error": "x", "at": 0},
    {"failures": 1, "until": True, "error": "x", "at": 0},
    {"failures": 0, "until": 9e9, "error": "x", "at": 0},
    {"failures": 1, "until": 9e9, "error": 5, "at": 0},
    {"failures": 1, "until": 1.0, "error": "x", "at": 0},  # over long ago
    ["failures"],
])
def test_a_cool_down_of_the_wrong_shape_is_ignored(store, doc):
    store.put(HEALTH_USE, "http://s1", doc, 60)
    assert Instances(["http://s1", "http://s2"], shared=store).order() == ["http://s1", "http://s2"]


def test_a_hostile_cool_down_is_capped():
    """A store claiming an instance cools down for a year: it is asked last for COOL_DOWN_MAX at most."""
    from proxy.backends.search.search_health import COOL_DOWN_MAX, shared_cool_down
    found = shared_cool_down({"failures": 3, "until": 1e12, "error": "x\n\x1b[31m", "at": 1.0}, 1000.0)
    assert found is not None and found[1] == COOL_DOWN_MAX and found[2] == "x [31m"


def test_ref_ids_of_a_shape_the_proxy_never_writes_are_not_known(store, redis_server):
    """A hostile store can't hand the model a `javascript:` URL, or a ref id under a name no listing showed."""
    redis_server.client().hset(key_of(REFS_USE, "t"), mapping={
        TURN: "4", "turn0search0": "javascript:alert(1)", "bogus": "https://x.example/", "turn1view0": "https://ok/",
        "turn0search1": "https://" + "a" * 9000})
    assert RefStore(store).begin("t") == (4, {"turn1view0": "https://ok/"})


# ---- URL provenance's per-client memory (proxy/tools/client_reads.py) on the store ---------------------------------

@pytest.fixture(params=["process", "memory", "redis"])
def reads(request, redis_server, errors):
    """The three ways a client's link reads are kept: ClientReads in the worker (no STATE_URL), SharedReads on a
    MemoryState and on a real redis-server. Each with a wall clock the test moves."""
    clock = [1_000_000.0]
    if request.param == "process":
        yield ClientReads(clock=lambda: clock[0]), clock, True
        return
    if request.param == "memory":
        yield SharedReads(MemoryState(max_keys=10_000, clock=lambda: clock[0]), wall=lambda: clock[0]), clock, True
        return
    redis_server.client().flushdb()
    store = RedisState(redis_server.url, 0.5, on_error=lambda use, op: errors.append((use, op)))
    yield SharedReads(store, wall=lambda: clock[0]), clock, False  # redis's TTLs run on its own clock
    store.close()


def test_client_reads_answer_alike_on_every_store(reads):
    reads, clock, ttls_follow_clock = reads
    assert reads.recall("c", "https://a.test/") is None
    reads.remember("c", "https://a.test/x", 2, "https://a.test/")
    reads.remember("c", "https://a.test/x", 3, "https://b.test/")  # a deeper reading does not replace it
    assert reads.recall("c", "https://a.test/x") == (2, "https://a.test/")
    reads.remember("c", "https://a.test/x", 1, "https://c.test/")  # a shallower one does
    assert reads.recall("c", "https://a.test/x") == (1, "https://c.test/")
    assert reads.recall("other", "https://a.test/x") is None
    # Two per root, three in all: the window's budget is checked first, and a refused fetch counts nothing.
    got = [reads.charge("c", root, 2, 3) for root in ("r1", "r1", "r1", "r2", "r2", "r3")]
    assert got == [None, None, ROOT, None, WINDOWED, WINDOWED]
    assert reads.charged("c") == 3 and reads.charged("other") == 0
    assert reads.charge("other", "r1", 2, 3) is None
    clock[0] += 3600 + 600  # an hour later (SharedReads forgets in ten-minute steps: 60 to 70 minutes)
    assert reads.recall("c", "https://a.test/x") is None or not ttls_follow_clock  # redis: its TTL, checked below
    assert reads.charged("c") == 0 and reads.charge("c", "r1", 2, 3) is None


def test_the_links_a_page_showed_are_kept_per_client_on_every_store(reads):
    reads, clock, ttls_follow_clock = reads
    assert reads.links("c", "https://a.test/") == []
    reads.remember_links("c", "https://a.test/", ["https://a.test/x", "https://b.test/y", "https://a.test/x"])
    assert reads.links("c", "https://a.test/") == ["https://a.test/x", "https://b.test/y"]
    assert reads.links("other", "https://a.test/") == [] and reads.links("c", "https://a.test/x") == []
    reads.remember_links("c", "https://big.test/", [f"https://big.test/{i:05d}" + "p" * 500 for i in range(2000)])
    kept = reads.links("c", "https://big.test/")
    assert 0 < len(kept) < 2000 and sum(map(len, kept)) <= MAX_LINK_CHARS  # the first ones, within the bound
    clock[0] += 3600 + 1
    assert reads.links("c", "https://a.test/") == [] or not ttls_follow_clock


def test_a_shared_budget_holds_over_any_hour_not_only_clock_hours(store):
    """Charges made late in one hour still count early in the next: the budget is never twice in an hour."""
    clock = [3600.0 * 100 + 3000]  # fifty minutes past
    reads = SharedReads(store, wall=lambda: clock[0])
    assert [reads.charge("c", f"r{i}", 9, 3) for i in range(3)] == [None, None, None]
    clock[0] += 900  # five minutes past the next hour
    assert reads.charge("c", "r9", 9, 3) == WINDOWED
    clock[0] += 3600  # 65 minutes after they were made: forgotten
    assert reads.charge("c", "r9", 9, 3) is None


def test_two_replicas_cannot_both_spend_the_last_read(redis_server):
    """Eight threads on two store handles (two replicas) ask for twenty link reads at once: exactly the budget
    reads, the store's count deciding who."""
    redis_server.client().flushdb()
    handles = [RedisState(redis_server.url, 2.0) for _ in range(2)]
    replicas = [SharedReads(h) for h in handles]
    gate = threading.Barrier(8)

    def ask(i: int) -> list[str | None]:
        gate.wait()
        return [replicas[i % 2].charge("c", f"r{(i + j) % 3}", 4, 5) for j in range(20 // 8 + 1)]

    with ThreadPoolExecutor(8) as pool:
        answers = [a for got in pool.map(ask, range(8)) for a in got]
    assert answers.count(None) == 5, answers
    assert replicas[0].charged("c") >= 5  # refused fetches may add to a spent bucket, never to a live budget
    for h in handles:
        h.close()


def test_client_reads_in_redis_are_bounded_and_expire(store, redis_server):
    clock = [1_000_000.0]
    reads = SharedReads(store, wall=lambda: clock[0])
    for step in range(20):  # three hours and more of a client that tries 30 roots every ten minutes
        for i in range(30):
            reads.charge("c", f"https://r{step}-{i}.test/", 2, 24)
        reads.remember("c", f"https://r{step}.test/x", 1, "https://r.test/")
        clock[0] += 600
    client = redis_server.client()
    charges = client.hgetall(key_of(CHARGES_USE, "c"))
    # Only the window's buckets, and in them only the roots charged while the budget was not spent.
    assert 0 < len(charges) <= (STEPS + 1) * 2 + 24 + 1, charges
    for k in client.keys("coding-stack:*"):
        assert 0 < client.pttl(k) <= (3600 + 600) * 1000


@pytest.mark.parametrize("bad", [{"a:notabucket": "9"}, {"x:1": "1"}])
def test_charge_fields_the_proxy_never_writes_are_dropped(store, redis_server, bad):
    redis_server.client().hset(key_of(CHARGES_USE, "c"), mapping=bad)
    reads = SharedReads(store)
    assert reads.charge("c", "r", 2, 3) is None
    assert not set(bad) & {k.decode() for k in redis_server.client().hkeys(key_of(CHARGES_USE, "c"))}


def test_a_count_that_is_not_a_number_is_taken_as_spent(store, redis_server):
    reads = SharedReads(store, wall=lambda: 1_000_000.0)
    bucket = int(1_000_000.0 // (3600 / STEPS))
    redis_server.client().hset(key_of(CHARGES_USE, "c"), mapping={f"a:{bucket}": "lots"})
    assert reads.charge("c", "r", 2, 3) == WINDOWED


@pytest.mark.parametrize("value", [[1], ["1", "r"], [-1, "r"], [True, "r"], {"d": 1}, "x"])
def test_a_remembered_read_of_the_wrong_shape_is_not_known(store, value):
    store.put(READS_USE, "c\nhttps://a.test/", value, 60)
    assert SharedReads(store).recall("c", "https://a.test/") is None


def test_with_the_store_down_link_reads_are_refused_and_given_urls_still_read(tmp_path):
    """Fail closed for the exfiltration bound, open for everything else: a link fetch gets a tool result that says
    why, a user's URL and a search result are read, and the calls that got no answer are counted by use."""
    errors: list[tuple[str, str]] = []
    with RedisServer(tmp_path) as server:
        store = RedisState(server.url, 0.25, on_error=lambda use, op: errors.append((use, op)))
        reads = SharedReads(store)
        assert reads.charge("c", "r", 2, 24) is None
        server.stop()
        ledger = Ledger(Rules(), [Given("user", "https://docs.test/start")], reads, "c")
        ledger.allow(["https://found.test/a"], "search", query="gpu docs")
        assert ledger.admit("https://docs.test/start") is None
        assert ledger.admit("https://found.test/a") is None
        ledger.learn_page("https://docs.test/start", "https://docs.test/start", "[i](/install)")
        refused = ledger.admit("https://docs.test/install")
        assert refused is not None and refused.reason == LINK_BUDGET
        assert "STATE_URL" in refused.message and "not answering" in refused.message
        assert reads.charge("c", "r", 2, 24) == DOWN
        # A page an earlier request read, its depth unknown now: taken at the depth limit, a link fetch, refused.
        later = Ledger(Rules(), [Given(READ, "https://docs.test/install")], reads, "c")
        assert later.admit("https://docs.test/install") is not None
        store.close()
    assert ("link_charges", "fields") in errors and {u for u, _ in errors} <= {"reads", "link_charges", "page_links"}
