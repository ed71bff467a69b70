"""The proxy's own Prometheus metrics, served at GET /proxy/metrics (docs/operations.md, "Metrics" lists every one):
requests, latency and time to first byte per API, tool calls by tool and outcome, SearXNG and page
fetch latency, caps hit, clients that left, the caches. create_app calls install(); not run on its own.

Under gunicorn with PROMETHEUS_MULTIPROC_DIR set (the image and compose files set it) each worker
writes its values to files there and a scrape sums every worker's, prometheus_client's multiprocess
mode; without it (one process, tests in-process) the values live in this process. prometheus_client
picks its storage when first imported, from that variable, before any of this runs.
"""
from __future__ import annotations

import time

from flask import Flask, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)

from proxy.backends.pages.fetcher import FetchError, FetchObserver
from proxy.backends.search.search import SearchBackend, SearchOutcome
from proxy.core.config import Config
from proxy.core.errors import error_response
from proxy.core.routes import PROXY_METRICS
from proxy.engine.events import BackendRetried, CapHit, ClientLeft, Events, RequestEnded, RoundDone, UrlRefused
from proxy.engine.flow import Flow
from proxy.runtime.cancel import Cancel
from proxy.tools.base import Outcome

PATH = PROXY_METRICS

# No `_created` series: multiprocess mode has none, and one process should look like several.
disable_created_metrics()
REGISTRY = CollectorRegistry()

# Whole requests run from milliseconds (a relayed /v1/models) to many minutes (a long generation).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900)
# A search or a page read: tens of milliseconds to the timeouts (SEARXNG_TIMEOUT 15 s, WEB_FETCH_TIMEOUT 20 s).
UPSTREAM_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 8, 12, 20, 30)
# A cached answer's age: up to SEARCH_CACHE_TTL (10 min) and WEB_FETCH_CACHE_TTL, or longer when raised.
AGE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400)

REQUESTS = Counter("proxy_requests", "Requests answered by the proxy, by API and HTTP status.",
                   ["api", "status"], registry=REGISTRY)
REQUEST_SECONDS = Histogram("proxy_request_duration_seconds", "From a request's arrival to its last body byte, by API.",
                            ["api"], buckets=REQUEST_BUCKETS, registry=REGISTRY)
FIRST_BYTE_SECONDS = Histogram("proxy_time_to_first_byte_seconds",
                               "From a request's arrival to the first body byte handed to the server, by API.",
                               ["api"], buckets=REQUEST_BUCKETS, registry=REGISTRY)
PROMPT_TOKENS = Counter("proxy_prompt_tokens", "Prompt tokens of the model's answers (every vLLM turn of a search "
                        "loop), by API, as their usage reported them.", ["api"], registry=REGISTRY)
CACHED_TOKENS = Counter("proxy_cached_prompt_tokens", "Of those, the prompt tokens vLLM's prefix cache served "
                        "(usage's cached_tokens, Anthropic's cache_read_input_tokens), by API.", ["api"],
                        registry=REGISTRY)
TOOL_CALLS = Counter("proxy_tool_calls", "Server-side tool calls the proxy ran, by API, tool and outcome.",
                     ["api", "tool", "outcome"], registry=REGISTRY)
SEARXNG_SECONDS = Histogram("proxy_searxng_request_duration_seconds",
                            "Searches sent to SearXNG (cache hits excluded), by outcome.",
                            ["outcome"], buckets=UPSTREAM_BUCKETS, registry=REGISTRY)
FETCH_SECONDS = Histogram("proxy_page_fetch_duration_seconds",
                          "Page fetches by web_fetch, open and find (cache hits excluded), by outcome.",
                          ["outcome"], buckets=UPSTREAM_BUCKETS, registry=REGISTRY)
FETCH_BYTES = Counter("proxy_page_fetch_bytes", "Page body bytes read from web servers (after decompression).",
                      registry=REGISTRY)
CAP_HITS = Counter("proxy_cap_hits", "Limits reached, by API and cap: search_rounds (MAX_SEARCH_ITER), "
                   "max_uses (a request's own), page_size (a page cut short).", ["api", "cap"], registry=REGISTRY)
PROVENANCE_REFUSALS = Counter("proxy_url_refusals", "web_fetch, open and find calls refused before any lookup by URL "
                              "provenance (WEB_FETCH_URLS), by API and reason: not_given, link_depth, link_budget.",
                              ["api", "reason"], registry=REGISTRY)
