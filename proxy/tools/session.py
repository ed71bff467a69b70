"""The server-side tools as one layer: ToolSession runs every tool call the proxy answers itself (web_search
on SearXNG, web_fetch and find_in_page on the page fetcher) for one client request, round by round, and
tool_text is what the model reads for one of them. SearXNG (proxy/backends/searxng.py) and the fetcher
(proxy/backends/fetcher.py) are its backends; each API (chat, messages, responses) turns its own tool calls into the
items run() takes and renders the outcomes in its own shape.

Not run on its own; tests/test_rules.py checks the bookkeeping with a SearXNG stand-in.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace

from proxy.backends.fetcher import Fetcher
from proxy.backends.searxng import SearchOutcome, SearXNG, format_for_model
from proxy.runtime.cancel import Cancel, watched
from proxy.runtime.concurrency import run_together
from proxy.tools.provenance import Ledger
from proxy.tools.web_fetch import FetchOutcome, FetchRequest, format_page_for_model

log = logging.getLogger("proxy.tools")


def tool_text(outcome) -> str:
    """What the model reads for one call of a round: a search's results or a fetched page. Pure."""
    return format_page_for_model(outcome) if isinstance(outcome, FetchOutcome) else format_for_model(outcome)


class ToolSession:
    """The server-side tool calls of one client request, round by round: runs its searches (on SearXNG)
    and page reads (on the fetcher) side by side, each on the client's watch, applies the fetch caps,
    remembers the searches and counts both; MAX_SEARCH_ITER bounds its rounds.

    Repeating an identical query is the usual loop of local models, so a repeat is answered
    from memory with a note instead of hitting SearXNG again. A page fetched again comes from
    the fetcher's cache.
    """

    def __init__(self, searxng: SearXNG, max_rounds: int, on_search=None, fetcher: Fetcher | None = None,
                 watch=None, ledger: Ledger | None = None):
        self.searxng = searxng
        self.fetcher = fetcher
        # The URLs this request may fetch (proxy/tools/provenance.py); none given means none allowed, not all.
        self.ledger = ledger if ledger is not None else Ledger()
        self.fetches = 0
        self.fetched = 0    # web_fetch calls run (not refused before fetching): what the caps count
        self.max_rounds = max_rounds
        self.rounds = 0
        self.searches = 0
        self.empty = 0
        self.failed = 0
        self.repeated = 0   # queries answered from memory, not searched again
        self._seen: dict[str, SearchOutcome] = {}
        self._on_search = on_search
        self._watch = watch  # () -> the client's ClientWatch or None: each call is on it while it runs
        self._lock = threading.Lock()

    @property
    def exhausted(self) -> bool:
        return self.rounds >= self.max_rounds

    def _capped(self, items: list) -> list:
        """The round's items with fetches past WEB_FETCH_MAX_PER_TURN or WEB_FETCH_MAX_PER_REQUEST replaced by
        the outcome that tells the model so: a prompt-injected model must not turn one request into
        unbounded traffic to third-party hosts."""
        if self.fetcher is None:
            return items
        per_turn, per_request = self.fetcher.max_per_turn, self.fetcher.max_per_request
        out, this_turn = [], 0
        for item in items:
            if isinstance(item, FetchRequest) and item.early is None:
                if this_turn >= per_turn:
                    item = replace(item, early=FetchOutcome(item.url, error_code="max_uses_exceeded", message=(
                        f"Fetch failed: not fetched: one turn may fetch at most {per_turn} pages "
                        "(WEB_FETCH_MAX_PER_TURN). Fetch the most useful pages first, fewer at a time.")))
                elif self.fetched >= per_request:
                    item = replace(item, early=FetchOutcome(item.url, error_code="max_uses_exceeded", message=(
                        f"Fetch failed: not fetched: this request already fetched {per_request} pages, the most one "
                        "request may (WEB_FETCH_MAX_PER_REQUEST). Answer from what you have read.")))
                else:
                    this_turn += 1
                    self.fetched += 1
            out.append(item)
        return out

    def _provenance(self, items: list) -> list:
        """The round's fetches of URLs the conversation did not give (or links past the chain limits) replaced by
        the outcome that says so, before the fetcher looks up any name: a URL the model built is a message to the
        server or name server it names (issue 33). After the caps, so a capped call spends no link budget."""
        out = []
        for item in items:
            if isinstance(item, FetchRequest) and item.early is None:
                refusal = self.ledger.admit(item.url)
                if refusal is not None:
                    item = replace(item, early=FetchOutcome(item.url, error_code="url_not_allowed", refusal=refusal.reason,
                                                            message=f"Fetch failed: {refusal.message}"))
            out.append(item)
        return out

    def run(self, queries: list, limit: int | None = None, language: str | None = None) -> list:
        """Run one round: each item is a parse_arguments() result (a search, giving a SearchOutcome)
        or a fetch.FetchRequest (giving a FetchOutcome); outcomes in the items' order, all run
        concurrently. Never raises: every failure is an outcome the model reads."""
        self.rounds += 1
        queries = self._provenance(self._capped(queries))

        def one(item):
            # On the client's watch: its leaving ends the fetch or search at once.
            with watched(self._watch() if self._watch is not None else None) as cancel:
                try:
                    return self._one(item, limit, language, cancel)
                except Exception:
                    # A bug or a library's surprise must not end the client's turn with a 500: the model reads
                    # a failure, the log keeps the traceback.
                    log.exception("a %s failed unexpectedly", "fetch" if isinstance(item, FetchRequest) else "search")
                    if isinstance(item, FetchRequest):
                        return FetchOutcome(item.url, error_code="unavailable", message=(
                            "Fetch failed: the proxy could not read this page (an internal error)."))
                    return SearchOutcome(str(item[0]), "failed", error_code="unavailable",
                                         message="Search failed: the proxy could not run this search (an internal error).")

        # No items: a round of calls all refused before searching still counts as a round.
        outcomes = run_together(one, queries, at_most=8)
        for o in outcomes:
            if isinstance(o, FetchOutcome):
                self.fetches += 1
                if o.page is not None:  # its links, as the model reads them, may be followed (within the limits)
                    self.ledger.learn_page(o.url, o.page.url, o.page.text)
                continue
            self.ledger.allow([h.url for h in o.hits], "search")
            if o.repeated:
                self.repeated += 1
                continue
            self.searches += 1
            self.empty += o.status == "empty"
            self.failed += o.status == "failed"
        if self._on_search:
            self._on_search(len([o for o in outcomes if isinstance(o, SearchOutcome) and not o.repeated]))
        return outcomes

    def _one(self, item, limit: int | None, language: str | None, cancel: Cancel):
        if isinstance(item, FetchRequest):
            if self.fetcher is None:
                return FetchOutcome(item.url, error_code="unavailable", message="Fetch failed: web_fetch is off.")
            return self.fetcher.run(item, cancel)
        query, early = item
        if early is not None:
            return early
        key = query.casefold()
        with self._lock:
            if key in self._seen:
                prev = self._seen[key]
                return SearchOutcome(**{**prev.__dict__, "repeated": True})
        outcome = self.searxng.search(query, language=language, limit=limit, cancel=cancel)
        with self._lock:
            self._seen[key] = outcome
        return outcome

    def cap_message(self) -> str:
        """The error the client reads when the model wants more rounds than allowed: the
        limit (MAX_SEARCH_ITER), and what the rounds it had found."""
        unusable = self.empty + self.failed
        fetched = f", {_count(self.fetches, 'page', 'pages')} fetched" if self.fetches else ""
        msg = (f"{self.rounds} of {_count(self.max_rounds, 'search round', 'search rounds')} used "
               f"({_count(self.searches, 'search', 'searches')}, {self.repeated} repeated, {unusable} empty{fetched})")
        if self.searches and unusable == self.searches:
            msg += " — SearXNG returned no usable results"
        return msg


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
