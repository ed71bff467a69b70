"""Search backends behind one protocol: what a search gives (Hit, SearchOutcome), what a backend is
(SearchBackend: SearXNG in proxy/backends/search/searxng.py is the first), the client's domain filters on results, and
the search cache, a plain wrapper around any backend. Not run on its own; tests/test_cache.py and
tests/test_rules.py check it without a network.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from proxy.backends.pages.netguard import domain_matches
from proxy.backends.state.cache import TTLCache
from proxy.runtime.cancel import GONE, Cancel


@dataclass
class Hit:
    title: str
    url: str
    snippet: str = ""
    date: str | None = None


@dataclass
class SearchOutcome:
    """What one search produced, in a form every API can render.

    status: "ok" (hits, answers or infoboxes), "empty" (SearXNG answered with nothing),
    "failed" (no usable answer). error_code names the failure in Anthropic's vocabulary
    (unavailable, too_many_requests, invalid_tool_input, query_too_long), which is also a
    fine machine-readable reason for the other APIs.
    """
    query: str
    status: str
    hits: list[Hit] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    infoboxes: list[str] = field(default_factory=list)
    message: str = ""
    error_code: str | None = None
    repeated: bool = False
    cached_age: float | None = None  # seconds, when the search cache answered it
    timed_out: bool = False          # the backend did not answer within its deadline
    # One short line each, read before the results: how they came (a fallback instance, a retry, the keyed backend,
    # only some engines), which the model and the user reading along should know.
    notes: list[str] = field(default_factory=list)
    tool: ClassVar[str] = "web_search"  # the tool whose outcome this is (proxy/tools)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def truncated(self) -> bool:
        return False  # a search's answer is cut to the result count, never short of what it found

    @property
    def cached_note(self) -> str:
        """How the model learns it reads a cached answer, and how old it is."""
        return "" if self.cached_age is None else f" (cached, {self.cached_age:.0f} s old)"


class SearchBackend(Protocol):
    """A place to search: SearXNG, or a wrapper around one (the cache, the meters). `search()` never raises:
    every failure is an outcome with an error code and one sentence for the model; `cancel` carries the
    caller's deadline and its client's leaving, and the backend arms it with its own timeout."""

    results: int     # hits a search returns when the caller names no limit
    timeout: float   # seconds one search may take, over everything it does

    def search(self, query: str, language: str | None = None, limit: int | None = None,
               time_range: str | None = None, cancel: Cancel | None = None) -> SearchOutcome: ...


def filter_domains(outcome: SearchOutcome, allowed=None, blocked=None) -> SearchOutcome:
    """Keep only hits from allowed domains and none from blocked ones (a client's filters), by the rule web_fetch
    uses too: "example.com/docs" keeps example.com's pages under /docs, as Anthropic documents its filters. Pure."""
    if outcome.status != "ok" or not (allowed or blocked):
        return outcome
    hits = [h for h in outcome.hits
            if (not allowed or domain_matches(h.url, allowed)) and not (blocked and domain_matches(h.url, blocked))]
    # Answers and infoboxes name no source page, so an allow-list can't vouch for them.
    answers, infoboxes = ([], []) if allowed else (outcome.answers, outcome.infoboxes)
    if hits or answers or infoboxes:
        return SearchOutcome(**{**outcome.__dict__, "hits": hits, "answers": answers, "infoboxes": infoboxes})
    return SearchOutcome(outcome.query, "empty",
                         message=f'No results for "{outcome.query}" from the allowed domains. Try different keywords.')



# ---- the search cache: any backend behind a TTLCache --------------------------------------------

class _Abandoned(Exception):
    """A search its own caller's client abandoned; carries the outcome back to that caller only."""

    def __init__(self, outcome: SearchOutcome):
        super().__init__("abandoned")
        self.outcome = outcome


def search_key(query: str, language: str | None, limit: int, time_range: str | None) -> tuple:
    """What changes SearXNG's answer: the query (already cleaned by proxy.tools.web_search.clean_query; engines
    ignore case and spacing), language, time range and result count. The instance and its
    engines are one per proxy. Domain filters are not in it: they apply to the cached answer. Pure."""
    return (" ".join(query.casefold().split()), language or "", time_range or "", limit)


def outcome_json(o: SearchOutcome) -> dict:
    """An outcome as the shared search cache keeps it (proxy/backends/state/state.py): its fields, hits as objects. Pure."""
    return dataclasses.asdict(o)


def _strs(value) -> list[str] | None:
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _hit(value) -> Hit | None:
    if not isinstance(value, dict):
        return None
    title, url, snippet, date = value.get("title"), value.get("url"), value.get("snippet", ""), value.get("date")
    if not (isinstance(title, str) and isinstance(url, str) and isinstance(snippet, str)
            and (date is None or isinstance(date, str))):
        return None
    return Hit(title, url, snippet, date)


def outcome_from_json(doc) -> SearchOutcome | None:
    """What outcome_json wrote, or None for anything else the shared store handed back (a miss). Pure."""
    if not isinstance(doc, dict):
        return None
    query, status, message, code = doc.get("query"), doc.get("status"), doc.get("message", ""), doc.get("error_code")
    raw_hits = doc.get("hits", [])
    hits = [_hit(h) for h in raw_hits] if isinstance(raw_hits, list) else [None]
    lists = [_strs(doc.get(name, [])) for name in ("answers", "infoboxes", "notes")]
    if (not isinstance(query, str) or status not in ("ok", "empty", "failed") or not isinstance(message, str)
            or not (code is None or isinstance(code, str)) or any(h is None for h in hits)
            or any(v is None for v in lists)):
        return None
    answers, infoboxes, notes = (v or [] for v in lists)
    return SearchOutcome(query, status, [h for h in hits if h is not None], answers, infoboxes, message, code,
                         timed_out=doc.get("timed_out") is True, notes=notes)


def outcome_size(o: SearchOutcome) -> int:
    """Roughly the bytes an outcome holds: its text plus a fixed charge per object. Pure."""
    hits = sum(len(h.title) + len(h.url) + len(h.snippet) + len(h.date or "") + 100 for h in o.hits)
    return 300 + len(o.query) + len(o.message) + hits + sum(len(a) + 50 for a in o.answers + o.infoboxes + o.notes)


class CachedSearch:
    """SearXNG behind a TTLCache: a repeated search within SEARCH_CACHE_TTL is answered from the
    cache, identical searches at once go out once, and only answers with results are kept (an
    empty or failed answer may be the engines' passing trouble). A cached answer carries its age,
    which the model reads in the result. Every caller filters domains on what it gets, so a
    cached answer passes the same allowed/blocked lists as a fresh one.

    A plain wrapper around any SearchBackend, itself one; on_lookup(how, age) hears of each lookup
    (proxy/observe/metrics.py counts them).
    """

    scope = ""  # whose cache this view reads and fills: "" is everyone's (see scoped)

    def __init__(self, inner: SearchBackend, cache: TTLCache[SearchOutcome],
                 on_lookup: Callable[[str, float | None], None] | None = None):
        self.inner = inner
        self.results = inner.results
        self.timeout = inner.timeout
        self.cache = cache
        self._on_lookup = on_lookup

    def search(self, query: str, language: str | None = None, limit: int | None = None,
               time_range: str | None = None, cancel: Cancel | None = None) -> SearchOutcome:
        def upstream() -> SearchOutcome:
            outcome = self.inner.search(query, language=language, limit=limit, time_range=time_range, cancel=cancel)
            if cancel is not None and cancel.reason == GONE:
                # Cut short because this caller's client left: another client waiting on the same search must
                # not get that as its answer, so it searches for itself (see TTLCache.get_or_compute).
                raise _Abandoned(outcome)
            return outcome

        key = search_key(query, language, limit or self.results, time_range)
        if self.scope:
            key = (self.scope, *key)
        # A waiter gives up a little after the first search's own timeout would have ended it.
        try:
            found = self.cache.get_or_compute(key, upstream, lambda o: o.status == "ok", wait=self.timeout + 5)
        except _Abandoned as e:
            return e.outcome
        if self._on_lookup and self.cache.enabled:
            self._on_lookup(found.how, found.age)
        # A copy: callers reshape what they get, and the cached one must stay as SearXNG gave it.
        outcome = copy.deepcopy(found.value)
        outcome.query = query  # the key ignores case: the model sees its own words
        if found.how == "hit":
            outcome.cached_age = found.age
        return outcome

    def scoped(self, scope: str) -> CachedSearch:
        """This search with a cache of `scope`'s own (a person's key name): the same store and bound, keys of
        its own, so nobody learns from a hit, its age or its speed what another person searched. Pure."""
        view = copy.copy(self)
        view.scope = scope
        return view
