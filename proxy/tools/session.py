"""ToolSession: every server-side tool call of one client request, round by round. It hands each call to the
tool that owns it (proxy/tools/registry.py), runs a round's calls side by side on the client's watch, applies
the page caps, URL provenance (proxy/tools/provenance.py) and MAX_SEARCH_ITER, and counts what ran. Each API turns its own tool calls into the requests
run() takes (registry.parse) and renders the outcomes in its own shape.

Not run on its own; tests/test_rules.py checks the bookkeeping with a SearXNG stand-in.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from proxy.runtime.cancel import watched
from proxy.runtime.concurrency import run_together
from proxy.tools.base import PAGE, SEARCH, Backends, Outcome, Request, RunContext
from proxy.tools.provenance import Ledger
from proxy.tools.registry import TOOLS, sources

log = logging.getLogger("proxy.tools")


class ToolSession:
    """The tool calls of one client request: the rounds (MAX_SEARCH_ITER bounds them), the page caps
    (WEB_FETCH_MAX_PER_TURN and _PER_REQUEST over every tool that reads pages), the request's memory that tools
    keep (web_search's answers to repeated queries), and the counts the cap's message and the access log use."""

    def __init__(self, backends: Backends, max_rounds: int, max_pages_per_turn: int = 0,
                 max_pages_per_request: int = 0, watch=None, ledger: Ledger | None = None,
                 on_refused: Callable[[str], None] | None = None):
        self.backends = backends
        # The URLs this request may read; none given means none allowed, not all.
        self.ledger = ledger if ledger is not None else Ledger()
        self._on_refused = on_refused  # hears each provenance refusal's reason (the metrics)
        self.max_rounds = max_rounds
        self.max_per_turn = max_pages_per_turn
        self.max_per_request = max_pages_per_request
        self.rounds = 0
        self.pages_read = 0   # page reads run (not refused before running): what the caps count
        self.fetches = 0      # outcomes of tools that read pages, refused ones included
        self.searches = 0     # searches run (not answered from memory)
        self.empty = 0
        self.failed = 0
        self.repeated = 0     # queries answered from memory, not searched again
        self._memory: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._watch = watch   # () -> the client's ClientWatch or None: each call is on it while it runs

    @property
    def exhausted(self) -> bool:
        return self.rounds >= self.max_rounds

    def _capped(self, requests: list[Request]) -> list[Outcome | None]:
        """Per request, the outcome that refuses it for a page cap, or None to run it: a prompt-injected model
        must not turn one request into unbounded traffic to third-party hosts."""
        out: list[Outcome | None] = []
        this_turn = 0
        for request in requests:
            tool = TOOLS[request.tool]
            refusal = None
            if tool.kind == PAGE and request.early is None:
                if this_turn >= self.max_per_turn:
                    refusal = tool.failure(request, "max_uses_exceeded", (
                        f"Fetch failed: not fetched: one turn may fetch at most {self.max_per_turn} pages "
                        "(WEB_FETCH_MAX_PER_TURN). Fetch the most useful pages first, fewer at a time."))
                elif self.pages_read >= self.max_per_request:
                    refusal = tool.failure(request, "max_uses_exceeded", (
                        f"Fetch failed: not fetched: this request already fetched {self.max_per_request} pages, the "
                        "most one request may (WEB_FETCH_MAX_PER_REQUEST). Answer from what you have read."))
                else:
                    this_turn += 1
                    self.pages_read += 1
            out.append(refusal)
        return out

    def _provenance(self, requests: list[Request], refusals: list[Outcome | None]) -> list[Outcome | None]:
        """The refusals with each page read of a URL the conversation did not give (or a link past the chain
        limits) refused too, before its tool runs and so before any name is looked up: a URL the model built is a
        message to the server or name server it names (issue 33). After the caps, so a capped call spends no link
        budget."""
        out = list(refusals)
        for i, request in enumerate(requests):
            tool = TOOLS[request.tool]
            url = tool.reads(request)
            if out[i] is not None or request.early is not None or url is None:
                continue
            refusal = self.ledger.admit(url)
            if refusal is not None:
                out[i] = tool.failure(request, "url_not_allowed", f"Fetch failed: {refusal.message}")
                if self._on_refused:
                    self._on_refused(refusal.reason)
        return out

    def _learn(self, requests: list[Request], outcomes: list[Outcome]) -> None:
        """What the round gave later calls to read: its search results, and the links of the pages it read, as the
        model read them (each tool's sources: the hits it listed, the page text it showed)."""
        for request, outcome in zip(requests, outcomes, strict=True):
            for cited in sources(outcome):
                if cited.page:
                    self.ledger.learn_page(TOOLS[request.tool].reads(request) or cited.url, cited.url, cited.text)
                else:  # a result whose URL echoes the query is the model's words, not the search's (issue 39)
                    self.ledger.allow([cited.url], "search", query=getattr(request, "query", None))

    def run(self, requests: list[Request], limit: int | None = None, language: str | None = None,
            at_most: int = 8) -> list[Outcome]:
        """Run one round: each request by the tool that owns it, `at_most` at a time; outcomes in the requests'
        order. Never raises: every failure is an outcome the model reads."""
        self.rounds += 1
        refusals = self._provenance(requests, self._capped(requests))

        def one(i: int) -> Outcome:
            request, tool = requests[i], TOOLS[requests[i].tool]
            refusal = refusals[i]
            if refusal is not None:
                return refusal
            # On the client's watch: its leaving ends the fetch or search at once.
            with watched(self._watch() if self._watch is not None else None) as cancel:
                ctx = RunContext(self.backends, cancel, limit, language, self._memory, self._lock)
                try:
                    return tool.run(request, ctx)
                except Exception:
                    # A bug or a library's surprise must not end the client's turn with a 500: the model reads
                    # a failure, the log keeps the traceback.
                    log.exception("a %s call failed unexpectedly", tool.name)
                    return tool.failure(request, "unavailable", tool.broken)

        # No requests: a round of calls all refused before running still counts as a round.
        outcomes = run_together(one, list(range(len(requests))), at_most=at_most)
        self._learn(requests, outcomes)
        self._count(outcomes)
        return outcomes

    def _count(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            kind = TOOLS[o.tool].kind
            if kind == PAGE:
                self.fetches += 1
            elif o.repeated:
                self.repeated += 1
            elif kind == SEARCH:
                self.searches += 1
                self.empty += o.status == "empty"
                self.failed += o.status == "failed"

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
