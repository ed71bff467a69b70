"""proxy/backends/state/cache.py's TTLCache without a network: time to live, both bounds, least recently used
out first, the off switch, and one computation in flight per key (threads; the proxy-level
tests in tests/test_metrics.py run it under gunicorn's gevent worker).

Run: tests/run.sh tests/test_cache.py
"""
import threading

import pytest

from proxy.backends.search.search import Hit, SearchOutcome, outcome_size, search_key
from proxy.backends.state.cache import TTLCache


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(ttl=60.0, entries=10, max_bytes=1000, sizes=None):
    clock = Clock()
    sizes = sizes if sizes is not None else []
    cache = TTLCache(ttl, entries, max_bytes, len, clock=clock, on_size=lambda n, b: sizes.append((n, b)))
    return cache, clock


def test_a_hit_within_the_ttl_carries_its_age_and_expires_after():
    cache, clock = make(ttl=60)
    assert cache.put("k", "value")
    clock.now += 42
    hit = cache.get("k")
    assert (hit.value, hit.how, hit.age) == ("value", "hit", 42)
    clock.now += 18  # 60 s old: expired, and dropped
    assert cache.get("k") is None and len(cache) == 0 and cache.bytes == 0


def test_least_recently_used_goes_first_when_entries_run_out():
    cache, _ = make(entries=2)
    cache.put("a", "1")
    cache.put("b", "2")
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", "3")
    assert [k for k in "abc" if cache.get(k)] == ["a", "c"]


def test_the_byte_bound_evicts_and_a_value_larger_than_the_cache_is_not_kept():
    sizes = []
    cache, _ = make(max_bytes=10, sizes=sizes)
    cache.put("a", "x" * 6)
    cache.put("b", "y" * 6)  # 12 bytes: a goes
    assert cache.get("a") is None and cache.get("b").value == "y" * 6
    assert not cache.put("huge", "z" * 11)
    assert cache.get("b") is not None and cache.bytes == 6
    assert sizes == [(1, 6), (1, 6)]


def test_replacing_a_key_counts_its_bytes_once():
    cache, _ = make()
    cache.put("k", "abc")
    cache.put("k", "abcdef")
    assert (len(cache), cache.bytes, cache.get("k").value) == (1, 6, "abcdef")


@pytest.mark.parametrize("ttl, entries, max_bytes", [(0, 10, 1000), (60, 0, 1000), (60, 10, 0)])
def test_zero_turns_it_off(ttl, entries, max_bytes):
    cache, _ = make(ttl, entries, max_bytes)
    calls = []
    for _ in range(2):
        found = cache.get_or_compute("k", lambda: calls.append(1) or "v", lambda v: True)
        assert (found.value, found.how) == ("v", "miss")
    assert len(calls) == 2 and not cache.enabled
    assert not cache.put("k", "v") and cache.get("k") is None


def test_get_or_compute_keeps_only_what_is_cacheable():
    cache, _ = make()
    answers = iter(["", "good", "other"])
    keep = bool  # as the search cache keeps only answers with results
    assert cache.get_or_compute("k", lambda: next(answers), keep).how == "miss"
    assert cache.get_or_compute("k", lambda: next(answers), keep).value == "good"
    found = cache.get_or_compute("k", lambda: next(answers), keep)
    assert (found.value, found.how) == ("good", "hit")


def run_in_threads(*fns):
    out = [None] * len(fns)

    def run(i):
        out[i] = fns[i]()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    return threads, out


def test_a_second_identical_call_waits_for_the_first_instead_of_computing():
    cache, _ = make()
    started, release, calls = threading.Event(), threading.Event(), []

    def slow():
        calls.append(1)
        started.set()
        assert release.wait(10)
        return "answer"

    first, _ = run_in_threads(lambda: cache.get_or_compute("k", slow, lambda v: False))
    assert started.wait(10)
    second, out = run_in_threads(lambda: cache.get_or_compute("k", slow, lambda v: False, wait=10))
    release.set()
    for t in first + second:
        t.join(10)
    # Not cacheable, yet shared: the waiter got the first call's answer, and only one call ran.
    assert calls == [1] and (out[0].value, out[0].how) == ("answer", "shared")
    assert cache._flights == {}


def test_a_waiter_computes_itself_when_the_first_call_raises_or_takes_too_long():
    cache, _ = make()
    started, release = threading.Event(), threading.Event()

    def failing():
        started.set()
        release.wait(10)
        raise OSError("upstream broke")

    errors = []

    def leader():
        try:
            cache.get_or_compute("k", failing, lambda v: True)
        except OSError as e:
            errors.append(e)
    first, _ = run_in_threads(leader)
    assert started.wait(10)
    second, out = run_in_threads(lambda: cache.get_or_compute("k", lambda: "own", lambda v: False, wait=10))
    release.set()
    for t in first + second:
        t.join(10)
    assert len(errors) == 1 and (out[0].value, out[0].how) == ("own", "miss")

    started.clear()
    release.clear()
    slow_first, _ = run_in_threads(lambda: cache.get_or_compute("j", lambda: started.set() or release.wait(10) and "late",
                                                                lambda v: False))
    assert started.wait(10)
    assert cache.get_or_compute("j", lambda: "impatient", lambda v: False, wait=0.05).value == "impatient"
    release.set()
    for t in slow_first:
        t.join(10)


@pytest.mark.parametrize("a, b, same", [
    (("Rust  Async", None, 5, None), ("rust async", None, 5, None), True),
    (("rust", None, 5, None), ("rust", "de-DE", 5, None), False),
    (("rust", None, 5, None), ("rust", None, 10, None), False),
    (("rust", None, 5, None), ("rust", None, 5, "week"), False),
])
def test_the_search_key_holds_what_changes_the_answer(a, b, same):
    assert (search_key(*a) == search_key(*b)) is same


def test_outcome_size_grows_with_its_text():
    small = SearchOutcome("q", "ok", hits=[Hit("t", "https://a.example/")])
    big = SearchOutcome("q", "ok", hits=[Hit("t" * 1000, "https://a.example/", "s" * 1000)])
    assert 0 < outcome_size(small) < outcome_size(big) and outcome_size(big) > 2000


def test_kept_results_are_bounded_and_expire():
    """services.KeptResults, under Responses' replays: get/put over the same bounded TTL cache."""
    from proxy.engine.services import KeptResults
    clock = Clock()
    kept = KeptResults(10, 100, clock=clock)
    record = {"name": "web_search", "arguments": "{}", "output": "x" * 40}
    kept.put("ws_1", record)
    assert kept.get("ws_1") == record and kept.get("ws_2") is None
    kept.put("ws_2", record)
    kept.put("ws_3", record)  # past 100 bytes: the least recently used goes
    assert kept.get("ws_1") is None and kept.get("ws_3") == record
    clock.now += 11
    assert kept.get("ws_3") is None
    off = KeptResults(0, 100)
    off.put("ws_1", record)
    assert off.get("ws_1") is None
