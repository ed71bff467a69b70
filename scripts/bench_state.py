"""Benchmark of the shared state (proxy/backends/state/state.py) against the in-process default, side by side in one run;
run `~/.cache/coding-stack-tests/venv-*/bin/python -m scripts.bench_state` from the repository root (it starts
Debian's redis-server on a free loopback port, as tests/test_state.py does, and stops it by its pid).

Each case is timed in interleaved rounds (median of each, microseconds) on one search answer of 5 results and one
page of 80 kB of text (a 20,000-token page read):
  1 a cache hit in this process (STATE_URL empty, and any hit a process already holds)
  2 a hit another process put in the store (this process's copy dropped before each)
  3 a miss: the value computed, kept here and (with the store) put there
  4 the store gone: the first call (a refused connection) and the calls while the circuit is open
A hung store costs one STATE_TIMEOUT per circuit window instead (tests/test_state.py measures that).
This is a benchmark, not a test: it prints its figures and never fails on them.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from proxy.backends.pages.fetcher import Fetched, Page, fetched_from_json, fetched_json, fetched_size
from proxy.backends.search.search import Hit, SearchOutcome, outcome_from_json, outcome_json, outcome_size, search_key
from proxy.backends.state.cache import SharedTier, TTLCache
from proxy.backends.state.state import RedisState
from standins.redis_server import RedisServer

OUTCOME = SearchOutcome("vllm release notes", "ok",
                        [Hit(f"vLLM release notes, part {i}", f"https://example.org/releases/{i}", "snippet " * 30,
                             "2026-01-01") for i in range(5)])
PAGE = Fetched(Page("https://example.org/doc", "Doc", "word " * 16000, "text/html", "2026-12-03T16:20:00Z", False),
               ("https://example.org/doc",), 200)


def median_us(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def caches(store: RedisState | None):
    search = TTLCache(600, 1000, 16 << 20, outcome_size)
    page = TTLCache(300, 500, 32 << 20, fetched_size)
    if store is not None:
        search.shared = SharedTier(store, "search", outcome_json, outcome_from_json)
        page.shared = SharedTier(store, "page", fetched_json, fetched_from_json)
    return search, page


def hit(cache: TTLCache, key, value, elsewhere: bool) -> Callable[[], object]:
    """A lookup of a held key; `elsewhere`: this process's copy dropped first, so the store answers."""
    def run():
        if elsewhere:
            cache._entries.clear()  # noqa: SLF001 (a benchmark reaching in: a process that lacks the value)
            cache._bytes = 0  # noqa: SLF001
        return cache.get_or_compute(key, lambda: value, lambda _: True)
    return run


def miss(cache: TTLCache, value) -> Callable[[], object]:
    """A lookup of a key nobody holds: computed, kept, and put in the store when there is one."""
    keys = itertools.count()
    return lambda: cache.get_or_compute(search_key(f"query {next(keys)}", None, 5, None), lambda: value, lambda _: True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("-n", type=int, default=400, help="calls per case per round (default 400)")
    args = parser.parse_args()
    skey = search_key("vllm release notes", None, 5, None)
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp)) as server:
        store = RedisState(server.url, 0.25)
        local_s, local_p = caches(None)
        shared_s, shared_p = caches(store)
        for cache, key, value in ((local_s, skey, OUTCOME), (local_p, PAGE.page.url, PAGE),
                                  (shared_s, skey, OUTCOME), (shared_p, PAGE.page.url, PAGE)):
            cache.put(key, value)
        cases = {
            "search hit, this process": hit(local_s, skey, OUTCOME, False),
            "search hit, from the store": hit(shared_s, skey, OUTCOME, True),
            "search miss, in process": miss(local_s, OUTCOME),
            "search miss, with the store": miss(shared_s, OUTCOME),
            "page hit, this process": hit(local_p, PAGE.page.url, PAGE, False),
            "page hit, from the store": hit(shared_p, PAGE.page.url, PAGE, True),
        }
        results: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                results[name].append(median_us(fn, args.n))
        print(f"{'case':32} {'median µs':>10}")
        for name, values in results.items():
            print(f"{name:32} {statistics.median(values):10.1f}")
        hit_local = statistics.median(results["search hit, this process"])
        hit_store = statistics.median(results["search hit, from the store"])
        print(f"a store hit costs {hit_store / hit_local:.0f}x a hit in process (both far below a search's ~1 s)")
        server.stop()
        down = hit(shared_s, skey, OUTCOME, True)
        started = time.perf_counter()
        down()
        print(f"store gone, first call: {(time.perf_counter() - started) * 1000:.2f} ms (a refused connection); "
              f"then, circuit open: {median_us(down, args.n):.1f} µs a lookup")
        store.close()


if __name__ == "__main__":
    main()
