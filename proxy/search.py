"""The one search core behind every API's web_search: SearXNG calls, the text the model
reads, failure reporting, repeated-query and iteration bookkeeping.

Used by the chat-completions, Messages and Responses loops; not run on its own. The
functions that build and read SearXNG traffic are pure so they are tested without a network.
"""
from __future__ import annotations

import http.client
import logging
import threading
import time
import urllib.parse
import zlib
from dataclasses import dataclass, field, replace

from . import codec
from .cancel import GONE, TIMEOUT, Cancel, watched
from .fetch import (
    READ_CHUNK,
    Decoder,
    Fetcher,
    FetchError,
    FetchOutcome,
    FetchRequest,
    domain_matches,
    format_page_for_model,
)
from .runtime import run_together

log = logging.getLogger("proxy.search")

USER_AGENT = "coding-stack-proxy/1.0 (web_search tool of a self-hosted LLM stack)"
# SearXNG's bot limiter rejects requests without a browser-like Accept, Accept-Encoding and
# Accept-Language, so send all three; the limiter is explained in the README.
REQUEST_HEADERS = (
    ("Accept", "application/json, */*;q=0.5"),
    ("Accept-Encoding", "gzip, deflate"),
    ("Accept-Language", "en-US,en;q=0.9"),
    ("User-Agent", USER_AGENT),
)
# The web_search tool as every API describes it to the model; each API wraps these in its
# own tool shape (chat function, Messages tool, Responses function).
TOOL_DESCRIPTION = (
    "Search the web and get the top results (title, URL, snippet, date). Use it for anything "
    "that may have changed after your training or that you are not sure of: current events, "
    "versions and release notes, library APIs and error messages, documentation, prices, "
    "people. Write a short keyword query. Don't use it for things you already know well.")
QUERY_SCHEMA = {"type": "object",
                "properties": {"query": {"type": "string", "description": "The search query, a few keywords."}},
                "required": ["query"]}
# The answer to a client's own tool call made in the same turn as a search (the proxy runs
# only searches), so the model asks again in a turn of its own instead of losing the call.
NOT_EXECUTED = ("Not executed: this call was made in the same turn as web_search or web_fetch, and the proxy "
                "only runs those. If it is still needed, call it again in a turn of its own.")
MAX_QUERY_CHARS = 400
SNIPPET_CHARS = 400


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
    cached_age: float | None = None  # seconds, when proxy/cache.py answered it from its cache

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def cached_note(self) -> str:
        """How the model learns it reads a cached answer, and how old it is."""
        return "" if self.cached_age is None else f" (cached, {self.cached_age:.0f} s old)"


def clean_query(raw) -> tuple[str | None, SearchOutcome | None]:
    """Turn a model-written query into one safe to send, or a failed outcome saying why.

    A leading `!`/`!!` is a SearXNG bang (engine selection or a redirect away), never what
    the model meant, so it is stripped along with surrounding whitespace.
    """
    if not isinstance(raw, str):
        return None, SearchOutcome(str(raw), "failed", message="Search failed: the query must be a string.", error_code="invalid_tool_input")
    query = raw.strip()
    while query.startswith("!"):
        query = query.lstrip("!").lstrip()
    query = " ".join(query.split())
    if not query:
        return None, SearchOutcome(raw, "failed", message="Search failed: the query is empty. Call web_search with a non-empty \"query\".", error_code="invalid_tool_input")
    if len(query) > MAX_QUERY_CHARS:
        return None, SearchOutcome(query[:80] + "...", "failed", message=f"Search failed: the query is longer than {MAX_QUERY_CHARS} characters; use a few keywords.", error_code="query_too_long")
    return query, None


def parse_arguments(arguments) -> tuple[str | None, SearchOutcome | None]:
    """Read the `query` out of a tool call's arguments (a JSON string or an object)."""
    try:
        arguments = codec.tool_arguments(arguments)
    except ValueError:
        return None, SearchOutcome(arguments[:80], "failed", message='Search failed: the arguments are not valid JSON. Call web_search with {"query": "..."}.', error_code="invalid_tool_input")
    if not isinstance(arguments, dict) or "query" not in arguments:
        return None, SearchOutcome(str(arguments)[:80], "failed", message='Search failed: missing "query". Call web_search with {"query": "..."}.', error_code="invalid_tool_input")
    return clean_query(arguments["query"])


def search_url(base_url: str, query: str, language: str | None = None, time_range: str | None = None) -> str:
    params = {"q": query, "format": "json"}
    if language:
        params["language"] = language
    if time_range:
        params["time_range"] = time_range  # SearXNG's day, week, month or year
    return base_url.rstrip("/") + "/search?" + urllib.parse.urlencode(params)


