"""Codex's standalone web search, `POST /v1/alpha/search`: a provider with
`supports_standalone_web_search = true` (and the `standalone_web_search` feature) gives its model a
`web.run` tool and sends each call here as `{id, model, input, commands, settings, max_output_tokens}`;
the answer is `{"output": <text the model reads>, "encrypted_output": null}`.

Served by `AlphaSearch.handle` on the route proxy/app.py adds. `search_query` runs on the
search core (proxy/search.py), `open` and `find` on the fetch core (proxy/fetch.py); the handler is
thin over the pure functions below. Wire format: tests/data/codex-alpha-search.md.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from flask import Response

from . import codec, metrics
from .cancel import Watch, watched
from .errors import error_response
from .exchange import ClientWatch
from .fetch_wire import FetchError, Page
from .runtime import run_together
from .search import SearchOutcome, clean_query, filter_domains
from .services import Services

log = logging.getLogger("proxy.alpha_search")

PATH = "/v1/alpha/search"
CHARS_PER_TOKEN = 4            # the fetch core's estimate too
DEFAULT_OUTPUT_TOKENS = 2500   # what Codex 0.171.0 sends as max_output_tokens
MAX_OUTPUT_TOKENS = 20000      # a client can't ask for more text than this in one answer
MAX_QUERIES = 8                # Codex's tool text asks for at most 4; a confused model may send more
MAX_FINDS = 20                 # matches listed per find
# Results per query, as the hosted tool's search_context_size and the web.run response_length mean them.
RESULTS = {"low": 3, "short": 3, "medium": 5, "high": 10, "long": 10}
SUPPORTED = ("search_query", "open", "find", "response_length")
# What web.run offers that this server has no source for; the model is told so and may adapt.
UNSUPPORTED = ("image_query", "click", "screenshot", "finance", "weather", "sports", "time")
# Failures of a server behind the proxy (502/504 when nothing else succeeded), as opposed to a
# refusal or a bad reference, which the model should read in the output.
UPSTREAM_CODES = frozenset({"unavailable", "too_many_requests", "url_not_accessible"})
# Both cores say a timeout in these words (search.py: "did not answer within N s", fetch.py the
# same); tests/test_alpha_search.py pins them, since 504 vs 502 hangs on it.
TIMEOUT_WORDS = "did not answer within"


def time_range(recency_days: int | None) -> str | None:
    """web.run's recency (days) -> the narrowest SearXNG time_range that covers it. Pure."""
    if not recency_days:
        return None
    for days, name in ((1, "day"), (7, "week"), (31, "month"), (366, "year")):
        if recency_days <= days:
            return name
    return None


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class Query:
    q: str
    domains: tuple[str, ...] = ()
    recency: int | None = None


@dataclass(frozen=True)
class Parsed:
    session: str
    queries: tuple[Query, ...]
    opens: tuple[tuple[str, int], ...]          # (ref_id, lineno)
    finds: tuple[tuple[str, str], ...]          # (ref_id, pattern)
    unsupported: tuple[str, ...]
    results: int | None                         # per query; None: SEARXNG_RESULTS
    output_tokens: int
    allowed: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()


@dataclass
class Failure:
    code: str
    message: str

    @property
    def upstream(self) -> bool:
        return self.code in UPSTREAM_CODES

    @property
    def timeout(self) -> bool:
        return TIMEOUT_WORDS in self.message


# ---- reading the request (pure) ----------------------------------------------------------

def _strings(value, param: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"`{param}` must be a list of strings.", param)
    return tuple(v for v in value if v.strip())


def _items(commands: dict, name: str) -> list[dict]:
    value = commands.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise BadRequest(f"`commands.{name}` must be a list of objects.", f"commands.{name}")
    return value


def _text(item: dict, key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"`{param}.{key}` must be a string.", f"{param}.{key}")
    return value


def _whole(value, param: str, default=None):
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"`{param}` must be a non-negative whole number.", param)
    return value