DISCONNECTS = Counter("proxy_client_disconnects", "Clients that left before their answer was complete, by API.",
                      ["api"], registry=REGISTRY)
ABORTS = Counter("proxy_backend_aborts", "Calls to vLLM cut because their client left, by API.",
                 ["api"], registry=REGISTRY)
# Behind vllm-router (compose.scale.yaml) a worker lost mid-run shows here: each is a request that still succeeded.
BACKEND_RETRIES = Counter("proxy_backend_retries", "Calls to vLLM tried once more after failing before any answer, "
                          "by API and reason: unreachable (refused, reset, closed), 500, 502 or 503 (a gateway's, "
                          "in plain text).",
                          ["api", "reason"], registry=REGISTRY)
CACHE_LOOKUPS = Counter("proxy_cache_lookups", "Cache lookups by cache (search, page) and result: hit, miss, or "
                        "shared (waited for an identical request in flight).", ["cache", "result"], registry=REGISTRY)
CACHE_HIT_AGE = Histogram("proxy_cache_hit_age_seconds", "Age of the answers the caches gave, by cache.",
                          ["cache"], buckets=AGE_BUCKETS, registry=REGISTRY)
# livesum: each worker has its own cache, and a worker that exits takes its entries with it.
CACHE_ENTRIES = Gauge("proxy_cache_entries", "Entries held by a cache (search, page), over live workers.",
                      ["cache"], multiprocess_mode="livesum", registry=REGISTRY)
CACHE_BYTES = Gauge("proxy_cache_bytes", "Bytes held by a cache (search, page; as it counts them), over live workers.",
                    ["cache"], multiprocess_mode="livesum", registry=REGISTRY)
# The name and labels a Grafana dashboard queries (proxy_search_engine_failures_total{engine, reason}): every engine
# a SearXNG answer lists in unresponsive_engines, results or not; reason is one of search_health.REASONS.
ENGINE_FAILURES = Counter("proxy_search_engine_failures", "Search engines a SearXNG answer listed as failing "
                          "(unresponsive_engines), by engine and reason: suspended, captcha, too_many_requests, "
                          "timeout, error.", ["engine", "reason"], registry=REGISTRY)
KEY_USAGE = Counter("proxy_key_usage", "Usage per key name (PROXY_KEYS_FILE's names; admin: PROXY_API_KEY), by "
                    "figure: requests, prompt_tokens, completion_tokens, cached_tokens, searches, page_reads, "
                    "refused_fetches, queued_seconds.", ["key", "figure"], registry=REGISTRY)
KEY_LIMITED = Counter("proxy_key_limited", "Requests refused with 429 because their key was over a limit, by key "
                      "name and limit (rpm, tokens_per_day, concurrent).", ["key", "limit"], registry=REGISTRY)
QUEUE_WAIT = Histogram("proxy_queue_wait_seconds", "Time a call to vLLM waited for a seat in the fair queue "
                       "(MAX_NUM_SEQS), by API.", ["api"], buckets=REQUEST_BUCKETS, registry=REGISTRY)
SEARCH_FALLBACKS = Counter("proxy_search_fallbacks", "Searches answered another way than by the first SearXNG "
                           "instance, by kind: instance (a later one), retry (engines not failing), keyed (the "
                           "Brave Search API).", ["kind"], registry=REGISTRY)
# The shared state store (STATE_URL, proxy/backends/state/state.py): calls that got no answer, by use (search, page, refs,
# health, reads, link_charges and page_links: URL provenance's memory, whose link fetches are refused while it is
# down; session-secret: the X-Session-ID key without SESSION_ID_SECRET; queue: the fair queue's store, without which
# calls go straight to vLLM) and op (get, put, drop, count, fields, add_fields, drop_fields, claim; decode: a value
# that was not one the proxy writes), and
# whether the store answers. livemin: one worker that finds it down shows it down.
STATE_ERRORS = Counter("proxy_state_errors", "Calls to the shared state store (STATE_URL) that got no answer (or a "
                       "value the proxy did not write), by use and op.", ["use", "op"], registry=REGISTRY)