def outcome_from_response(query: str, url: str, status: int, body: bytes, limit: int) -> SearchOutcome:
    """Read SearXNG's answer (status and decoded body) into an outcome. Pure."""
    if status == 403:
        return SearchOutcome(query, "failed", error_code="unavailable", message=(
            f"Search failed: {url} answered 403 Forbidden. The SearXNG instance does not allow "
            "JSON output (add `json` to search.formats in its settings.yml)."))
    if status == 429:
        return SearchOutcome(query, "failed", error_code="too_many_requests", message=(
            f"Search failed: {url} answered 429 Too Many Requests (rate-limited by SearXNG's "
            "limiter). Do not retry right away; answer from what you know."))
    if 300 <= status < 400:
        return SearchOutcome(query, "failed", error_code="unavailable",
                             message=f"Search failed: {url} answered with a redirect ({status}), which the proxy does not follow.")
    if status != 200:
        return SearchOutcome(query, "failed", error_code="unavailable",
                             message=f"Search failed: {url} answered HTTP {status}.")
    try:
        data = codec.loads(body)
    except ValueError:
        return SearchOutcome(query, "failed", error_code="unavailable",
                             message=f"Search failed: {url} did not answer with JSON (is format=json enabled?).")
    if not isinstance(data, dict):
        return SearchOutcome(query, "failed", error_code="unavailable",
                             message=f"Search failed: {url} answered JSON that is not an object.")
    hits = []
    for r in _list(data.get("results")):
        if not isinstance(r, dict) or not isinstance(r.get("url"), str) or not r["url"]:
            continue
        snippet = " ".join(str(r.get("content") or "").split())
        if len(snippet) > SNIPPET_CHARS:
            snippet = snippet[:SNIPPET_CHARS].rstrip() + "..."
        date = r.get("publishedDate") or r.get("pubdate") or None
        hits.append(Hit(title=" ".join(str(r.get("title") or r["url"]).split()), url=str(r["url"]),
                        snippet=snippet, date=str(date)[:10] if date else None))
        if len(hits) >= limit:
            break
    answers = [a if isinstance(a, str) else str(a.get("answer") or "") for a in _list(data.get("answers"))
               if isinstance(a, (str, dict))]
    answers = [a for a in answers if a]
    infoboxes = []
    for box in _list(data.get("infoboxes")):
        if isinstance(box, dict):
            text = " ".join(str(box.get("content") or "").split())
            name = str(box.get("infobox") or box.get("id") or "")
            if text or name:
                infoboxes.append(f"{name}: {text[:SNIPPET_CHARS]}" if name else text[:SNIPPET_CHARS])
    if hits or answers or infoboxes:
        return SearchOutcome(query, "ok", hits=hits, answers=answers, infoboxes=infoboxes)
    dead = [e for e in _list(data.get("unresponsive_engines")) if isinstance(e, (list, tuple)) and e]
    if dead:
        names = ", ".join(f"{e[0]} ({e[1]})" if len(e) > 1 else str(e[0]) for e in dead)
        return SearchOutcome(query, "failed", error_code="unavailable", message=(
            f"Search failed: every search engine behind {url} failed: {names}. This says nothing "
            "about whether information exists; try again later or answer from what you know."))
    return SearchOutcome(query, "empty", message=f'No results for "{query}". Try different keywords.')


def _list(value) -> list:
    """A field SearXNG documents as a list, or [] when a hostile or broken answer put anything else there."""
    return value if isinstance(value, list) else []


def host_matches(url: str, domains) -> bool:
    """True when the URL's host is one of `domains` or a subdomain of one (a path in a domain is not
    compared: search results are filtered by site). Pure."""
    return domain_matches(url, domains, paths=False)


def filter_domains(outcome: SearchOutcome, allowed=None, blocked=None) -> SearchOutcome:
    """Keep only hits from allowed domains and none from blocked ones (a client's filters). Pure."""
    if outcome.status != "ok" or not (allowed or blocked):
        return outcome
    hits = [h for h in outcome.hits
            if (not allowed or host_matches(h.url, allowed)) and not (blocked and host_matches(h.url, blocked))]
    # Answers and infoboxes name no source page, so an allow-list can't vouch for them.
    answers, infoboxes = ([], []) if allowed else (outcome.answers, outcome.infoboxes)
    if hits or answers or infoboxes:
        return SearchOutcome(**{**outcome.__dict__, "hits": hits, "answers": answers, "infoboxes": infoboxes})
    return SearchOutcome(outcome.query, "empty",
                         message=f'No results for "{outcome.query}" from the allowed domains. Try different keywords.')


def format_for_model(outcome: SearchOutcome) -> str:
    """The compact text a model reads as the tool result. Pure."""
    if outcome.status != "ok":
        text = outcome.message
    else:
        lines = [f'Search results for "{outcome.query}"{outcome.cached_note}:']
        for a in outcome.answers:
            lines.append(f"Answer: {a}")
        for box in outcome.infoboxes:
            lines.append(f"Infobox: {box}")
        for i, h in enumerate(outcome.hits, 1):
            lines.append("")
            lines.append(f"[{i}] {h.title}")
            lines.append(f"URL: {h.url}")
            if h.date:
                lines.append(f"Date: {h.date}")
            if h.snippet:
                lines.append(f"Snippet: {h.snippet}")
        text = "\n".join(lines)
    if outcome.repeated:
        text = ("You already searched for exactly this; it was not searched again. "
                "Use these results or answer now.\n\n" + text)
    return text