def parse_request(body) -> Parsed:
    """The request Codex sends (tests/data/codex-alpha-search.md) -> Parsed, or BadRequest. Pure."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    commands = body.get("commands")
    if not isinstance(commands, dict):
        raise BadRequest("`commands` must be an object such as {\"search_query\": [{\"q\": \"...\"}]}.", "commands")
    queries = []
    for i, item in enumerate(_items(commands, "search_query")):
        param = f"commands.search_query[{i}]"
        queries.append(Query(_text(item, "q", param), _strings(item.get("domains"), f"{param}.domains"),
                             _whole(item.get("recency"), f"{param}.recency")))
    opens = []
    for i, item in enumerate(_items(commands, "open")):
        param = f"commands.open[{i}]"
        opens.append((_text(item, "ref_id", param), _whole(item.get("lineno"), f"{param}.lineno", 0)))
    finds = [(_text(item, "ref_id", f"commands.find[{i}]"), _text(item, "pattern", f"commands.find[{i}]"))
             for i, item in enumerate(_items(commands, "find"))]
    unknown = sorted(k for k in set(commands) - set(SUPPORTED) - set(UNSUPPORTED) if commands[k])
    # Named in the output, so the model learns they did nothing rather than seeing silence.
    unsupported = tuple(name for name in UNSUPPORTED if commands.get(name)) + tuple(unknown)
    if not (queries or opens or finds or unsupported):
        raise BadRequest("`commands` holds no command; send search_query, open or find.", "commands")
    if len(queries) > MAX_QUERIES:
        raise BadRequest(f"At most {MAX_QUERIES} search queries per request.", "commands.search_query")
    length = commands.get("response_length")
    if length is not None and length not in ("short", "medium", "long"):
        raise BadRequest("`commands.response_length` must be short, medium or long.", "commands.response_length")
    settings = {} if body.get("settings") is None else body["settings"]
    if not isinstance(settings, dict):
        raise BadRequest("`settings` must be an object.", "settings")
    filters = {} if settings.get("filters") is None else settings["filters"]
    if not isinstance(filters, dict):
        raise BadRequest("`settings.filters` must be an object.", "settings.filters")
    size = settings.get("search_context_size")
    tokens = _whole(body.get("max_output_tokens"), "max_output_tokens", DEFAULT_OUTPUT_TOKENS)
    session = body.get("id")
    return Parsed(session=session if isinstance(session, str) else "", queries=tuple(queries), opens=tuple(opens),
                  finds=tuple(finds), unsupported=unsupported,
                  results=RESULTS.get(str(length)) or RESULTS.get(str(size)),
                  output_tokens=max(1, min(tokens or DEFAULT_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS)),
                  allowed=_strings(filters.get("allowed_domains"), "settings.filters.allowed_domains"),
                  blocked=_strings(filters.get("blocked_domains"), "settings.filters.blocked_domains"))


# ---- reference ids: turn{n}search{i} and turn{n}view{i}, remembered per Codex thread ------

@dataclass
class Session:
    turn: int = 0
    refs: dict = field(default_factory=dict)   # ref_id -> URL


class RefStore:
    """The ids a thread's earlier answers handed out, so the model can `open` "turn0search1".

    In memory, per gunicorn worker, bounded (least recently used threads go first): a ref the
    store forgot is answered with a note asking for the URL, which every listing shows.
    """

    def __init__(self, max_sessions: int = 512, max_refs: int = 500):
        self.max_sessions, self.max_refs = max_sessions, max_refs
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def begin(self, session_id: str) -> tuple[int, dict]:
        """This call's turn number and a copy of the refs known so far; a request without a
        thread id remembers nothing (unrelated clients must not share one store)."""
        if not session_id:
            return 0, {}
        with self._lock:
            s = self._sessions.pop(session_id, None) or Session()
            self._sessions[session_id] = s
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            turn, s.turn = s.turn, s.turn + 1
            return turn, dict(s.refs)

    def add(self, session_id: str, refs: dict):
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return
            s.refs.update(refs)
            for key in list(s.refs)[:max(0, len(s.refs) - self.max_refs)]:
                del s.refs[key]


def resolve(ref_id: str, refs: dict) -> str | None:
    """A ref id (or a URL given in its place, as web.run allows) -> URL; None when unknown. Pure."""
    ref = ref_id.strip()
    if ref in refs:
        return refs[ref]
    if "://" in ref:
        return ref
    return None


# ---- writing the output (pure) -----------------------------------------------------------

def format_search(outcome: SearchOutcome, turn: int, first: int) -> tuple[str, dict]:
    """One query's results as text, and the ref ids it handed out (numbered from `first`)."""
    if outcome.status != "ok":
        return f'## search_query "{outcome.query}"\n{outcome.message}', {}
    lines, refs = [f'## search_query "{outcome.query}"{outcome.cached_note}'], {}
    for a in outcome.answers:
        lines.append(f"Answer: {a}")
    for box in outcome.infoboxes:
        lines.append(f"Infobox: {box}")
    for i, hit in enumerate(outcome.hits, first):
        ref = f"turn{turn}search{i}"
        refs[ref] = hit.url
        lines.append(f"[{ref}] {hit.title}")
        lines.append(f"URL: {hit.url}")
        if hit.date:
            lines.append(f"Date: {hit.date}")
        if hit.snippet:
            lines.append(hit.snippet)
    return "\n".join(lines), refs