# Labelled by the store (STATE_URL, its password masked) so that without STATE_URL there is no series at all, rather
# than an unlabelled gauge's 0 that would read as a store that is down.
STATE_UP = Gauge("proxy_state_up", "1 while the shared state store (STATE_URL) answers, 0 while it is down; "
                 "absent without STATE_URL.", ["store"], multiprocess_mode="livemin", registry=REGISTRY)

# Error codes (Anthropic's vocabulary, which every API's outcome carries) the proxy answers itself.
REFUSED = frozenset({"invalid_tool_input", "query_too_long", "url_not_allowed"})
CAPPED = frozenset({"max_uses_exceeded"})


# ---- what to call things (pure) ---------------------------------------------------------------

def failure_outcome(code: str | None, timed_out: bool) -> str:
    """A failed tool call's outcome label from its error code and whether it ran out of time. Pure."""
    if code in CAPPED:
        return "capped"
    if code in REFUSED:
        return "refused"
    return "timeout" if timed_out else "failed"


def outcome_of(o: Outcome) -> str:
    """ok, empty, repeated (a query the request already ran), refused, capped, timeout or failed. Pure."""
    if o.repeated:
        return "repeated"
    if o.status in ("ok", "empty"):
        return o.status
    return failure_outcome(o.error_code, o.timed_out)


def tool_of(o: Outcome, api: str, labels: dict[str, dict[str, str]]) -> str:
    """The `tool` label: the API's own name for the tool where its table gives one (`open` and `find` on
    /v1/responses and Codex's web.run), else the tool's registry name. Pure."""
    return labels.get(api, {}).get(o.tool, o.tool)


# ---- what the engine tells (proxy/engine/events.py) ---------------------------------------------

def observe(events: Events, labels: dict[str, dict[str, str]] | None = None) -> None:
    """Count what the worker's requests do: each event the metrics need, subscribed once per worker. `labels`: per
    API label, each tool's metric label where it is not its name (the composition root reads the API tables)."""
    rounds = RoundMeter(labels or {})
    events.subscribe(RoundDone, rounds.round_done)
    events.subscribe(UrlRefused, url_refused)
    events.subscribe(CapHit, cap_hit)
    events.subscribe(ClientLeft, client_left)
    events.subscribe(BackendRetried, backend_retried)
    events.subscribe(RequestEnded, request_ended)


class RoundMeter:
    """Counts each round's tool calls by API, tool label and outcome, and the caps their outcomes show."""

    def __init__(self, labels: dict[str, dict[str, str]]):
        self.labels = labels

    def round_done(self, flow: Flow, done: RoundDone) -> None:
        """One round's outcomes, as the search loop hands them to the client (domain filters applied)."""
        api = flow.route.api
        for o in done.outcomes:
            outcome = outcome_of(o)
            TOOL_CALLS.labels(api, tool_of(o, api, self.labels), outcome).inc()
            if outcome == "capped":
                CAP_HITS.labels(api, "max_uses").inc()
            if o.truncated:
                CAP_HITS.labels(api, "page_size").inc()


def url_refused(flow: Flow, refused: UrlRefused) -> None:
    """A page read refused by URL provenance (proxy/tools/provenance.py's reasons); the link limits are caps too."""
    api, reason = flow.route.api, refused.reason
    PROVENANCE_REFUSALS.labels(api, reason).inc()
    if reason in ("link_depth", "link_budget"):
        CAP_HITS.labels(api, reason).inc()


def cap_hit(flow: Flow, hit: CapHit) -> None:
    CAP_HITS.labels(flow.route.api, hit.cap).inc()


def backend_retried(flow: Flow, retried: BackendRetried) -> None:
    BACKEND_RETRIES.labels(flow.route.api, retried.reason).inc()


def client_left(flow: Flow, left: ClientLeft) -> None:
    """The client watch saw the client go and cut `aborted` calls to vLLM (more may follow, one each)."""
    if left.aborted:
        ABORTS.labels(flow.route.api).inc(left.aborted)


# ---- a shared stack: per key name (never the key), and the fair queue ---------------------------------

def key_used(name: str, figures: dict[str, float]) -> None:
    """One request's usage, added to its key's counters (the same figures /proxy/usage keeps per day)."""
    for figure, value in figures.items():
        if value:
            KEY_USAGE.labels(name, figure).inc(value)


def key_limited(name: str, limit: str) -> None:
    KEY_LIMITED.labels(name, limit).inc()


