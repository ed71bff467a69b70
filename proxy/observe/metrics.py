"""The proxy's own Prometheus metrics, served at GET /proxy/metrics (README "Metrics" lists every one):
requests, latency and time to first byte per API, tool calls by tool and outcome, SearXNG and page
fetch latency, caps hit, clients that left, the caches. create_app calls install(); not run on its own.

Under gunicorn with PROMETHEUS_MULTIPROC_DIR set (the image and compose files set it) each worker
writes its values to files there and a scrape sums every worker's, prometheus_client's multiprocess
mode; without it (one process, tests in-process) the values live in this process. prometheus_client
picks its storage when first imported, from that variable, before any of this runs.
"""
from __future__ import annotations

import threading
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

from proxy.backends.cache import TTLCache
from proxy.backends.fetcher import Fetcher
from proxy.backends.searxng import CachedSearXNG, SearchOutcome, SearXNG, outcome_size
from proxy.core.config import Config
from proxy.core.errors import error_for_path
from proxy.tools.web_fetch import FetchError, FetchOutcome

PATH = "/proxy/metrics"
ON = "proxy.metrics"         # environ key: this request is metered (PROXY_METRICS on)
GONE = "proxy.client_gone"   # environ key: the client watch saw the client leave

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
CACHE_LOOKUPS = Counter("proxy_cache_lookups", "Cache lookups by cache (search, page) and result: hit, miss, or "
                        "shared (waited for an identical request in flight).", ["cache", "result"], registry=REGISTRY)
CACHE_HIT_AGE = Histogram("proxy_cache_hit_age_seconds", "Age of the answers the caches gave, by cache.",
                          ["cache"], buckets=AGE_BUCKETS, registry=REGISTRY)
# livesum: each worker has its own cache, and a worker that exits takes its entries with it.
CACHE_ENTRIES = Gauge("proxy_cache_entries", "Entries held by a cache (search, page), over live workers.",
                      ["cache"], multiprocess_mode="livesum", registry=REGISTRY)
CACHE_BYTES = Gauge("proxy_cache_bytes", "Bytes held by a cache (search, page; as it counts them), over live workers.",
                    ["cache"], multiprocess_mode="livesum", registry=REGISTRY)

# Error codes (Anthropic's vocabulary, which every API's outcome carries) the proxy answers itself.
REFUSED = frozenset({"invalid_tool_input", "query_too_long", "url_not_allowed"})
CAPPED = frozenset({"max_uses_exceeded"})


# ---- what to call things (pure) ---------------------------------------------------------------

def api_of(path: str) -> str:
    """The `api` label for a request path. Pure."""
    if path == "/v1/chat/completions":
        return "chat"
    if path.startswith("/v1/messages"):
        return "messages"
    if path == "/v1/responses":
        return "responses"
    if path == "/v1/alpha/search":
        return "alpha_search"
    if path.startswith("/proxy/"):
        return "proxy"  # its own health and metrics: a scrape every few seconds is not traffic
    return "relay"


def failure_outcome(code: str | None, message: str) -> str:
    """A failed tool call's outcome label from its error code and sentence. Pure."""
    if code in CAPPED:
        return "capped"
    if code in REFUSED:
        return "refused"
    if "did not answer within" in message:  # the search's and the fetch's timeout sentence
        return "timeout"
    return "failed"


def outcome_of(o) -> str:
    """ok, empty, repeated (a query the request already ran), refused, capped, timeout or failed. Pure."""
    o = getattr(o, "fetched", o)  # proxy.apis.responses.calls.FindResult: a find_in_page call and the fetch it made
    if isinstance(o, SearchOutcome):
        if o.repeated:
            return "repeated"
        if o.status in ("ok", "empty"):
            return o.status
        return failure_outcome(o.error_code, o.message)
    if isinstance(o, FetchOutcome):
        return "ok" if o.page is not None else failure_outcome(o.error_code, o.message)
    return "failed"


def tool_of(o, api: str) -> str:
    """web_search, web_fetch, open (the Responses API's open_page) or find. Pure."""
    if hasattr(o, "fetched"):
        return "find"
    if isinstance(o, FetchOutcome):
        return "open" if api == "responses" else "web_fetch"
    return "web_search"


# ---- hooks the rest of the proxy calls ----------------------------------------------------------

def tool_calls(environ, outcomes) -> None:
    """One round's outcomes, as the search loop hands them to the client (domain filters applied)."""
    if not environ.get(ON):
        return
    api = api_of(environ.get("PATH_INFO", ""))
    for o in outcomes:
        outcome = outcome_of(o)
        TOOL_CALLS.labels(api, tool_of(o, api), outcome).inc()
        if outcome == "capped":
            CAP_HITS.labels(api, "max_uses").inc()
        refusal = getattr(getattr(o, "fetched", o), "refusal", None)
        if refusal:
            url_refused(environ, refusal)
        page = getattr(getattr(o, "fetched", o), "page", None)
        if page is not None and page.truncated:
            CAP_HITS.labels(api, "page_size").inc()


def url_refused(environ, reason: str) -> None:
    """A fetch refused by URL provenance (proxy/tools/provenance.py's reasons); the link limits count as caps too."""
    if not environ.get(ON):
        return
    api = api_of(environ.get("PATH_INFO", ""))
    PROVENANCE_REFUSALS.labels(api, reason).inc()
    if reason in ("link_depth", "link_budget"):
        CAP_HITS.labels(api, reason).inc()


def tool_call(environ, tool: str, outcome: str) -> None:
    """One call counted where no loop runs it (Codex's /v1/alpha/search)."""
    if environ.get(ON):
        TOOL_CALLS.labels(api_of(environ.get("PATH_INFO", "")), tool, outcome).inc()


