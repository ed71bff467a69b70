"""The pure wire rules of Codex's standalone web search, `POST /v1/alpha/search` (wire format:
tests/data/codex-alpha-search.md): reading the request into Parsed, the cap on page commands, ref ids
and the RefStore that remembers them, and the text and HTTP answer the client gets; no network, so
tests/test_alpha_search.py tests them directly (`tests/run.sh tests/test_alpha_search.py -q`).
proxy/apis/alpha_search/handler.py runs the commands on these rules.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from proxy.core import validate as V
from proxy.engine.services import MemoryState, State
from proxy.tools.web_fetch import Page, removed_note
from proxy.tools.web_search import SearchOutcome

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

    @property
    def budget_chars(self) -> int:
        """The answer's length limit in characters: max_output_tokens at the fetch core's estimate."""
        return self.output_tokens * CHARS_PER_TOKEN


@dataclass
class Failure:
    code: str
    message: str
    timed_out: bool = False  # its server did not answer in time: a 504, not a 502, when nothing else worked

    @property
    def upstream(self) -> bool:
        return self.code in UPSTREAM_CODES

    @property
    def timeout(self) -> bool:
        return self.timed_out


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
    try:
        return V.encodable(value, f"{param}.{key}") or ""  # a query or URL that no URL could carry
    except V.Invalid as e:
        raise BadRequest(e.openai_message, e.param) from None


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
    try:
        V.input_items(body.get("input"))  # the thread's ledger reads it (apis/given.py)
    except V.Invalid as e:
        raise BadRequest(e.openai_message, e.param) from None
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

REFS_USE = "refs"              # the state store's name for them (proxy/backends/state/state.py)
# A thread's ref ids are kept a day after its last web.run call: Codex threads are resumed hours later, and a ref
# the store forgot is answered with a note asking for the URL, which every listing shows.
REFS_TTL = 24 * 3600.0
TURN = "#turn"                 # the thread's turn counter, a field beside its ref ids (which never start with #)
# A search ref whose URL echoes its query (provenance.echoes_query: the model's words, not the search's) has a mark
# beside it, "!turn0search0": it still opens by its id, but a later call's ledger does not take it as given.
ECHO = "!"
# A page a `find` read (by ref id or URL) has a mark too, "@<its URL>": a later call reads on from it as from an
# opened one (turn0view0), by the links the client's memory kept of it.
READ_MARK = "@"
MAX_REF_URL = 8192            # longer is no URL a listing showed
_REF = re.compile(r"turn(\d{1,9})(search|view)(\d{1,9})")


def ref_age(ref_id: str) -> tuple[int, int, int]:
    """Oldest first when sorted: by turn, then its searches before its views, then index; others first. Pure."""
    m = _REF.fullmatch(ref_id)
    return (int(m[1]), m[2] == "view", int(m[3])) if m else (-1, False, -1)


@dataclass(frozen=True)
class Thread:
    """What the ref store holds of a Codex thread for this call."""
    turn: int                # this call's turn number
    refs: dict[str, str]     # ref id -> URL, from earlier calls
    echoes: set[str]         # search refs whose URL echoed the query: not given
    read: set[str]           # URLs of pages a find read


class RefStore:
    """The ids a thread's earlier answers handed out, so the model can `open` "turn0search1".

    Kept in the worker's state (proxy/backends/state/state.py): in this process by default, least recently used threads
    out first past `max_sessions`, or in the shared store with STATE_URL, where every worker and replica sees them.
    Each thread keeps at most `max_refs` ids (the oldest turns' out first) for REFS_TTL after its last call. begin
    and add raise StateDown when the shared store is down (the handler tells the model so).
    """

    def __init__(self, state: State | None = None, max_sessions: int = 512, max_refs: int = 500):
        self.max_sessions, self.max_refs = max_sessions, max_refs
        self.state: State = state if state is not None else MemoryState(max_keys=max_sessions)

    def begin(self, session_id: str) -> tuple[int, dict]:
        """This call's turn number and the refs known so far; a request without a
        thread id remembers nothing (unrelated clients must not share one store)."""
        found = self.thread(session_id)
        return found.turn, found.refs

    def thread(self, session_id: str) -> Thread:
        """begin's turn and refs, and the refs marked (ECHO, READ_MARK)."""
        if not session_id:
            return Thread(0, {}, set(), set())
        turn = self.state.count(REFS_USE, session_id, TURN, REFS_TTL) - 1
        fields = self.state.fields(REFS_USE, session_id)
        # Only fields of the shape this store writes: a ref id naming an http(s) URL (a shared store is hostile too).
        refs = {k: v for k, v in fields.items() if _REF.fullmatch(k) and _is_ref_url(v)}
        read = {k[1:] for k in fields if k.startswith(READ_MARK) and _is_ref_url(k[1:])}
        return Thread(turn, refs, {k for k in refs if ECHO + k in fields}, read)

    def add(self, session_id: str, refs: dict, echoes: Iterable[str] = (), read: Iterable[str] = ()):
        """This call's refs, the echo marks of those among them, and the pages its finds read."""
        if not session_id or not (refs or read):
            return
        marks = {ECHO + ref: "1" for ref in echoes if ref in refs}
        marks.update((READ_MARK + url, "1") for url in read if _is_ref_url(url))
        held = self.state.add_fields(REFS_USE, session_id, {**refs, **marks}, REFS_TTL)
        if held - 1 > self.max_refs:  # the turn counter is one field; marks count against the bound too
            self.state.drop_fields(REFS_USE, session_id, self._over(self.state.fields(REFS_USE, session_id)))

    def _over(self, fields: dict[str, str]) -> list[str]:
        """The fields past the bound: the oldest refs and their echo marks, and the read marks past max_refs."""
        known = sorted((k for k in fields if _REF.fullmatch(k)), key=ref_age)
        gone = known[:max(0, len(known) - self.max_refs)]
        kept = set(known) - set(gone)
        stale = [k for k in fields if k.startswith(ECHO) and k[1:] not in kept]
        read = sorted(k for k in fields if k.startswith(READ_MARK))
        return gone + stale + read[:max(0, len(read) - self.max_refs)]


def _is_ref_url(value: str) -> bool:
    """An http(s) URL of a length a listing shows: what the store keeps under a ref id or a mark."""
    return value.startswith(("http://", "https://")) and len(value) <= MAX_REF_URL


def search_ref(turn: int, index: int) -> str:
    """The id of a search result, unique within the thread: turn{n}search{i}."""
    return f"turn{turn}search{index}"


def view_ref(turn: int, index: int) -> str:
    """The id of a page an `open` read: turn{n}view{i}, i counting this call's open commands."""
    return f"turn{turn}view{index}"


def resolve(ref_id: str, refs: dict) -> str | None:
    """A ref id (or a URL given in its place, as web.run allows) -> URL; None when unknown. Pure."""
    ref = ref_id.strip()
    if ref in refs:
        return refs[ref]
    if "://" in ref:
        return ref
    return None


def unknown_ref(command: str, ref_id: str) -> Failure:
    """What the model reads when `open`/`find` name a ref id neither this thread nor this call gave out."""
    where = "in a URL" if command == "find" else "a URL"
    return Failure("invalid_tool_input",
                   f"Unknown ref_id {ref_id!r}: {command} {where} or a ref id from an earlier result.")


def unavailable_ref(command: str, ref_id: str) -> Failure:
    """What the model reads when the store that keeps ref ids is down: the ref may be fine, but nobody can look it
    up now; the URL every listing shows always works."""
    where = "in a URL" if command == "find" else "a URL"
    return Failure("ref_unavailable", f"Ref id {ref_id!r} is unavailable right now (the proxy's state store is not "
                                  f"answering): {command} {where} instead; every result lists its URL.")


# ---- writing the output (pure) -----------------------------------------------------------

def format_search(outcome: SearchOutcome, turn: int, first: int) -> tuple[str, dict]:
    """One query's results as text, and the ref ids it handed out (numbered from `first`)."""
    if outcome.status != "ok":
        return f'## search_query "{outcome.query}"\n{outcome.message}', {}
    lines, refs = [f'## search_query "{outcome.query}"{outcome.cached_note}'], {}
    lines += [f"Note: {note}" for note in outcome.notes]  # a fallback, a retry or only some engines answered
    for text in outcome.answers:
        lines.append(f"Answer: {text}")
    for box in outcome.infoboxes:
        lines.append(f"Infobox: {box}")
    for i, hit in enumerate(outcome.hits, first):
        ref = search_ref(turn, i)
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
            f"Retrieved: {page.retrieved_at}; {page.content_type}; {len(lines)} lines"
            + (f"\n{removed_note(page)}" if removed_note(page) else ""))
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


