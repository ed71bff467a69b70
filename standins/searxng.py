"""A stand-in SearXNG on loopback serving /search?format=json as a real instance does
(tests/data and SearXNG's API notes), plus every failure mode the proxy must survive.

Used from tests/conftest.py (`searxng` fixture). By default a query gets three results made
from its own words; `searxng.behave(query_or_None, mode, ...)` changes that per query.
"""
from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .server import QuietHandler, StandInServer


@dataclass
class SearchRequest:
    path: str
    params: dict
    headers: dict

    @property
    def query(self) -> str:
        return self.params.get("q", "")


def result(url: str, title: str, content: str = "", date=None, engine: str = "localfixture") -> dict:
    """One result with every key a real instance sends (see tests/data notes)."""
    parsed = urllib.parse.urlsplit(url)
    return {"url": url, "title": title, "content": content, "engine": engine, "template": "default.html",
            "parsed_url": [parsed.scheme, parsed.netloc, parsed.path, "", parsed.query, ""],
            "img_src": "", "thumbnail": "", "priority": "", "engines": [engine], "positions": [1],
            "score": 1.0, "category": "general", "publishedDate": date}


def default_results(query: str, engine: str = "localfixture") -> list[dict]:
    slug = "-".join(query.lower().split())[:40] or "q"
    return [result(f"https://example.org/{slug}/{i}", f"{query} — result {i}",
                   f"Snippet {i} about {query}.", "2026-11-0%dT00:00:00" % i if i == 1 else None, engine)
            for i in (1, 2, 3)]


def page(query: str, results: list, unresponsive=(), answers=(), infoboxes=()) -> dict:
    return {"query": query, "results": list(results), "answers": list(answers), "corrections": [],
            "infoboxes": list(infoboxes), "suggestions": [], "unresponsive_engines": [list(u) for u in unresponsive]}


class SearxngStandIn(StandInServer):
    def __init__(self):
        self.requests: list[SearchRequest] = []
        self._modes: dict[str | None, tuple[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        super().__init__()

    def reset(self):
        with self._lock:
            self.requests.clear()
            self._modes.clear()

    def behave(self, query: str | None, mode: str, **kw):
        """mode: results (results=[...], unresponsive=[(engine, message)] beside them, engine= the results'),
        empty, dead (every engine failed), status (code=, body=), nonjson, redirect, slow (seconds=, then results),
        gzip (results, gzipped), blocked (failing=[(engine, message)]: a plain search finds every engine failed, as
        SearXNG answers when its engines are blocked; one naming `engines` or `categories` gets results from the named
        engines that are not failing, or from the category's `it_engine=`)."""
        with self._lock:
            self._modes[query] = (mode, kw)

    @property
    def queries(self) -> list[str]:
        return [r.query for r in self.requests]

    def handler(self):
        outer = self

        class Handler(QuietHandler):
            def send(self, status, body: bytes, ctype="application/json", extra=()):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path, _, qs = self.path.partition("?")
                params = dict(urllib.parse.parse_qsl(qs, keep_blank_values=True))
                with outer._lock:
                    outer.requests.append(SearchRequest(path, params, {k.lower(): v for k, v in self.headers.items()}))
                    q = params.get("q", "")
                    no_mode: tuple[str, dict[str, Any]] = ("results", {})
                    mode, kw = outer._modes.get(q) or outer._modes.get(None) or no_mode
                if path != "/search":
                    return self.send(404, b"Not Found", "text/plain")
                if not q:
                    return self.send(400, b'{"error": "No query"}')
                if mode == "slow":
                    time.sleep(kw.get("seconds", 1.0))
                    mode = "results"
                if mode == "results":
                    body = page(q, kw.get("results", default_results(q, kw.get("engine", "localfixture"))),
                                unresponsive=kw.get("unresponsive", ()), answers=kw.get("answers", ()),
                                infoboxes=kw.get("infoboxes", ()))
                    return self.send(200, json.dumps(body).encode())
                if mode == "blocked":
                    failing = dict(kw.get("failing", [("duckduckgo", "CAPTCHA"), ("brave", "too many requests")]))
                    named = [e.strip() for e in params.get("engines", "").split(",") if e.strip()]
                    if "it" in params.get("categories", "").split(","):
                        named.append(kw.get("it_engine", "github"))
                    if not named:
                        return self.send(200, json.dumps(page(q, [], unresponsive=failing.items())).encode())
                    working = [e for e in named if e not in failing]
                    if not working:
                        dead = [(e, failing[e]) for e in named]
                        return self.send(200, json.dumps(page(q, [], unresponsive=dead)).encode())
                    return self.send(200, json.dumps(page(q, default_results(q, working[0]))).encode())
                if mode == "gzip":
                    packed = gzip.compress(json.dumps(page(q, default_results(q))).encode())
                    return self.send(200, packed, extra=[("Content-Encoding", "gzip")])
                if mode == "empty":
                    return self.send(200, json.dumps(page(q, [])).encode())
                if mode == "dead":
                    return self.send(200, json.dumps(page(q, [], unresponsive=[
                        ("duckduckgo", "HTTP connection error"), ("brave", "Suspended: too many requests")])).encode())
                if mode == "status":
                    code = kw["code"]
                    default = {403: b"<html>Forbidden</html>", 429: b"Too Many Requests",
                               500: b'{"error": "search error"}'}.get(code, b"error")
                    return self.send(code, kw.get("body", default), "text/html" if code == 403 else "text/plain")
                if mode == "nonjson":
                    return self.send(200, b"<!DOCTYPE html><html><body>results</body></html>", "text/html")
                if mode == "redirect":
                    return self.send(302, b"", "text/html", extra=[("Location", "https://duckduckgo.com/?q=x")])
                raise AssertionError(f"unknown mode {mode}")

        return Handler
