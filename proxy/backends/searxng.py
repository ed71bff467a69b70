"""SearXNG, the web_search backend of the tools layer (proxy/tools/session.py): its calls, with one deadline each and a
bounded answer, the search cache in front of them, the text the model reads for a search, and failures as
outcomes. Used by every API through tools.ToolSession, and by Codex's /v1/alpha/search; not run on its own.
The functions that build and read SearXNG traffic are pure so they are tested without a network.
"""
from __future__ import annotations

import copy
import logging
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.backends.cache import TTLCache
from proxy.backends.netguard import domain_matches
from proxy.backends.search_health import engine_failures
from proxy.core import codec
from proxy.runtime.cancel import GONE, TIMEOUT, Cancel
from proxy.transport import webclient

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
PARTIAL_NAMES = 6  # failing engines named in the note on partial results; the rest are counted


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
    cached_age: float | None = None  # seconds, when proxy/backends/cache.py answered it from its cache
    # One short line each, read before the results: how they came (a fallback instance, a retry, the keyed backend,
    # only some engines), which the model and the user reading along should know.
    notes: list[str] = field(default_factory=list)

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


def search_url(base_url: str, query: str, language: str | None = None, time_range: str | None = None,
               engines: tuple[str, ...] = (), categories: tuple[str, ...] = ()) -> str:
    params = {"q": query, "format": "json"}
    if language:
        params["language"] = language
    if time_range:
        params["time_range"] = time_range  # SearXNG's day, week, month or year
    if engines:
        params["engines"] = ",".join(engines)  # only these (the failover's retry); unknown names are dropped
    if categories:
        params["categories"] = ",".join(categories)
    return base_url.rstrip("/") + "/search?" + urllib.parse.urlencode(params)


@dataclass
class Answer:
    """One SearXNG call: its outcome, and the answer's JSON object when it had one (the failover reads its
    `unresponsive_engines` and the engines that gave results)."""
    outcome: SearchOutcome
    data: dict | None = None


def outcome_from_response(query: str, url: str, status: int, body: bytes, limit: int) -> SearchOutcome:
    """Read SearXNG's answer (status and decoded body) into an outcome. Pure."""
    return read_response(query, url, status, body, limit).outcome


def read_response(query: str, url: str, status: int, body: bytes, limit: int) -> Answer:
    """outcome_from_response, with the JSON object it read. Pure."""
    failed = _status_failure(url, status)
    if failed is not None:
        return Answer(SearchOutcome(query, "failed", error_code=failed[0], message=failed[1]))
    try:
        data = codec.loads(body)
    except (ValueError, RecursionError):  # RecursionError: `[[[[...` nested thousands deep
        return Answer(SearchOutcome(query, "failed", error_code="unavailable",
                                    message=f"Search failed: {url} did not answer with JSON (is format=json enabled?)."))
    if not isinstance(data, dict):
        return Answer(SearchOutcome(query, "failed", error_code="unavailable",
                                    message=f"Search failed: {url} answered JSON that is not an object."))
    return Answer(_outcome(query, url, data, limit), data)


def _outcome(query: str, url: str, data: dict, limit: int) -> SearchOutcome:
    hits, answers, infoboxes = _hits(data, limit), _answers(data), _infoboxes(data)
    if hits or answers or infoboxes:
        failed = engine_failures(data)
        notes = []
        if failed:
            # Results from fewer engines than usual are fewer and narrower; the model should know why.
            names = ", ".join(f"{f.engine}: {f.message}" for f in sorted(failed, key=lambda f: f.engine)[:PARTIAL_NAMES])
            more = f" and {len(failed) - PARTIAL_NAMES} more" if len(failed) > PARTIAL_NAMES else ""
            notes.append(f"Some search engines failed ({names}{more}); these results come from the others.")
        return SearchOutcome(query, "ok", hits=hits, answers=answers, infoboxes=infoboxes, notes=notes)
    dead = [e for e in _list(data.get("unresponsive_engines")) if isinstance(e, (list, tuple)) and e]
    if dead:
        names = ", ".join(f"{e[0]} ({e[1]})" if len(e) > 1 else str(e[0]) for e in dead)
        return SearchOutcome(query, "failed", error_code="unavailable", message=(
            f"Search failed: every search engine behind {url} failed: {names}. This says nothing "
            "about whether information exists; try again later or answer from what you know."))
    return SearchOutcome(query, "empty", message=f'No results for "{query}". Try different keywords.')


