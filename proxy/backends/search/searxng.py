"""SearXNG, the first search backend (proxy/backends/search/search.py's SearchBackend): its calls, with one deadline
each and a bounded answer, and every failure an outcome. Not run on its own; the functions that build and read
SearXNG traffic are pure so they are tested without a network (tests/test_rules.py), the class against
standins/searxng.py.
"""
from __future__ import annotations

import logging
import time
import urllib.parse
from dataclasses import dataclass

from proxy.backends.search.search import Hit, SearchOutcome
from proxy.backends.search.search_health import engine_failures
from proxy.core import codec
from proxy.runtime.cancel import GONE, TIMEOUT, Cancel
from proxy.transport import webclient

log = logging.getLogger("proxy.search")

USER_AGENT = "coding-stack-proxy/1.0 (web_search tool of a self-hosted LLM stack)"
# SearXNG's bot limiter rejects requests without a browser-like Accept, Accept-Encoding and
# Accept-Language, so send all three; the limiter is explained in docs/web-tools.md.
REQUEST_HEADERS = (
    ("Accept", "application/json, */*;q=0.5"),
    ("Accept-Encoding", "gzip, deflate"),
    ("Accept-Language", "en-US,en;q=0.9"),
    ("User-Agent", USER_AGENT),
)
SNIPPET_CHARS = 400
PARTIAL_NAMES = 6  # failing engines named in the note on partial results; the rest are counted


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
        # Named as the engine bookkeeping names them: bounded, printable, whatever the answer put there.
        names = ", ".join(f"{f.engine} ({f.message})" for f in engine_failures(data)) or "engines it did not name"
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
        started = time.monotonic()
        cancel = cancel or Cancel()
        try:
            # A fresh connection per search: searches are seconds apart and few, and the
            # client's X-Forwarded-For never rides along (SearXNG would rate-limit by it).
            status, body, too_big = webclient.get_url(url, dict(REQUEST_HEADERS), seconds, self.max_bytes, cancel)
            if too_big:
                answer = Answer(SearchOutcome(query, "failed", error_code="unavailable", message=(
                    f"Search failed: {self.base_url} answered more than {self.max_bytes} bytes (SEARXNG_MAX_BYTES).")))
            else:
                answer = read_response(query, self.base_url, status, body, limit or self.results)
        except webclient.WebError as e:
            answer = Answer(self._interrupted(query, cancel, seconds) or SearchOutcome(
                query, "failed", error_code="unavailable", message=(
                    f"Search failed: {self.base_url} did not answer within {seconds:g} s." if e.kind == "timeout" else
                    f"Search failed: cannot reach SearXNG at {self.base_url}: {e.detail}"), timed_out=e.kind == "timeout"))
        outcome = answer.outcome
        # The query is model-written from the prompt, so its text is logged only at DEBUG.
        log.info("search -> %s (%d hits, %.0f ms)", outcome.status, len(outcome.hits),
                 (time.monotonic() - started) * 1000)
        log.debug("search query %r -> %s", query, outcome.message or outcome.status)
        return answer

    def _interrupted(self, query: str, cancel: Cancel, seconds: float) -> SearchOutcome | None:
        if cancel.reason == TIMEOUT:
            return SearchOutcome(query, "failed", error_code="unavailable",
                                 message=f"Search failed: {self.base_url} did not answer within {seconds:g} s.",
                                 timed_out=True)
        if cancel.reason == GONE:
            return SearchOutcome(query, "failed", error_code="unavailable",
                                 message="Search failed: the client closed the request.")
        return None