def cap_hit(environ, cap: str) -> None:
    if environ.get(ON):
        CAP_HITS.labels(api_of(environ.get("PATH_INFO", "")), cap).inc()


def client_left(environ, aborted: int) -> None:
    """The client watch saw the client go and cut `aborted` calls to vLLM (more may follow, one each)."""
    environ[GONE] = True
    if environ.get(ON) and aborted:
        ABORTS.labels(api_of(environ.get("PATH_INFO", ""))).inc(aborted)


# ---- the request middleware -----------------------------------------------------------------

class RequestMetrics:
    """WSGI wrapper around the whole app: a request's count, latency and time to first byte,
    recorded when its body is done (or the client left). The body passes through untouched."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        started = time.monotonic()
        environ[ON] = True
        status = ["-"]

        def sr(line, headers, exc_info=None):
            status[0] = line[:3]
            return start_response(line, headers, exc_info)

        return _Timed(self.app(environ, sr), environ, started, status)


class _Timed:
    __slots__ = ("_body", "_environ", "_started", "_status", "_first", "_complete")

    def __init__(self, body, environ, started, status):
        self._body, self._environ, self._started, self._status = body, environ, started, status
        self._first: float | None = None
        self._complete = False

    def __iter__(self):
        # Only the first non-empty chunk is looked at; the rest is delegated as it comes.
        rest = iter(self._body)
        for chunk in rest:
            if chunk:
                self._first = time.monotonic()
                yield chunk
                break
            yield chunk
        yield from rest
        self._complete = True

    def close(self):
        try:
            if hasattr(self._body, "close"):
                self._body.close()
        finally:
            now = time.monotonic()
            api = api_of(self._environ.get("PATH_INFO", ""))
            REQUESTS.labels(api, self._status[0]).inc()
            REQUEST_SECONDS.labels(api).observe(now - self._started)
            if self._first is not None:
                FIRST_BYTE_SECONDS.labels(api).observe(self._first - self._started)
            # gunicorn closes a body it stopped sending early: a client that hung up mid-answer.
            if self._environ.get(GONE) or not self._complete:
                DISCONNECTS.labels(api).inc()


# ---- around SearXNG and the fetcher --------------------------------------------------------------

def searxng_answered(outcome: SearchOutcome, seconds: float) -> None:
    SEARXNG_SECONDS.labels(outcome.status if outcome.status != "failed"
                           else failure_outcome(outcome.error_code, outcome.message)).observe(seconds)


def cache_size(cache: str, entries: int, size: int) -> None:
    CACHE_ENTRIES.labels(cache).set(entries)
    CACHE_BYTES.labels(cache).set(size)


def cache_lookup(cache: str, how: str, age: float | None) -> None:
    CACHE_LOOKUPS.labels(cache, how).inc()
    if age is not None:
        CACHE_HIT_AGE.labels(cache).observe(age)


class MeteredFetcher(Fetcher):
    """The fetcher create_app built, timing each fetch that went out and counting the bytes read and the page
    cache's lookups. It takes over that fetcher's state, so its settings and its page cache stay as they were."""

    def __init__(self, built: Fetcher):
        self.__dict__.update(built.__dict__)
        self._lookup = threading.local()  # this greenlet's (or thread's) last lookup: a fetch, or the cache's
        self.cache.on_size = lambda entries, size: cache_size("page", entries, size)

    def looked_up(self, how: str, age: float | None) -> None:
        self._lookup.how = how
        if self.cache.enabled:
            cache_lookup("page", how, age)

    def fetch(self, url: str, **kw):  # the same keywords as Fetcher.fetch, passed on as they are
        started = time.monotonic()
        self._lookup.how = "miss"
        outcome = "ok"
        try:
            return super().fetch(url, **kw)
        except FetchError as e:
            outcome = failure_outcome(e.code, e.message)
            raise
        finally:
            if self._lookup.how == "miss":  # a page from the cache, or from another request's download, is no fetch
                FETCH_SECONDS.labels(outcome).observe(time.monotonic() - started)

    def _read_body(self, *args, **kw):
        body, cut = super()._read_body(*args, **kw)
        FETCH_BYTES.inc(len(body))
        return body, cut


def instrument(cfg: Config, searxng: SearXNG, fetcher: Fetcher) -> tuple[SearXNG, Fetcher]:
    """The SearXNG and fetcher create_app built, behind the search cache and metered (PROXY_METRICS)."""
    on = cfg.proxy_metrics
    cache: TTLCache[SearchOutcome] = TTLCache(
        cfg.search_cache_ttl, cfg.search_cache_entries, cfg.search_cache_bytes, outcome_size,
        on_size=(lambda entries, size: cache_size("search", entries, size)) if on else None)
    cached = CachedSearXNG(searxng, cache, on_answer=searxng_answered if on else None,
                           on_lookup=(lambda how, age: cache_lookup("search", how, age)) if on else None)
    return cached, (MeteredFetcher(fetcher) if on else fetcher)


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
    """GET /proxy/metrics, behind PROXY_API_KEY like every path not in app.OPEN_PATHS, and the
    request middleware (outermost, so its latency is the whole request's)."""

    @app.route(PATH)
    def proxy_metrics():
        if not cfg.proxy_metrics:
            return error_for_path(PATH, 404, "The proxy's metrics are off (PROXY_METRICS=off).")
        return Response(exposition(cfg.metrics_dir), headers={"Content-Type": CONTENT_TYPE_LATEST})

    if cfg.proxy_metrics:
        app.wsgi_app = RequestMetrics(app.wsgi_app)  # type: ignore[method-assign]  # Flask's documented way

