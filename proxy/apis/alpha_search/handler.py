"""Codex's standalone web search, `POST /v1/alpha/search`, run: AlphaSearch.handle on the route
proxy/http/app.py adds. Each `search_query` is a web_search call, each `open` a web_fetch call and each `find` a
find_in_page call, all run by the request's ToolSession (proxy/tools/session.py), as every API's calls are: the
same caps, URL provenance, repeated-query memory and events. What is Codex's own stays here as a thin layer on
top: ref ids and the thread's memory of them, web.run's recency as the search's time_range, each call's ledger made
from that memory, and the text the model reads. Tested end to end under gunicorn by tests/test_alpha_search.py
(`tests/run.sh tests/test_alpha_search.py -q`).

A provider with `supports_standalone_web_search = true` (and the `standalone_web_search` feature)
gives its model a `web.run` tool and sends each call here as `{id, model, input, commands, settings,
max_output_tokens}`; the answer is `{"output": <text the model reads>, "encrypted_output": null}`.
The rules (parsing, ref ids, the text) are pure, in proxy/apis/alpha_search/rules.py; the wire format is in
tests/data/codex-alpha-search.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field

from flask import Response

from proxy.apis.alpha_search.rules import (
    BadRequest,
    Failure,
    Parsed,
    Query,
    RefStore,
    Thread,
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
from proxy.core import codec, routes
from proxy.core.errors import error_response
from proxy.engine.events import RoundDone
from proxy.engine.exchange import Exchange
from proxy.engine.services import Services, StateDown
from proxy.tools import registry
from proxy.tools.base import Limits, Outcome, Request
from proxy.tools.provenance import Ledger, echoes_query, key
from proxy.tools.session import ToolSession

log = logging.getLogger("proxy.alpha_search")

PATH = routes.ALPHA_SEARCH


@dataclass
class SearchCall:
    """One web.run call on its way: what it asked, the session its commands run on, and what they have produced
    so far, sections in the order the model reads them."""
    parsed: Parsed
    ex: Exchange
    session: ToolSession            # every command's call runs here; its ledger is the thread's
    turn: int
    known_refs: dict[str, str]      # from the thread's earlier answers
    sections: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    succeeded: int = 0              # commands that worked; none, with upstream failures only, is a 502/504
    new_refs: dict[str, str] = field(default_factory=dict)
    echoes: set[str] = field(default_factory=set)  # this call's search refs whose URL echoed the query
    read: set[str] = field(default_factory=set)    # URLs of the pages this call's finds read
    refs_down: bool = False         # the state store that keeps ref ids did not answer: a ref is unavailable

    searched: int = 0               # the session's searches already told

    def counted(self, outcomes: list[Outcome]) -> None:
        """The outcomes as the client gets them, for the metrics and the access log (RoundDone, as on every API)."""
        searched, self.searched = self.searched, self.session.searches
        self.ex.emit(RoundDone(tuple(outcomes), self.session.searches - searched))


# web.run's page commands as the proxy's tools: open reads a page, find looks for a pattern in one.
PAGE_TOOLS = {"open": registry.WEB_FETCH, "find": registry.FIND_IN_PAGE}
METRIC_LABELS = {tool: command for command, tool in PAGE_TOOLS.items()}  # the metrics call them as web.run does


def failure_of(outcome: Outcome) -> Failure:
    """A failed call as web.run's output writes it: the sentence without the tools' "Fetch failed: " lead, since the
    section's head already says it failed."""
    message = outcome.message.removeprefix("Fetch failed: ")
    if message.startswith("not fetched:"):  # URL provenance's sentence, written to follow that lead
        message = "N" + message[1:]
    return Failure(outcome.error_code or "unavailable", message, outcome.timed_out)