def _status_failure(url: str, status: int) -> tuple[str, str] | None:
    """(error code, message) for an answer that is not a 200, else None."""
    if status == 403:
        return "unavailable", (f"Search failed: {url} answered 403 Forbidden. The SearXNG instance does not allow "
                               "JSON output (add `json` to search.formats in its settings.yml).")
    if status == 429:
        return "too_many_requests", (f"Search failed: {url} answered 429 Too Many Requests (rate-limited by SearXNG's "
                                     "limiter). Do not retry right away; answer from what you know.")
    if 300 <= status < 400:
        return "unavailable", f"Search failed: {url} answered with a redirect ({status}), which the proxy does not follow."
    if status != 200:
        return "unavailable", f"Search failed: {url} answered HTTP {status}."
    return None


def _hits(data: dict, limit: int) -> list[Hit]:
    """The first `limit` results that name a URL; every other field may be missing or of any type."""
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
    return hits


def _answers(data: dict) -> list[str]:
    answers = [a if isinstance(a, str) else str(a.get("answer") or "") for a in _list(data.get("answers"))
               if isinstance(a, (str, dict))]
    return [a for a in answers if a]


def _infoboxes(data: dict) -> list[str]:
    infoboxes = []
    for box in _list(data.get("infoboxes")):
        if isinstance(box, dict):
            text = " ".join(str(box.get("content") or "").split())
            name = str(box.get("infobox") or box.get("id") or "")
            if text or name:
                infoboxes.append(f"{name}: {text[:SNIPPET_CHARS]}" if name else text[:SNIPPET_CHARS])
    return infoboxes


def _list(value) -> list:
    """A field SearXNG documents as a list, or [] when a hostile or broken answer put anything else there."""
    return value if isinstance(value, list) else []


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


def format_for_model(outcome: SearchOutcome) -> str:
    """The compact text a model reads as the tool result. Pure."""
    if outcome.status != "ok":
        text = outcome.message
    else:
        lines = [f'Search results for "{outcome.query}"{outcome.cached_note}:']
        lines += [f"Note: {note}" for note in outcome.notes]
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
        return self.ask(query, language=language, limit=limit, time_range=time_range, cancel=cancel).outcome

    def ask(self, query: str, language: str | None = None, limit: int | None = None, time_range: str | None = None,
            cancel: Cancel | None = None, timeout: float | None = None, engines: tuple[str, ...] = (),
            categories: tuple[str, ...] = ()) -> Answer:
        """search() with the answer's JSON, and what the failover chooses: this call's deadline (`timeout`, the
        instance's own by default) and the engines or categories asked (default: the instance's usual ones)."""
        seconds = self.timeout if timeout is None else timeout
        url = search_url(self.base_url, query, language, time_range, engines, categories)
        parts = urllib.parse.urlsplit(url)
        started = time.monotonic()
        cancel = cancel or Cancel()
        cancel.arm(seconds)
        opened = None
        try:
            # A fresh connection per search: searches are seconds apart and few, and the
            # client's X-Forwarded-For never rides along (SearXNG would rate-limit by it).
            headers = {"Host": parts.netloc, **dict(REQUEST_HEADERS)}
            opened = webclient.get(parts.scheme, parts.hostname or "", parts.port, parts.path + "?" + parts.query,
                                   headers, seconds, cancel)
            body, too_big = webclient.read_body(opened, self.max_bytes, cancel)
            if too_big:
                answer = Answer(SearchOutcome(query, "failed", error_code="unavailable", message=(
                    f"Search failed: {self.base_url} answered more than {self.max_bytes} bytes (SEARXNG_MAX_BYTES).")))
            else:
                answer = read_response(query, self.base_url, opened.status, body, limit or self.results)
        except webclient.WebError as e:
            answer = Answer(self._interrupted(query, cancel, seconds) or SearchOutcome(
                query, "failed", error_code="unavailable", message=(
                    f"Search failed: {self.base_url} did not answer within {seconds:g} s." if e.kind == "timeout" else
                    f"Search failed: cannot reach SearXNG at {self.base_url}: {e.detail}")))
        finally:
            cancel.disarm()
            if opened is not None:
                opened.close()
        outcome = answer.outcome
        # The query is model-written from the prompt, so its text is logged only at DEBUG.
        log.info("search -> %s (%d hits, %.0f ms)", outcome.status, len(outcome.hits),
                 (time.monotonic() - started) * 1000)
        log.debug("search query %r -> %s", query, outcome.message or outcome.status)
        return answer

    def _interrupted(self, query: str, cancel: Cancel, seconds: float) -> SearchOutcome | None:
        if cancel.reason == TIMEOUT:
            return SearchOutcome(query, "failed", error_code="unavailable",
                                 message=f"Search failed: {self.base_url} did not answer within {seconds:g} s.")
        if cancel.reason == GONE:
            return SearchOutcome(query, "failed", error_code="unavailable",
                                 message="Search failed: the client closed the request.")
        return None


