"""The one place a worker is put together from its settings: the vLLM client, the search backend (the failover over
SEARXNG_URL's instances and the optional Brave key, under the meters, under the search cache), the page fetcher with its observer,
the shared state store when STATE_URL names one (under both caches, Codex's ref ids, the cool-downs and the
clients' link reads), the event hub with every subscriber (the access log, the metrics). create_app calls
build_services(cfg) once per worker; not run on its own.
"""
from __future__ import annotations

import functools
import logging

from proxy.apis.alpha_search import handler as alpha_search
from proxy.apis.responses import presentation as responses_presentation
from proxy.backends.pages.fetcher import Fetcher, fetched_from_json, fetched_json
from proxy.backends.search.brave import BraveSearch
from proxy.backends.search.failover import FailoverSearch
from proxy.backends.search.search import (
    CachedSearch,
    SearchBackend,
    SearchOutcome,
    outcome_from_json,
    outcome_json,
    outcome_size,
)
from proxy.backends.search.searxng import SearXNG
from proxy.backends.state.cache import SharedTier, TTLCache
from proxy.backends.state.state import open_state
from proxy.backends.state.teamstore import TeamStorage, TeamStore
from proxy.core.config import Config, masked_url
from proxy.engine.admission import Queue
from proxy.engine.events import Events, RequestEnded
from proxy.engine.services import KeptResults, Services
from proxy.http.flow import access_log
from proxy.http.team import Team
from proxy.observe import metrics
from proxy.tools.client_reads import ClientReads, Reads, SharedReads
from proxy.transport.vllm import Backend

log = logging.getLogger(__name__)

def build_services(cfg: Config) -> Services:
    on = cfg.proxy_metrics
    # STATE_URL empty: None, and every use keeps its state in this process as before (redis is never imported).
    shown = masked_url(cfg.state_url)  # the store's label in the metrics: never its password
    state = open_state(cfg.state_url, cfg.state_timeout, on_error=metrics.state_error if on else None,
                       on_up=functools.partial(metrics.state_up, shown) if on else None)
    if state is not None and on:
        metrics.state_up(shown, True)  # until a call finds it down
    backend = Backend(cfg.backend_url, cfg.connect_timeout, cfg.read_timeout, cfg.backend_api_key)
    instances = [SearXNG(url, cfg.searxng_results, cfg.searxng_timeout, cfg.searxng_max_bytes) for url in cfg.searxng_urls]
    keyed = (BraveSearch(cfg.brave_search_api_key, cfg.searxng_results, cfg.searxng_timeout, cfg.searxng_max_bytes,
                         cfg.brave_search_url) if cfg.brave_search_api_key else None)
    failover = FailoverSearch(instances, cfg.searxng_timeout, keyed=keyed, keyed_mode=cfg.brave_search_mode,
                              on_engine_failure=metrics.search_engine_failed if on else None,
                              on_fallback=metrics.search_fallback if on else None, shared=state)
    search: SearchBackend = failover
    if on:
        search = metrics.MeteredSearch(search)  # under the cache: only searches that went out are timed
    cache: TTLCache[SearchOutcome] = TTLCache(cfg.search_cache_ttl, cfg.search_cache_entries, cfg.search_cache_bytes,
                                              outcome_size, on_size=metrics.search_cache_size if on else None)
    search = CachedSearch(search, cache, on_lookup=metrics.search_cache_lookup if on else None)
    fetcher = Fetcher(cfg, observer=metrics.FetchMeter() if on else None)
    if on:
        fetcher.cache.on_size = metrics.page_cache_size
    if state is not None:
        errors = metrics.state_error if on else None
        cache.shared = SharedTier(state, "search", outcome_json, outcome_from_json, errors)
        fetcher.cache.shared = SharedTier(state, "page", fetched_json, fetched_from_json, errors)
    team_store = build_store(cfg) if cfg.max_num_seqs else None
    queue = (Queue(team_store, cfg.max_num_seqs, cfg.queue_policy, on_wait=metrics.queue_waited if on else None,
                   on_error=metrics.state_error if on else None) if team_store else None)
    # URL provenance's hourly link budget: one per client across every worker and replica with STATE_URL.
    reads: Reads = SharedReads(state) if state is not None else ClientReads()
    return Services(cfg, backend, search, fetcher, observe(cfg), state=state, reads=reads,
                    search_health=failover.health, queue=queue,
                    kept=KeptResults(cfg.responses_results_ttl, cfg.responses_results_bytes, state=state))


def observe(cfg: Config) -> Events:
    """The worker's event hub with every subscriber, registered here and nowhere else: the access log, and the
    metrics with PROXY_METRICS."""
    events = Events()
    events.subscribe(RequestEnded, access_log)
    if cfg.proxy_metrics:
        metrics.observe(events, tool_labels())
    return events


def tool_labels() -> dict[str, dict[str, str]]:
    """Per API, the metric label of each tool that API calls by another name (its presentation table's)."""
    return {"responses": responses_presentation.metric_labels(), "alpha_search": alpha_search.METRIC_LABELS}


def observe_team(events: Events, team: Team) -> None:
    """A shared stack's subscriber (proxy/http/team.py): each request's usage, searches, page reads and refused
    fetches (its flow's tally) added to its key's day when it ends. create_app calls it once it has built the Team."""
    events.subscribe(RequestEnded, team.request_ended)


def build_store(cfg: Config) -> TeamStorage | None:
    """The shared store, when keys or the fair queue need it: Redis with STATE_URL, else the SQLite file
    PROXY_STATE_DB (Config.from_env always names one that lasts), whose place is logged: a person looking for
    yesterday's usage must find it."""
    if not (cfg.proxy_keys_file or cfg.max_num_seqs):
        return None
    if cfg.state_url:
        # Imported here, as backends/state/state.py imports redis-py: a proxy without STATE_URL never loads it.
        from proxy.backends.state.teamstore_redis import RedisTeamStore
        return RedisTeamStore(cfg.state_url)
    if not cfg.proxy_state_db:
        raise ValueError("PROXY_STATE_DB is empty: the keys' usage and the fair queue need a file that lasts")
    log.info("usage per key, quotas and the fair queue are kept in %s (PROXY_STATE_DB)", cfg.proxy_state_db)
    return TeamStore(cfg.proxy_state_db)