class AlphaSearch:
    def __init__(self, services: Services):
        self.services, self.cfg = services, services.cfg
        self.refs = RefStore(services.state)  # with STATE_URL, shared by every worker and replica

    @staticmethod
    def ledger(input_, thread: Thread, ex: Exchange) -> Ledger:
        """This call's ledger, made from what the thread's memory holds and nothing of this process's own, so any
        worker or replica answers a thread's next call alike: the conversation's URLs; every URL the thread's
        earlier answers listed, but for results that echoed their query (the model's words, as on every API); and
        the pages earlier calls opened or searched in (views, READ_MARK), with the links each showed, from the
        client's memory (proxy/tools/client_reads.py, in the store with STATE_URL)."""
        ledger = ex.new_ledger(input_given(input_))  # on the client's link depths, charges and pages' links
        given = {ref: url for ref, url in thread.refs.items() if ref not in thread.echoes}
        ledger.allow(given.values(), "search")  # earlier turns' results and pages, given as Anthropic's are
        ledger.read_before([*(url for ref, url in given.items() if "view" in ref), *thread.read])
        return ledger

    def _search_request(self, query: Query, allowed: tuple[str, ...]) -> Request:
        # Domains are enforced on the results, as on /v1/responses; the query is sent unchanged.
        limits = Limits(allowed_domains=tuple(query.domains) + tuple(allowed), time_range=time_range(query.recency))
        return registry.parse(registry.WEB_SEARCH, {"query": query.q}, limits)

    def _run_searches(self, call: SearchCall):
        """All queries at once (a few at a time); their sections in the order they were asked."""
        parsed = call.parsed
        requests = [self._search_request(q, parsed.allowed) for q in parsed.queries]
        outcomes = call.session.run(requests, limit=parsed.results or self.services.search.results, at_most=4)
        call.counted(outcomes)
        for query, outcome in zip(parsed.queries, outcomes, strict=True):
            if outcome.status == "failed":
                call.failures.append(failure_of(outcome))
            else:
                call.succeeded += 1
            text, got = format_search(outcome, call.turn, len(call.new_refs))  # type: ignore[arg-type]
            call.sections.append(text)
            call.new_refs.update(got)
            # The session did not take these as given (issue 39); the mark keeps later calls from doing so by ref id.
            call.echoes.update(ref for ref, url in got.items() if echoes_query(key(url) or url, query.q))

    def _page_for(self, call: SearchCall, command: str, ref_id: str, pattern: str = ""):
        """The page a ref id (or URL) names, read by the command's tool on the session, or None once the failure
        is counted and written."""
        # This call's search results count too: a model may open what the same call found.
        url = resolve(ref_id, {**call.known_refs, **call.new_refs})
        parsed = call.parsed
        tool = PAGE_TOOLS[command]
        request = registry.parse(tool, {"url": url or ref_id, "pattern": pattern},
                                 Limits(allowed_domains=parsed.allowed, blocked_domains=parsed.blocked))
        if url is None:
            failure = unavailable_ref(command, ref_id) if call.refs_down else unknown_ref(command, ref_id)
            outcome = registry.tool(tool).failure(request, failure.code, failure.message)
        else:
            # One page at a time, each its own round: what one page read teaches the ledger, the next may use.
            [outcome] = call.session.run([request])
        call.counted([outcome])
        page = outcome.page if outcome.status == "ok" else None  # type: ignore[attr-defined]
        if page is not None:
            return page
        failure = failure if url is None else failure_of(outcome)
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
            page = self._page_for(call, "find", ref_id, pattern)
            if page is not None:
                call.succeeded += 1
                # find_in_page cites nothing, so the session learns no links from it; web.run's find reads the page
                # the model can open next, so its links count as a page read's.
                call.session.ledger.learn_page(resolve(ref_id, {**call.known_refs, **call.new_refs}) or page.url,
                                               page.url, page.text)
                call.read.add(page.url)
                call.sections.append(format_find(ref_id, page, pattern, share))

    def _add_notes(self, call: SearchCall, left: list[str]):
        """What did not run: the commands over the cap, and the web.run commands there is no source for."""
        if left:  # first, so the cut to max_output_tokens never hides it
            call.sections.insert(0, over_cap_note(left, self.cfg.alpha_search_max_pages))
        if call.parsed.unsupported:
            call.sections.append(unsupported_note(call.parsed.unsupported))

    def run(self, parsed: Parsed, ex: Exchange, input_=None) -> tuple[list[str], list[Failure], int, int]:
        """-> (output sections, failures, commands that succeeded, searches run). Each search and page read
        is on the client's watch (ex.watch): a client that leaves stops what is under way and what was still to
        run. `input_` is the request's `input`, the conversation whose URLs open and find may read."""
        parsed, left = within_cap(parsed, self.cfg.alpha_search_max_pages)
        # The thread's refs and ledger are its key's: another member's thread id opens none of them.
        parsed = dataclasses.replace(parsed, session=ex.flow.owned(parsed.session))
        try:
            thread, refs_down = self.refs.thread(parsed.session), False
        except StateDown:  # counted by the store; this call's own refs still work, earlier ones are unavailable
            thread, refs_down = Thread(0, {}, set(), set()), True
        ex.ledger = self.ledger(input_, thread, ex)
        call = SearchCall(parsed, ex, ex.session(max_pages=self.cfg.alpha_search_max_pages), thread.turn, thread.refs,
                          refs_down=refs_down)
        if parsed.queries:
            self._run_searches(call)
        self._run_page_commands(call)
        self._add_notes(call, left)
        # A store that is down loses this call's ref ids (counted, and logged once, by the store); its answer stands.
        with contextlib.suppress(StateDown):
            self.refs.add(parsed.session, call.new_refs, call.echoes, call.read)
        return call.sections, call.failures, call.succeeded, len(parsed.queries)

    def handle(self, raw: bytes, environ: dict) -> Response:
        """One request's body -> the answer."""
        try:
            body = codec.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError):
            return error_response(400, "Request body is not valid JSON.")
        try:
            parsed = parse_request(body)
        except BadRequest as e:
            return error_response(400, e.message, param=e.param)
        ex = Exchange(self.services, raw, [], PATH, environ)
        watch = ex.watch_client()
        try:
            sections, failures, succeeded, searches = self.run(parsed, ex, body.get("input"))
        finally:
            watch.stop()
        if watch.gone:
            # Nobody reads the answer; 499 (nginx's "client closed request") is what the access log shows.
            return error_response(499, "The client closed the connection before the search finished.")
        status, payload = answer(sections, failures, succeeded, parsed.budget_chars)
        if status != 200:
            log.warning("POST %s: %d (%d commands failed)", PATH, status, len(failures))
        return Response(codec.dumps(payload), status=status, mimetype="application/json")
