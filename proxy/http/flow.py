"""RequestFlow: the one WSGI wrapper around the whole app that times each request (arrival, first body byte, end)
and counts what its body sent, then tells the worker's event hub the request ended (engine/events.py's
RequestEnded, with what the request's events added up to); the access log and the metrics subscribe. Installed by create_app; not run on its own
(tests/test_faults.py reads its log line, tests/test_metrics.py its counts).
"""
from __future__ import annotations

import logging
import time

from proxy.core import routes
from proxy.engine.admission import ANONYMOUS, KEY_NAME, QUEUED
from proxy.engine.events import Events, RequestEnded, tally
from proxy.http.team import SCAN
from proxy.observe.usage import UsageScan

log = logging.getLogger("proxy")


class RequestFlow:
    """Outermost, so its times are the whole request's. The body passes through untouched, chunk for chunk."""

    def __init__(self, app, events: Events):
        self.app = app
        self.events = events

    def __call__(self, environ, start_response):
        started = time.monotonic()
        if _answers_from_the_model(environ):
            # Every model answer is read for its prompt and cached tokens (the metrics, the access log); a keys-file
            # key's request gets a scan of its own from the team's check, which serves both.
            environ[SCAN] = UsageScan()
        status = ["-"]

        def sr(line, headers, exc_info=None):
            status[0] = line.split(" ", 1)[0]
            scan = environ.get(SCAN)
            if scan is not None:
                scan.headers(headers)
            return start_response(line, headers, exc_info)

        return _Body(self.app(environ, sr), environ, started, status, self.events)


def _answers_from_the_model(environ: dict) -> bool:
    """A POST to vLLM's APIs (relayed, or the search loop's): not the proxy's own routes, nor a token count
    (Messages' count_tokens answers input_tokens too, for no prefill)."""
    path = environ.get("PATH_INFO", "")
    return environ.get("REQUEST_METHOD") == "POST" and routes.api_of(path) not in ("proxy", "alpha_search", "mcp") \
        and not path.endswith("/count_tokens")


class _Body:
    __slots__ = ("_body", "_environ", "_started", "_status", "_events", "_first", "_sent", "_complete")

    def __init__(self, body, environ, started, status, events):
        self._body, self._environ, self._started, self._status, self._events = body, environ, started, status, events
        self._first: float | None = None
        self._sent = 0
        self._complete = False

    def __iter__(self):
        # Until the first non-empty chunk, each is looked at for the time to first byte; after it, only counted.
        # A model's answer is also read for its usage (proxy/observe/usage.py): read, never changed.
        scan = self._environ.get(SCAN)
        rest = iter(self._body)
        for chunk in rest:
            self._sent += len(chunk)
            if scan is not None:
                scan.feed(chunk)
            if chunk:
                self._first = time.monotonic()
                yield chunk
                break
            yield chunk
        for chunk in rest:
            self._sent += len(chunk)
            if scan is not None:
                scan.feed(chunk)
            yield chunk
        self._complete = True

    def close(self):
        try:
            if hasattr(self._body, "close"):
                self._body.close()
        finally:
            seen = tally(self._environ)
            scan = self._environ.get(SCAN)
            found = scan.result() if scan is not None else None
            usage = (found["prompt_tokens"], found["cached_tokens"]) if found and found["prompt_tokens"] else None
            self._events.emit(self._environ, RequestEnded(
                self._status[0], self._started, self._first, time.monotonic(), self._sent, self._complete,
                seen.searches, seen.client_left, usage))


def access_log(environ: dict, done: RequestEnded) -> None:
    """One line per request, written when its body has been sent; never prompt or completion text. A model's answer
    adds its prompt tokens and how many vLLM's prefix cache served (`prompt=- cached=-` when it reported none)."""
    prompt, cached = done.usage if done.usage is not None else ("-", "-")
    # A shared stack adds whose request it was (the key's name, never the key) and its time in the fair queue.
    name = environ.get(KEY_NAME)
    extra = (f" key={name}" if name and name != ANONYMOUS else "") + (
        f" queued={environ[QUEUED]:.2f}s" if QUEUED in environ else "")
    log.info("%s %s %s %.0fms searches=%d bytes=%d prompt=%s cached=%s%s", environ.get("REQUEST_METHOD"),
             environ.get("PATH_INFO"), done.status, (done.ended - done.started) * 1000, done.searches,
             done.sent, prompt, cached, extra)
