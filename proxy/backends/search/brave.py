"""The Brave Search API as an opt-in, keyed search backend (BRAVE_SEARCH_API_KEY) behind the same search() as SearXNG,
for when every SearXNG instance is blocked or down: its request and the reading of its answer (pure), and one call
with one deadline that never raises. Built from Brave's documented Web Search API (GET /res/v1/web/search with the
key in X-Subscription-Token; results in web.results as title, url, description, page_age); tests/test_brave.py
checks it against standins/brave.py. The key goes in that one header and nowhere else: no log line, message or
repr carries it.
"""
from __future__ import annotations

import html
import logging
import re
import time
import urllib.parse

from proxy.backends.search.search import Hit, SearchOutcome
from proxy.backends.search.searxng import SNIPPET_CHARS, USER_AGENT
from proxy.core import codec
from proxy.runtime.cancel import GONE, TIMEOUT, Cancel
from proxy.transport import webclient

log = logging.getLogger("proxy.search")

API_URL = "https://api.search.brave.com/res/v1/web/search"
SOURCE = "Brave Search API"
MAX_COUNT = 20  # Brave's documented maximum for `count`
# SearXNG's time ranges in Brave's `freshness` codes (past day, week, month, year).
FRESHNESS = {"day": "pd", "week": "pw", "month": "pm", "year": "py"}
_TAG = re.compile(r"<[^>]*>")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_ERROR_CODE = re.compile(r"[A-Z][A-Z_]{2,60}")


def request_url(api_url: str, query: str, language: str | None, count: int, time_range: str | None) -> str:
    """The search's URL. Pure. Only what Brave documents is sent: a language it may not know (SearXNG's "en-US",
    "auto") becomes its two-letter `search_lang` or nothing, since an unknown value is a 422, not a search."""
    params = {"q": query, "count": str(max(1, min(MAX_COUNT, count)))}
    lang = (language or "").split("-")[0].lower()
    if re.fullmatch(r"[a-z]{2}", lang):
        params["search_lang"] = lang
    if time_range in FRESHNESS:
        params["freshness"] = FRESHNESS[time_range]
    return api_url + "?" + urllib.parse.urlencode(params)


def request_headers(api_key: str) -> dict[str, str]:
    """Brave's headers (the web client adds Host): the key only in X-Subscription-Token, as Brave documents."""
    return {"Accept": "application/json", "Accept-Encoding": "gzip", "User-Agent": USER_AGENT,
            "X-Subscription-Token": api_key}


def outcome_from_response(query: str, status: int, body: bytes, limit: int) -> SearchOutcome:
    """Read Brave's answer (status and decoded body) into an outcome. Pure; any shape of body is survived."""
    if status != 200:
        return _status_failure(query, status, body)
    try:
        data = codec.loads(body)
    except (ValueError, RecursionError):  # RecursionError: `[[[[...` nested thousands deep
        return _failed(query, f"Search failed: the {SOURCE} did not answer with JSON.")
    if not isinstance(data, dict):
        return _failed(query, f"Search failed: the {SOURCE} answered JSON that is not an object.")
    web = data.get("web")
    results = web.get("results") if isinstance(web, dict) else None
    hits = []
    for r in results if isinstance(results, list) else []:
        if not isinstance(r, dict) or not isinstance(r.get("url"), str) or not r["url"].startswith(("http://", "https://")):
            continue
        hits.append(Hit(title=_text(r.get("title")) or r["url"], url=r["url"],
                        snippet=_cut(_text(r.get("description"))), date=_date(r)))
        if len(hits) >= limit:
            break
    if hits:
        return SearchOutcome(query, "ok", hits=hits)
    return SearchOutcome(query, "empty", message=f'No results for "{query}" from the {SOURCE}. Try different keywords.')


def _status_failure(query: str, status: int, body: bytes) -> SearchOutcome:
    code = _error_code(body)
    named = f"HTTP {status}" + (f", {code}" if code else "")
    if status == 429:
        return _failed(query, f"Search failed: the {SOURCE} answered {named}: the key's rate limit or monthly quota is "
                       "used up. Do not retry right away; answer from what you know.", "too_many_requests")
    if status in (401, 403) or "TOKEN" in code or "SUBSCRIPTION" in code:
        return _failed(query, f"Search failed: the {SOURCE} refused the key ({named}); the proxy's "
                       "BRAVE_SEARCH_API_KEY needs checking.")
    return _failed(query, f"Search failed: the {SOURCE} answered {named}.")


def _error_code(body: bytes) -> str:
    """Brave's machine-readable error code (error.code, e.g. SUBSCRIPTION_TOKEN_INVALID) when it is one; its detail
    text is not passed on."""
    try:
        data = codec.loads(body)
    except (ValueError, RecursionError):
        return ""
    err = data.get("error") if isinstance(data, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else ""


def _failed(query: str, message: str, code: str = "unavailable", timed_out: bool = False) -> SearchOutcome:
    return SearchOutcome(query, "failed", error_code=code, message=message, timed_out=timed_out)


def _text(value) -> str:
    """Brave marks the query's words in titles and descriptions with <strong>; the model reads plain text."""
    return " ".join(html.unescape(_TAG.sub("", value)).split()) if isinstance(value, str) else ""


def _cut(text: str) -> str:
    return text[:SNIPPET_CHARS].rstrip() + "..." if len(text) > SNIPPET_CHARS else text


def _date(r: dict) -> str | None:
    page_age = r.get("page_age")
    if isinstance(page_age, str) and _DATE.match(page_age):
        return page_age[:10]
    age = r.get("age")  # "July 20, 2023", "2 days ago": what Brave shows beside the snippet
    if not isinstance(age, str):
        return None
    return " ".join(age.split())[:30] or None


class BraveSearch:
    """The Brave Search API with one key. `search()` never raises: every failure is an outcome."""

    name = SOURCE

    def __init__(self, api_key: str, results: int, timeout: float, max_bytes: int = 4 * 1024 * 1024,
                 api_url: str = API_URL):
        self._key = api_key
        self.api_url = api_url
        self.results = results
        self.timeout = timeout
        self.max_bytes = max_bytes

    def __repr__(self) -> str:  # never the key
        return f"BraveSearch({self.api_url!r})"

    def search(self, query: str, language: str | None = None, limit: int | None = None,
               time_range: str | None = None, cancel: Cancel | None = None,
               timeout: float | None = None) -> SearchOutcome:
        """One search; `cancel` (the caller's) gets the call's deadline: `timeout` (default the backend's own) over
        connect, head and body together."""
        seconds = timeout if timeout is not None else self.timeout
        url = request_url(self.api_url, query, language, limit or self.results, time_range)
        started = time.monotonic()
        cancel = cancel or Cancel()
        try:
            status, body, too_big = webclient.get_url(url, request_headers(self._key), seconds, self.max_bytes, cancel)
            outcome = (_failed(query, f"Search failed: the {SOURCE} answered more than {self.max_bytes} bytes.")
                       if too_big else outcome_from_response(query, status, body, limit or self.results))
        except webclient.WebError as e:
            if cancel.reason == GONE:
                outcome = _failed(query, "Search failed: the client closed the request.")
            elif cancel.reason == TIMEOUT or e.kind == "timeout":
                outcome = _failed(query, f"Search failed: the {SOURCE} did not answer within {seconds:g} s.",
                                  timed_out=True)
            else:
                outcome = _failed(query, f"Search failed: cannot reach the {SOURCE}: {e.detail}")
        log.info("brave search -> %s (%d hits, %.0f ms)", outcome.status, len(outcome.hits),
                 (time.monotonic() - started) * 1000)
        return outcome
