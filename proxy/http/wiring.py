"""The one place a worker is put together from its settings: the vLLM client, the search backend (the failover over
SEARXNG_URL's instances and the optional Brave key, under the meters, under the search cache), the page fetcher with its observer, the event hub with its subscribers (the
metrics, the access log's search count). create_app calls build_services(cfg) once per worker; not run on its own.
"""
from __future__ import annotations

from proxy.backends.brave import BraveSearch
from proxy.backends.cache import TTLCache
from proxy.backends.failover import FailoverSearch
from proxy.backends.fetcher import Fetcher
from proxy.backends.search import CachedSearch, SearchBackend, SearchOutcome, outcome_size
from proxy.backends.searxng import SearXNG
from proxy.core.config import Config
from proxy.engine.events import TOOLS_RAN, Events
from proxy.engine.services import KeptResults, Services
from proxy.observe import metrics
from proxy.tools.session import searches_in
from proxy.transport.vllm import Backend

SEARCHES = "proxy.searches"  # environ key: the searches a request ran, for the access log


def build_services(cfg: Config) -> Services:
    on = cfg.proxy_metrics
    backend = Backend(cfg.backend_url, cfg.connect_timeout, cfg.read_timeout, cfg.backend_api_key)
    instances = [SearXNG(url, cfg.searxng_results, cfg.searxng_timeout, cfg.searxng_max_bytes) for url in cfg.searxng_urls]
    keyed = (BraveSearch(cfg.brave_search_api_key, cfg.searxng_results, cfg.searxng_timeout, cfg.searxng_max_bytes,
                         cfg.brave_search_url) if cfg.brave_search_api_key else None)
    failover = FailoverSearch(instances, cfg.searxng_timeout, keyed=keyed, keyed_mode=cfg.brave_search_mode,
                              on_engine_failure=metrics.search_engine_failed if on else None,
                              on_fallback=metrics.search_fallback if on else None)
    search: SearchBackend = failover
    if on:
        search = metrics.MeteredSearch(search)  # under the cache: only searches that went out are timed
    cache: TTLCache[SearchOutcome] = TTLCache(cfg.search_cache_ttl, cfg.search_cache_entries, cfg.search_cache_bytes,
                                              outcome_size, on_size=metrics.search_cache_size if on else None)
    search = CachedSearch(search, cache, on_lookup=metrics.search_cache_lookup if on else None)
    fetcher = Fetcher(cfg, observer=metrics.FetchMeter() if on else None)
    if on:
        fetcher.cache.on_size = metrics.page_cache_size
    events = Events()
    events.subscribe(TOOLS_RAN, count_searches)
    if on:
        metrics.observe(events)
    return Services(cfg, backend, search, fetcher, events, search_health=failover.health,
                    kept=KeptResults(cfg.responses_results_ttl, cfg.responses_results_bytes))


def count_searches(environ: dict, outcomes: list) -> None:
    environ[SEARCHES] = environ.get(SEARCHES, 0) + searches_in(outcomes)