def page_lines(text: str) -> list[str]:
    return text.splitlines() or [""]


def format_open(ref: str, page: Page, lineno: int, budget_chars: int) -> str:
    """A page as numbered lines from `lineno` on, cut to the budget; says how to read on."""
    lines = page_lines(page.text)
    start = min(lineno, len(lines) - 1)
    head = (f"## open [{ref}] {page.title or page.url}\nURL: {page.url}\n"
            f"Retrieved: {page.retrieved_at}; {page.content_type}; {len(lines)} lines")
    out: list[str] = []
    used, end = len(head), start
    for n in range(start, len(lines)):
        line = f"L{n}: {lines[n]}"
        if out and used + len(line) + 1 > budget_chars:
            break
        out.append(line)
        used += len(line) + 1
        end = n + 1
    tail = []
    if end < len(lines):
        tail.append(f"(lines {start}-{end - 1} of {len(lines)}; open with \"lineno\": {end} to read on)")
    elif page.truncated:
        tail.append("(the page was cut to the fetch limit here)")
    return "\n".join([head, *out, *tail])


def format_find(ref: str, page: Page, pattern: str, budget_chars: int) -> str:
    """The lines of a page holding `pattern` (case-insensitive), with their line numbers."""
    needle = pattern.casefold()
    lines = page_lines(page.text)
    hits = [n for n, line in enumerate(lines) if needle and needle in line.casefold()]
    head = f'## find "{pattern}" in [{ref}] {page.url}: {len(hits)} match{"" if len(hits) == 1 else "es"}'
    out, used = [head], len(head)
    for n in hits[:MAX_FINDS]:
        line = f"L{n}: {lines[n].strip()[:400]}"
        if used + len(line) + 1 > budget_chars:
            break
        out.append(line)
        used += len(line) + 1
    if len(out) - 1 < len(hits):
        out.append(f"({len(hits) - (len(out) - 1)} more; open the page with a lineno to read around them)")
    return "\n".join(out)


def format_failure(kind: str, target: str, failure: Failure) -> str:
    return f"## {kind} {target}\nFailed ({failure.code}): {failure.message}"


def unsupported_note(names) -> str:
    return (f"## not available: {', '.join(names)}\nThis search server (a self-hosted SearXNG) only "
            "answers search_query, open and find.")


def within_cap(p: Parsed, cap: int) -> tuple[Parsed, list[str]]:
    """The request with at most `cap` open and find commands (opens first, as they run), and the
    ones left out, as the output names them. Pure. Each is a page fetch from a third-party host,
    chosen by a model that page text can steer: one request must not become a crawl."""
    cap = max(0, cap)
    opens, finds = p.opens[:cap], p.finds[:max(0, cap - len(p.opens))]
    left = [f"open {ref}" for ref, _ in p.opens[len(opens):]] + \
           [f'find "{pattern}" in {ref}' for ref, pattern in p.finds[len(finds):]]
    return replace(p, opens=opens, finds=finds), left


def over_cap_note(left: list[str], cap: int, named: int = 10) -> str:
    """What the model reads about the commands within_cap left out (the first `named` of them by name)."""
    more = f"; and {len(left) - named} more" if len(left) > named else ""
    return (f"## not run: {len(left)} page command{'s' if len(left) != 1 else ''}\nThis server runs at most {cap} "
            f"open/find commands per call (ALPHA_SEARCH_MAX_PAGES); these were not run: {'; '.join(left[:named])}{more}. "
            "Send the ones you still need in another call.")


def gateway_status(failures: list[Failure]) -> int:
    """504 when every failure was a timeout, else 502. Pure."""
    return 504 if failures and all(f.timeout for f in failures) else 502


# ---- running it ----------------------------------------------------------------------------