def format_result(outcome) -> str:
    """What the model reads for one call of a round: a search's results or a fetched page. Pure."""
    return format_page_for_model(outcome) if isinstance(outcome, FetchOutcome) else format_for_model(outcome)


class SearXNG:
    """A SearXNG instance. `search()` never raises: every failure is an outcome."""

    def __init__(self, base_url: str, results: int, timeout: float, max_bytes: int = 4 * 1024 * 1024):
        self.base_url = base_url.rstrip("/")
        self.results = results
        self.timeout = timeout
        self.max_bytes = max_bytes

    def search(self, query: str, language: str | None = None, limit: int | None = None,
               time_range: str | None = None, cancel: Cancel | None = None) -> SearchOutcome:
        """One search; `cancel` (the caller's, so its client's leaving ends it) gets the call's deadline:
        SEARXNG_TIMEOUT over connect, head and body together, not per receive."""
        url = search_url(self.base_url, query, language, time_range)
        parts = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        # A fresh connection per search: searches are seconds apart and few, and the
        # client's X-Forwarded-For never rides along (SearXNG would rate-limit by it).
        conn = cls(parts.hostname or "", parts.port, timeout=self.timeout)
        started = time.monotonic()
        cancel = cancel or Cancel()
        cancel.arm(self.timeout)
        try:
            conn.connect()
            cancel.watch(conn.sock)
            conn.request("GET", parts.path + "?" + parts.query, headers=dict(REQUEST_HEADERS))
            resp = conn.getresponse()
            body = self._read(resp, cancel)
            outcome = outcome_from_response(query, self.base_url, resp.status, body, limit or self.results)
        except _TooBig:
            outcome = SearchOutcome(query, "failed", error_code="unavailable", message=(
                f"Search failed: {self.base_url} answered more than {self.max_bytes} bytes (SEARXNG_MAX_BYTES)."))
        except (OSError, http.client.HTTPException, zlib.error, EOFError, FetchError, ValueError) as e:
            outcome = self._interrupted(query, cancel) or (
                SearchOutcome(query, "failed", error_code="unavailable",
                              message=f"Search failed: {self.base_url} did not answer within {self.timeout:g} s.")
                if isinstance(e, TimeoutError) else
                SearchOutcome(query, "failed", error_code="unavailable",
                              message=f"Search failed: cannot reach SearXNG at {self.base_url}: {e}"))
        finally:
            cancel.disarm()
            conn.close()
        # The query is model-written from the prompt, so its text is logged only at DEBUG.
        log.info("search -> %s (%d hits, %.0f ms)", outcome.status, len(outcome.hits),
                 (time.monotonic() - started) * 1000)
        log.debug("search query %r -> %s", query, outcome.message or outcome.status)
        return outcome

    def _read(self, resp, cancel: Cancel) -> bytes:
        """The decoded body, at most max_bytes (gzip and deflate undone within the cap: no bombs)."""
        decoder = Decoder(resp.getheader("Content-Encoding", ""))
        chunks, total = [], 0
        while True:
            data = resp.read1(READ_CHUNK)
            if not data:
                break
            out = decoder.feed(data, self.max_bytes + 1 - total)
            chunks.append(out)
            total += len(out)
            if total > self.max_bytes:
                raise _TooBig
        if cancel.fired:
            raise EOFError("the answer was cut")  # the end was the deadline shutting the socket
        return b"".join(chunks)

    def _interrupted(self, query: str, cancel: Cancel) -> SearchOutcome | None:
        if cancel.reason == TIMEOUT:
            return SearchOutcome(query, "failed", error_code="unavailable",
                                 message=f"Search failed: {self.base_url} did not answer within {self.timeout:g} s.")
        if cancel.reason == GONE:
            return SearchOutcome(query, "failed", error_code="unavailable",
                                 message="Search failed: the client closed the request.")
        return None


class _TooBig(Exception):
    """A SearXNG answer over max_bytes."""


class SearchSession:
    """The tool rounds of one client request: runs its searches and page fetches, remembers the
    searches, counts both.

    Repeating an identical query is the usual loop of local models, so a repeat is answered
    from memory with a note instead of hitting SearXNG again. A page fetched again comes from
    the fetcher's cache.
    """

    def __init__(self, searxng: SearXNG, max_rounds: int, on_search=None, fetcher: Fetcher | None = None,
                 watch=None):
        self.searxng = searxng
        self.fetcher = fetcher
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

    def run(self, queries: list, limit: int | None = None, language: str | None = None) -> list:
        """Run one round: each item is a parse_arguments() result (a search, giving a SearchOutcome)
        or a fetch.FetchRequest (giving a FetchOutcome); outcomes in the items' order, all run
        concurrently. Never raises: every failure is an outcome the model reads."""
        self.rounds += 1
        queries = self._capped(queries)

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
                continue
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