def page_share(parsed: Parsed) -> int:
    """The characters each open/find section may use: the budget split evenly between the page
    commands and, as one more share, all the searches; never under 1000, so a page shows something."""
    pages = len(parsed.opens) + len(parsed.finds)
    return max(1000, parsed.budget_chars // max(1, pages + bool(parsed.queries)))


def within_cap(parsed: Parsed, cap: int) -> tuple[Parsed, list[str]]:
    """The request with at most `cap` open and find commands (opens first, as they run), and the
    ones left out, as the output names them. Pure. Each is a page fetch from a third-party host,
    chosen by a model that page text can steer: one request must not become a crawl."""
    cap = max(0, cap)
    opens, finds = parsed.opens[:cap], parsed.finds[:max(0, cap - len(parsed.opens))]
    left = [f"open {ref}" for ref, _ in parsed.opens[len(opens):]] + \
           [f'find "{pattern}" in {ref}' for ref, pattern in parsed.finds[len(finds):]]
    return replace(parsed, opens=opens, finds=finds), left


def over_cap_note(left: list[str], cap: int, named: int = 10) -> str:
    """What the model reads about the commands within_cap left out (the first `named` of them by name)."""
    more = f"; and {len(left) - named} more" if len(left) > named else ""
    return (f"## not run: {len(left)} page command{'s' if len(left) != 1 else ''}\nThis server runs at most {cap} "
            f"open/find commands per call (ALPHA_SEARCH_MAX_PAGES); these were not run: {'; '.join(left[:named])}{more}. "
            "Send the ones you still need in another call.")


def gateway_status(failures: list[Failure]) -> int:
    """504 when every failure was a timeout, else 502. Pure."""
    return 504 if failures and all(failure.timeout for failure in failures) else 502



def answer(sections: list[str], failures: list[Failure], succeeded: int, budget_chars: int) -> tuple[int, dict]:
    """The HTTP answer for a run. Pure. Nothing succeeded and every failure was a server's behind
    the proxy: a gateway error whose message (Codex hands it to the model) says what failed.
    Otherwise 200 with the text, failures included, so the model can adapt."""
    if failures and succeeded == 0 and all(failure.upstream for failure in failures):
        status = gateway_status(failures)
        message = "Search failed: " + " ".join(failure.message for failure in failures)
        return status, {"error": {"message": message, "type": "gateway_timeout" if status == 504 else "bad_gateway",
                                  "param": None, "code": status}}
    text = "\n\n".join(sections)
    if len(text) > budget_chars:
        text = text[:budget_chars].rstrip() + "\n(cut to max_output_tokens)"
    return 200, {"output": text, "encrypted_output": None}

