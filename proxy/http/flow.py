"""RequestFlow: the one WSGI wrapper around the whole app that times each request (arrival, first body byte, end)
and counts what its body sent, then tells the worker's event hub the request ended (engine/events.py's
REQUEST_ENDED); the access log and the metrics subscribe. Installed by create_app; not run on its own
(tests/test_faults.py reads its log line, tests/test_metrics.py its counts).
"""
from __future__ import annotations

import logging
import time

from proxy.core import routes
from proxy.core.codec import UsageScan
from proxy.engine.events import REQUEST_ENDED, Events, Finished
from proxy.http.wiring import SEARCHES

log = logging.getLogger("proxy")


class RequestFlow:
    """Outermost, so its times are the whole request's. The body passes through untouched, chunk for chunk."""

    def __init__(self, app, events: Events):
        self.app = app
        self.events = events

    def __call__(self, environ, start_response):
        started = time.monotonic()
        environ[SEARCHES] = 0
        status = ["-"]

        def sr(line, headers, exc_info=None):
            status[0] = line.split(" ", 1)[0]
            return start_response(line, headers, exc_info)

        return _Body(self.app(environ, sr), environ, started, status, self.events, _scan(environ))


def _scan(environ: dict) -> UsageScan | None:
    """A usage reader for an answer of the model (relayed or the loop's): a POST to vLLM's APIs, not the proxy's own
    routes nor a token count (Messages' count_tokens answers input_tokens too, for no prefill)."""
    path = environ.get("PATH_INFO", "")
    if environ.get("REQUEST_METHOD") != "POST" or routes.api_of(path) in ("proxy", "alpha_search") \
            or path.endswith("/count_tokens"):
        return None
    return UsageScan()


class _Body:
    __slots__ = ("_body", "_environ", "_started", "_status", "_events", "_first", "_sent", "_complete", "_usage")

    def __init__(self, body, environ, started, status, events, usage: UsageScan | None = None):
        self._body, self._environ, self._started, self._status, self._events = body, environ, started, status, events
        self._first: float | None = None
        self._sent = 0
        self._complete = False
        self._usage = usage

    def __iter__(self):
        # Until the first non-empty chunk, each is looked at for the time to first byte; after it, only counted
        # (and, for a model's answer, read for its usage: the bytes go on unchanged).
        rest = iter(self._body)
        scan = self._usage.feed if self._usage is not None else None
        for chunk in rest:
            self._sent += len(chunk)
            if chunk:
                self._first = time.monotonic()
                if scan:
                    scan(chunk)
                yield chunk
                break
            yield chunk
        for chunk in rest:
            self._sent += len(chunk)
            if scan:
                scan(chunk)
            yield chunk
        self._complete = True

    def close(self):
        try:
            if hasattr(self._body, "close"):
                self._body.close()
        finally:
            self._events.emit(REQUEST_ENDED, self._environ, Finished(
                self._status[0], self._started, self._first, time.monotonic(), self._sent, self._complete,
                self._usage.counts() if self._usage is not None else None))


def access_log(environ: dict, done: Finished) -> None:
    """One line per request, written when its body has been sent; never prompt or completion text. A model's answer
    adds its prompt tokens and how many vLLM's prefix cache served (`prompt=- cached=-` when it reported none)."""
    prompt, cached = done.usage if done.usage is not None else ("-", "-")
    log.info("%s %s %s %.0fms searches=%d bytes=%d prompt=%s cached=%s", environ.get("REQUEST_METHOD"),
             environ.get("PATH_INFO"), done.status, (done.ended - done.started) * 1000, environ.get(SEARCHES, 0),
             done.sent, prompt, cached)
