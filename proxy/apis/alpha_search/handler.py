"""Codex's standalone web search, `POST /v1/alpha/search`, run: AlphaSearch.handle on the route
proxy/http/app.py adds, running `search_query` on the search core (proxy/backends/searxng.py) and `open`/`find` on
the fetch core (proxy/backends/fetcher.py) on the client's watch; tested end to end under gunicorn by
tests/test_alpha_search.py (`tests/run.sh tests/test_alpha_search.py -q`).

A provider with `supports_standalone_web_search = true` (and the `standalone_web_search` feature)
gives its model a `web.run` tool and sends each call here as `{id, model, input, commands, settings,
max_output_tokens}`; the answer is `{"output": <text the model reads>, "encrypted_output": null}`.
The rules (parsing, ref ids, the text) are pure, in proxy/apis/alpha_search/rules.py; the wire format is in
tests/data/codex-alpha-search.md.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from flask import Response

from proxy.apis.alpha_search.rules import (
    BadRequest,
    Failure,
    Parsed,
    Query,
    RefStore,
    answer,
    format_failure,
    format_find,
    format_open,
    format_search,
    over_cap_note,
    page_share,
    parse_request,
    resolve,
    time_range,
    unavailable_ref,
    unknown_ref,
    unsupported_note,
    view_ref,
    within_cap,
)
from proxy.apis.given import input_given
from proxy.backends.fetcher import FetchError, Page
from proxy.backends.search import SearchOutcome, filter_domains
from proxy.backends.state import StateDown
from proxy.core import codec, routes
from proxy.core.errors import error_response
from proxy.engine.events import TOOL_CALL, TOOLS_RAN, URL_REFUSED
from proxy.engine.exchange import ClientWatch
from proxy.engine.services import Services
from proxy.runtime.cancel import Watch, watched
from proxy.runtime.concurrency import run_together
from proxy.tools.client_reads import client_of
from proxy.tools.provenance import Ledger, Rules
from proxy.tools.web_fetch import FetchOutcome
from proxy.tools.web_search import clean_query

log = logging.getLogger("proxy.alpha_search")

PATH = routes.ALPHA_SEARCH


@dataclass
class SearchCall:
    """One web.run call on its way: what it asked, whose watch it runs on, and what its commands have
    produced so far, sections in the order the model reads them."""
    parsed: Parsed
    environ: dict
    watch: Watch | None
    turn: int
    known_refs: dict[str, str]      # from the thread's earlier answers
    ledger: Ledger                  # the URLs open and find may read (proxy/tools/provenance.py)
    sections: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    succeeded: int = 0              # commands that worked; none, with upstream failures only, is a 502/504
    new_refs: dict[str, str] = field(default_factory=dict)
    refs_down: bool = False         # the state store that keeps ref ids did not answer: a ref is unavailable


class AlphaSearch:
    def __init__(self, services: Services):
        self.cfg, self.search, self.fetcher, self.events = services.cfg, services.search, services.fetcher, services.events
        self.reads = services.reads  # the client's link depths and charges across calls (proxy/tools/client_reads.py)
        self.refs = RefStore(services.state)  # with STATE_URL, shared by every worker and replica
        # One ledger per thread and user turn: Codex sends each web.run call alone, so the links a page showed in
        # one call are followed in the next, and the link budget is per turn of the user, as it is per request
        # elsewhere. Bounded like the ref store, least recently used first out.
        self.ledgers: OrderedDict[tuple[str, str], Ledger] = OrderedDict()
        self._lock = threading.Lock()

    def ledger(self, parsed: Parsed, input_, known_refs: dict[str, str], environ: dict) -> Ledger:
        """The thread's ledger for this user turn (a new one when `input` changed): the conversation's URLs and every
        URL the thread's earlier answers listed; search results of this turn's calls are added as they come."""
        parts = input_given(input_)
        turn_key = hashlib.sha256(codec.dumps(input_)).hexdigest() if parts else ""
        with self._lock:
            found = self.ledgers.get((parsed.session, turn_key)) if parsed.session else None
            if found is None:
                found = Ledger(Rules.of(self.cfg), parts, self.reads, client_of(environ))
                found.allow(known_refs.values(), "search")  # earlier turns' results and pages, given as Anthropic's are
                if parsed.session:
                    self.ledgers[(parsed.session, turn_key)] = found
                    while len(self.ledgers) > self.refs.max_sessions:
                        self.ledgers.popitem(last=False)
            else:
                self.ledgers.move_to_end((parsed.session, turn_key))
        found.allow((url for ref, url in known_refs.items() if "search" in ref), "search")
        return found

    def _search(self, query: Query, limit: int, allowed, watch: Watch | None) -> SearchOutcome:
        cleaned, early = clean_query(query.q)
        if cleaned is None:  # clean_query gives exactly one of the two
            return early or SearchOutcome(str(query.q), "failed", error_code="invalid_tool_input")
        with watched(watch) as cancel:
            outcome = self.search.search(cleaned, limit=limit, time_range=time_range(query.recency), cancel=cancel)
        # Domains are enforced on the results, as on /v1/responses; the query is sent unchanged.
        domains = tuple(query.domains) + tuple(allowed)
        return filter_domains(outcome, allowed=domains or None)

    def _fetch(self, url: str, parsed: Parsed, watch: Watch | None) -> Page:
        with watched(watch) as cancel:
            return self.fetcher.fetch(url, allowed_domains=list(parsed.allowed) or None,
                                      blocked_domains=list(parsed.blocked) or None, cancel=cancel)

    def _run_searches(self, call: SearchCall):
        """All queries at once (a few at a time); their sections in the order they were asked."""
        parsed, limit = call.parsed, call.parsed.results or self.search.results
        outcomes = run_together(lambda query: self._search(query, limit, parsed.allowed, call.watch),
                                list(parsed.queries), at_most=4)
        self.events.emit(TOOLS_RAN, call.environ, outcomes)
        for query, outcome in zip(parsed.queries, outcomes, strict=True):
            self.events.emit(TOOL_CALL, call.environ, ("web_search", outcome))
            if outcome.status == "failed":
                call.failures.append(Failure(outcome.error_code or "unavailable", outcome.message, outcome.timed_out))
            else:
                call.succeeded += 1
            text, got = format_search(outcome, call.turn, len(call.new_refs))
            call.sections.append(text)
            call.new_refs.update(got)
            call.ledger.allow(got.values(), "search", query=str(query.q))

    def _page_for(self, call: SearchCall, command: str, ref_id: str) -> Page | None:
        """The page a ref id (or URL) names, or None once the failure is counted and written."""
        # This call's search results count too: a model may open what the same call found.
        url = resolve(ref_id, {**call.known_refs, **call.new_refs})
        refusal = call.ledger.admit(url) if url is not None else None
        if url is None:
            failure = unavailable_ref(command, ref_id) if call.refs_down else unknown_ref(command, ref_id)
        elif refusal is not None:  # before any lookup: a URL the model built never reaches a server or the DNS
            self.events.emit(URL_REFUSED, call.environ, refusal.reason)
            failure = Failure("url_not_allowed", refusal.message[0].upper() + refusal.message[1:])
        else:
            try:
                page = self._fetch(url, call.parsed, call.watch)
                self.events.emit(TOOL_CALL, call.environ, (command, FetchOutcome(url, page=page)))
                call.ledger.learn_page(url, page.url, page.text)
                return page
            except FetchError as e:
                failure = Failure(e.code, e.message, e.timed_out)
        self.events.emit(TOOL_CALL, call.environ, (command, FetchOutcome(url or ref_id, error_code=failure.code,
                                                                        message=failure.message,
                                                                        timed_out=failure.timed_out)))
        call.failures.append(failure)
        call.sections.append(format_failure(command, ref_id, failure))
        return None

    def _run_page_commands(self, call: SearchCall):
        """The opens, then the finds, one page read at a time, each in its share of the budget."""
        share = page_share(call.parsed)
        for i, (ref_id, lineno) in enumerate(call.parsed.opens):
            page = self._page_for(call, "open", ref_id)
            if page is not None:
                call.succeeded += 1
                view = view_ref(call.turn, i)
                call.new_refs[view] = page.url
                call.sections.append(format_open(view, page, lineno, share))
        for ref_id, pattern in call.parsed.finds:
            page = self._page_for(call, "find", ref_id)
            if page is not None:
                call.succeeded += 1
                call.sections.append(format_find(ref_id, page, pattern, share))

    def _add_notes(self, call: SearchCall, left: list[str]):
        """What did not run: the commands over the cap, and the web.run commands there is no source for."""
        if left:  # first, so the cut to max_output_tokens never hides it
            call.sections.insert(0, over_cap_note(left, self.cfg.alpha_search_max_pages))
        if call.parsed.unsupported:
            call.sections.append(unsupported_note(call.parsed.unsupported))

    def run(self, parsed: Parsed, environ: dict, watch: Watch | None = None,
            input_=None) -> tuple[list[str], list[Failure], int, int]:
        """-> (output sections, failures, commands that succeeded, searches run). Each search and page read
        is on the client's `watch`: a client that leaves stops what is under way and what was still to run.
        `input_` is the request's `input`, the conversation whose URLs open and find may read."""
        parsed, left = within_cap(parsed, self.cfg.alpha_search_max_pages)
        try:
            (turn, known_refs), refs_down = self.refs.begin(parsed.session), False
        except StateDown:  # counted by the store; this call's own refs still work, earlier ones are unavailable
            (turn, known_refs), refs_down = (0, {}), True
        call = SearchCall(parsed, environ, watch, turn, known_refs, self.ledger(parsed, input_, known_refs, environ),
                          refs_down=refs_down)
        if parsed.queries:
            self._run_searches(call)
        self._run_page_commands(call)
        self._add_notes(call, left)
        # A store that is down loses this call's ref ids (counted, and logged once, by the store); its answer stands.
        with contextlib.suppress(StateDown):
            self.refs.add(parsed.session, call.new_refs)
        return call.sections, call.failures, call.succeeded, len(parsed.queries)

    def handle(self, raw: bytes, environ: dict) -> Response:
        """One request's body -> the answer; the access log's search count goes into environ."""
        try:
            body = codec.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError):
            return error_response(400, "Request body is not valid JSON.")
        try:
            parsed = parse_request(body)
        except BadRequest as e:
            return error_response(400, e.message, param=e.param)
        watch = ClientWatch(environ, self.events)
        try:
            sections, failures, succeeded, searches = self.run(parsed, environ, watch, body.get("input"))
        finally:
            watch.stop()
        if watch.gone:
            # Nobody reads the answer; 499 (nginx's "client closed request") is what the access log shows.
            return error_response(499, "The client closed the connection before the search finished.")
        status, payload = answer(sections, failures, succeeded, parsed.budget_chars)
        if status != 200:
            log.warning("POST %s: %d (%d commands failed)", PATH, status, len(failures))
        return Response(codec.dumps(payload), status=status, mimetype="application/json")