class AlphaSearch:
    def __init__(self, services: Services):
        self.cfg, self.searxng, self.fetcher = services.cfg, services.searxng, services.fetcher
        self.refs = RefStore()

    def _search(self, query: Query, limit: int, allowed, watch: Watch | None) -> SearchOutcome:
        q, early = clean_query(query.q)
        if q is None:  # clean_query gives exactly one of the two
            return early or SearchOutcome(str(query.q), "failed", error_code="invalid_tool_input")
        with watched(watch) as cancel:
            outcome = self.searxng.search(q, limit=limit, time_range=time_range(query.recency), cancel=cancel)
        # Domains are enforced on the results, as on /v1/responses; the query is sent unchanged.
        domains = tuple(query.domains) + tuple(allowed)
        return filter_domains(outcome, allowed=domains or None)

    def _fetch(self, url: str, p: Parsed, watch: Watch | None) -> Page:
        with watched(watch) as cancel:
            return self.fetcher.fetch(url, allowed_domains=list(p.allowed) or None,
                                      blocked_domains=list(p.blocked) or None, cancel=cancel)

    def run(self, p: Parsed, environ: dict, watch: Watch | None = None) -> tuple[list[str], list[Failure], int, int]:
        """-> (output sections, failures, commands that succeeded, searches run). Each search and page read
        is on the client's `watch`: a client that leaves stops what is under way and what was still to run."""
        p, left = within_cap(p, self.cfg.alpha_search_max_pages)
        turn, refs = self.refs.begin(p.session)
        budget = p.output_tokens * CHARS_PER_TOKEN
        sections: list[str] = []
        failures: list[Failure] = []
        new_refs: dict[str, str] = {}
        ok = 0
        limit = p.results or self.searxng.results
        if p.queries:
            outcomes = run_together(lambda q: self._search(q, limit, p.allowed, watch), list(p.queries), at_most=4)
            for outcome in outcomes:
                metrics.tool_call(environ, "web_search", metrics.outcome_of(outcome))
                if outcome.status == "failed":
                    failures.append(Failure(outcome.error_code or "unavailable", outcome.message))
                else:
                    ok += 1
                text, got = format_search(outcome, turn, len(new_refs))
                sections.append(text)
                new_refs.update(got)
        pages = len(p.opens) + len(p.finds)
        share = max(1000, budget // max(1, pages + bool(p.queries)))
        def page_for(command: str, ref_id: str):
            """The page a ref id (or URL) names, or None once the failure is recorded."""
            url = resolve(ref_id, {**refs, **new_refs})
            if url is None:
                where = "in a URL" if command == "find" else "a URL"
                failure = Failure("invalid_tool_input",
                                  f"Unknown ref_id {ref_id!r}: {command} {where} or a ref id from an earlier result.")
            else:
                try:
                    page = self._fetch(url, p, watch)
                    metrics.tool_call(environ, command, "ok")
                    return page
                except FetchError as e:
                    failure = Failure(e.code, e.message)
            metrics.tool_call(environ, command, metrics.failure_outcome(failure.code, failure.message))
            failures.append(failure)
            sections.append(format_failure(command, ref_id, failure))
            return None

        for i, (ref_id, lineno) in enumerate(p.opens):
            page = page_for("open", ref_id)
            if page is not None:
                ok += 1
                view = f"turn{turn}view{i}"
                new_refs[view] = page.url
                sections.append(format_open(view, page, lineno, share))
        for ref_id, pattern in p.finds:
            page = page_for("find", ref_id)
            if page is not None:
                ok += 1
                sections.append(format_find(ref_id, page, pattern, share))
        if left:  # first, so the cut to max_output_tokens never hides it
            sections.insert(0, over_cap_note(left, self.cfg.alpha_search_max_pages))
        if p.unsupported:
            sections.append(unsupported_note(p.unsupported))
        self.refs.add(p.session, new_refs)
        return sections, failures, ok, len(p.queries)

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
        watch = ClientWatch(environ)
        try:
            sections, failures, ok, searches = self.run(parsed, environ, watch)
        finally:
            watch.stop()
        environ["proxy.searches"] = searches
        if watch.gone:
            # Nobody reads the answer; 499 (nginx's "client closed request") is what the access log shows.
            return error_response(499, "The client closed the connection before the search finished.")
        status, payload = answer(sections, failures, ok, parsed.output_tokens * CHARS_PER_TOKEN)
        if status != 200:
            log.warning("POST %s: %d (%d commands failed)", PATH, status, len(failures))
        return Response(codec.dumps(payload), status=status, mimetype="application/json")


def answer(sections: list[str], failures: list[Failure], ok: int, budget_chars: int) -> tuple[int, dict]:
    """The HTTP answer for a run. Pure. Nothing succeeded and every failure was a server's behind
    the proxy: a gateway error whose message (Codex hands it to the model) says what failed.
    Otherwise 200 with the text, failures included, so the model can adapt."""
    if failures and ok == 0 and all(f.upstream for f in failures):
        status = gateway_status(failures)
        message = "Search failed: " + " ".join(f.message for f in failures)
        return status, {"error": {"message": message, "type": "gateway_timeout" if status == 504 else "bad_gateway",
                                  "param": None, "code": status}}
    text = "\n\n".join(sections)
    if len(text) > budget_chars:
        text = text[:budget_chars].rstrip() + "\n(cut to max_output_tokens)"
    return 200, {"output": text, "encrypted_output": None}


