"""A stand-in Brave Search API on loopback, built from Brave's documented Web Search API: GET /res/v1/web/search
with the key in X-Subscription-Token, q (1-400 characters), count (1-20), search_lang and freshness; answers
{"type": "search", "web": {"results": [{title, url, description (query words in <strong>), page_age, age}]}}, and
errors as {"type": "ErrorResponse", "error": {"status", "code", "detail"}}: 422 SUBSCRIPTION_TOKEN_INVALID for a
wrong or missing key, 422 VALIDATION for a bad parameter, 429 RATE_LIMITED with the X-RateLimit-* headers.

Used by tests/test_brave.py and tests/test_search_failover.py; `behave(mode, ...)` changes what the next searches get.
"""
from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .searxng import SearchRequest
from .server import QuietHandler, StandInServer

PATH = "/res/v1/web/search"
KEY = "brave-test-key-0123456789"
FRESHNESS = ("pd", "pw", "pm", "py")


@dataclass
class BraveReply:
    status: int
    body: bytes
    headers: tuple = ()


def web_result(url: str, title: str, description: str = "", page_age: str | None = None, age: str | None = None) -> dict:
    """One result with the keys Brave documents for a SearchResult (those the proxy reads and a few it doesn't)."""
    r: dict[str, Any] = {"type": "search_result", "title": title, "url": url, "description": description,
                         "is_source_local": False, "is_source_both": False, "family_friendly": True,
                         "language": "en", "meta_url": {"scheme": "https", "netloc": urllib.parse.urlsplit(url).netloc}}
    if page_age is not None:
        r["page_age"] = page_age
    if age is not None:
        r["age"] = age
    return r


def default_results(query: str, count: int) -> list[dict]:
    slug = "-".join(query.lower().split())[:40] or "q"
    return [web_result(f"https://brave.example/{slug}/{i}", f"{query} &amp; <strong>more</strong> {i}",
                       f"About <strong>{query}</strong>, result {i}.",
                       page_age="2026-10-0%dT12:00:00" % i if i == 1 else None, age="2 days ago" if i == 2 else None)
            for i in range(1, min(count, 3) + 1)]


def error(status: int, code: str, detail: str) -> bytes:
    return json.dumps({"type": "ErrorResponse", "error": {"id": "0b6f8f1e", "status": status, "code": code,
                                                          "detail": detail, "meta": {"component": "api"}},
                       "time": 1764870000}).encode()


class BraveStandIn(StandInServer):
    def __init__(self, key: str = KEY):
        self.key = key
        self.requests: list[SearchRequest] = []
        self._mode: tuple[str, dict[str, Any]] = ("results", {})
        self._lock = threading.Lock()
        super().__init__()

    @property
    def api_url(self) -> str:
        return self.url + PATH

    def behave(self, mode: str, **kw):
        """mode: results (results=[...] or made from the query), empty, status (code=, body=), ratelimited,
        slow (seconds=, then results), nonjson, gzip, raw (body=, bytes of any shape with status 200)."""
        with self._lock:
            self._mode = (mode, kw)

    def answer(self, path: str, params: dict, headers: dict) -> BraveReply:
        """What Brave's documented API answers this request."""
        with self._lock:
            mode, kw = self._mode
        if path != PATH:
            return BraveReply(404, error(404, "NOT_FOUND", "Resource not found."))
        if headers.get("x-subscription-token") != self.key:
            return BraveReply(422, error(422, "SUBSCRIPTION_TOKEN_INVALID", "The provided subscription token is invalid."))
        q = params.get("q", "")
        count = params.get("count", "20")
        if not q or len(q) > 400 or not count.isdigit() or not 1 <= int(count) <= 20 or \
                params.get("freshness", "pd") not in FRESHNESS:
            return BraveReply(422, error(422, "VALIDATION", "Unable to validate request parameter(s)"))
        if mode == "slow":
            time.sleep(kw.get("seconds", 1.0))
            mode = "results"
        if mode in ("results", "gzip"):
            results = kw.get("results", default_results(q, int(count)))
            body = json.dumps({"type": "search", "query": {"original": q, "more_results_available": False},
                               "mixed": {"type": "mixed", "main": []},
                               "web": {"type": "search", "results": results, "family_friendly": True}}).encode()
            if mode == "gzip":
                return BraveReply(200, gzip.compress(body), (("Content-Encoding", "gzip"),))
            return BraveReply(200, body)
        if mode == "empty":
            return BraveReply(200, json.dumps({"type": "search", "query": {"original": q}}).encode())
        if mode == "ratelimited":
            return BraveReply(429, error(429, "RATE_LIMITED", "Request rate limit exceeded for plan."),
                              (("X-RateLimit-Limit", "1, 2000"), ("X-RateLimit-Remaining", "0, 1500"),
                               ("X-RateLimit-Reset", "1, 1419704")))
        if mode == "status":
            return BraveReply(kw["code"], kw.get("body", error(kw["code"], "INTERNAL", "error")))
        if mode == "nonjson":
            return BraveReply(200, b"<html>maintenance</html>", (("Content-Type", "text/html"),))
        if mode == "raw":
            return BraveReply(200, kw["body"])
        raise AssertionError(f"unknown mode {mode}")

    def handler(self):
        outer = self

        class Handler(QuietHandler):
            def do_GET(self):
                path, _, qs = self.path.partition("?")
                params = dict(urllib.parse.parse_qsl(qs, keep_blank_values=True))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with outer._lock:
                    outer.requests.append(SearchRequest(path, params, headers))
                reply = outer.answer(path, params, headers)
                self.send_response(reply.status)
                extra = dict(reply.headers)
                self.send_header("Content-Type", extra.pop("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(reply.body)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(reply.body)

        return Handler