def queue_waited(flow: Flow, seconds: float) -> None:
    QUEUE_WAIT.labels(flow.route.api).observe(seconds)


# ---- the request middleware -----------------------------------------------------------------

def request_ended(flow: Flow, done: RequestEnded) -> None:
    """A request's count, latency and time to first byte, recorded when its body is done (or the client left)."""
    api = flow.route.api
    REQUESTS.labels(api, done.status).inc()
    REQUEST_SECONDS.labels(api).observe(done.ended - done.started)
    if done.first_byte is not None:
        FIRST_BYTE_SECONDS.labels(api).observe(done.first_byte - done.started)
    if done.usage is not None:
        PROMPT_TOKENS.labels(api).inc(done.usage[0])
        CACHED_TOKENS.labels(api).inc(done.usage[1])
    # gunicorn closes a body it stopped sending early: a client that hung up mid-answer.
    if flow.tally.client_left or not done.complete:
        DISCONNECTS.labels(api).inc()


# ---- around SearXNG and the fetcher --------------------------------------------------------------

def cache_size(cache: str, entries: int, size: int) -> None:
    CACHE_ENTRIES.labels(cache).set(entries)
    CACHE_BYTES.labels(cache).set(size)


def cache_lookup(cache: str, how: str, age: float | None) -> None:
    CACHE_LOOKUPS.labels(cache, how).inc()
    if age is not None:
        CACHE_HIT_AGE.labels(cache).observe(age)


class FetchMeter(FetchObserver):
    """The fetcher's observer: each fetch that went out timed by outcome, the bytes read, the page cache's lookups."""

    def looked_up(self, how: str, age: float | None) -> None:
        cache_lookup("page", how, age)

    def fetched(self, error: FetchError | None, seconds: float) -> None:
        FETCH_SECONDS.labels("ok" if error is None else failure_outcome(error.code, error.timed_out)).observe(seconds)

    def read(self, nbytes: int) -> None:
        FETCH_BYTES.inc(nbytes)


class MeteredSearch:
    """Any search backend, each search that went out timed by outcome; itself a search backend. Put under the
    search cache, so cache hits are not counted as searches."""

    def __init__(self, inner: SearchBackend):
        self.inner = inner
        self.results = inner.results
        self.timeout = inner.timeout

    def search(self, query: str, language: str | None = None, limit: int | None = None,
               time_range: str | None = None, cancel: Cancel | None = None) -> SearchOutcome:
        started = time.monotonic()
        outcome = self.inner.search(query, language=language, limit=limit, time_range=time_range, cancel=cancel)
        SEARXNG_SECONDS.labels(outcome.status if outcome.status != "failed"
                               else failure_outcome(outcome.error_code, outcome.timed_out)).observe(
                                   time.monotonic() - started)
        return outcome


def search_engine_failed(engine: str, reason: str) -> None:
    ENGINE_FAILURES.labels(engine, reason).inc()


def search_fallback(kind: str) -> None:
    SEARCH_FALLBACKS.labels(kind).inc()


def search_cache_size(entries: int, size: int) -> None:
    cache_size("search", entries, size)


def page_cache_size(entries: int, size: int) -> None:
    cache_size("page", entries, size)


def search_cache_lookup(how: str, age: float | None) -> None:
    cache_lookup("search", how, age)


def state_error(use: str, op: str) -> None:
    STATE_ERRORS.labels(use, op).inc()


def state_up(store: str, up: bool) -> None:
    STATE_UP.labels(store).set(1 if up else 0)


# ---- the endpoint ------------------------------------------------------------------------------

def exposition(multiproc_dir: str) -> bytes:
    """Every metric in Prometheus' text format: summed over gunicorn's workers from their files in
    multiproc_dir, or this process's own without one."""
    if not multiproc_dir:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=multiproc_dir)
    return generate_latest(registry)


def install(app: Flask, cfg: Config) -> None:
    """GET /proxy/metrics, behind PROXY_API_KEY like every path not in routes.OPEN_PATHS."""

    @app.route(PATH)
    def proxy_metrics():
        if not cfg.proxy_metrics:
            return error_response(404, "The proxy's metrics are off (PROXY_METRICS=off).")
        return Response(exposition(cfg.metrics_dir), headers={"Content-Type": CONTENT_TYPE_LATEST})