# ---- the search cache: SearXNG behind a TTLCache ----------------------------------------------

class _Abandoned(Exception):
    """A search its own caller's client abandoned; carries the outcome back to that caller only."""

    def __init__(self, outcome: SearchOutcome):
        super().__init__("abandoned")
        self.outcome = outcome


def search_key(query: str, language: str | None, limit: int, time_range: str | None) -> tuple:
    """What changes SearXNG's answer: the query (already cleaned by search.clean_query; engines
    ignore case and spacing), language, time range and result count. The instance and its
    engines are one per proxy. Domain filters are not in it: they apply to the cached answer. Pure."""
    return (" ".join(query.casefold().split()), language or "", time_range or "", limit)


def outcome_size(o: SearchOutcome) -> int:
    """Roughly the bytes an outcome holds: its text plus a fixed charge per object. Pure."""
    hits = sum(len(h.title) + len(h.url) + len(h.snippet) + len(h.date or "") + 100 for h in o.hits)
    return 300 + len(o.query) + len(o.message) + hits + sum(len(a) + 50 for a in o.answers + o.infoboxes + o.notes)


class CachedSearXNG(SearXNG):
    """SearXNG behind a TTLCache: a repeated search within SEARCH_CACHE_TTL is answered from the
    cache, identical searches at once go out once, and only answers with results are kept (an
    empty or failed answer may be the engines' passing trouble). A cached answer carries its age,
    which the model reads in the result. Every caller filters domains on what it gets, so a
    cached answer passes the same allowed/blocked lists as a fresh one.

    It takes over the state of the SearXNG that create_app built (whatever that constructor
    takes), so it is a SearXNG wherever one is expected. on_answer(outcome, seconds) hears of
    each search that went out, on_lookup(how, age) of each lookup (proxy/observe/metrics.py's).
    """

    def __init__(self, built: SearXNG, cache: TTLCache[SearchOutcome],
                 on_answer: Callable[[SearchOutcome, float], None] | None = None,
                 on_lookup: Callable[[str, float | None], None] | None = None):
        self.__dict__.update(built.__dict__)
        self.cache = cache
        self._on_answer = on_answer
        self._on_lookup = on_lookup

    def search(self, query: str, language: str | None = None, limit: int | None = None,
               time_range: str | None = None, cancel: Cancel | None = None) -> SearchOutcome:
        def upstream() -> SearchOutcome:
            started = time.monotonic()
            outcome = SearXNG.search(self, query, language=language, limit=limit, time_range=time_range,
                                     cancel=cancel)
            if self._on_answer:
                self._on_answer(outcome, time.monotonic() - started)
            if cancel is not None and cancel.reason == GONE:
                # Cut short because this caller's client left: another client waiting on the same search must
                # not get that as its answer, so it searches for itself (see TTLCache.get_or_compute).
                raise _Abandoned(outcome)
            return outcome

        key = search_key(query, language, limit or self.results, time_range)
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
