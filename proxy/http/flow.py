"""RequestFlow: the WSGI edge. It builds each request's Flow (proxy/engine/flow.py: its route and the route's wire,
everything later layers learn of it) and puts it in the environ under its one key, the only write of the proxy's
into the environ; it times the request (arrival, first body byte, end), counts what its body sent and reads a
model answer's usage as it leaves, then tells the worker's event hub the request ended (engine/events.py's
RequestEnded, with what the flow's tally added up to); the access log, the metrics and the team subscribe.
Installed by create_app; not run on its own (tests/test_faults.py reads its log line, tests/test_metrics.py its
counts).
"""
from __future__ import annotations

import logging
import time

from proxy.apis.wires import wire_of
from proxy.core import routes
from proxy.engine.events import Events, RequestEnded
from proxy.engine.flow import ANONYMOUS, FLOW, Flow
from proxy.observe.usage import UsageScan

log = logging.getLogger("proxy")


class RequestFlow:
    """Around the whole app, so its times are the whole request's. The body passes through untouched, chunk for
    chunk."""

    def __init__(self, app, events: Events):
        self.app = app
        self.events = events

    def __call__(self, environ, start_response):
        started = time.monotonic()
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        route = routes.route_of(path)
        flow = environ[FLOW] = Flow(method, path, route, wire_of(route))
        if _answers_from_the_model(method, path, route):
            # Every model answer is read for its prompt and cached tokens (the metrics, the access log, a key's day).
            flow.scan = UsageScan()
        status = ["-"]

        def sr(line, headers, exc_info=None):
            status[0] = line.split(" ", 1)[0]
            if flow.scan is not None:
                flow.scan.headers(headers)
            return start_response(line, headers, exc_info)

        return _Body(self.app(environ, sr), flow, started, status, self.events)


def _answers_from_the_model(method: str, path: str, route: routes.Route) -> bool:
    """A POST to vLLM's APIs (relayed, or the search loop's): not the proxy's own routes, nor a token count
    (Messages' count_tokens answers input_tokens too, for no prefill)."""
    return method == "POST" and route.generates and not path.endswith("/count_tokens")


class _Body:
    __slots__ = ("_body", "_flow", "_started", "_status", "_events", "_first", "_sent", "_complete")

    def __init__(self, body, flow: Flow, started, status, events):
        self._body, self._flow, self._started, self._status, self._events = body, flow, started, status, events
        self._first: float | None = None
        self._sent = 0
        self._complete = False

    def __iter__(self):
        # Until the first non-empty chunk, each is looked at for the time to first byte; after it, only counted.
        # A model's answer is also read for its usage (proxy/observe/usage.py): read, never changed.
        scan = self._flow.scan
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
            scan = self._flow.scan
            found = scan.result() if scan is not None else None
            usage = (found["prompt_tokens"], found["cached_tokens"]) if found and found["prompt_tokens"] else None
            self._events.emit(self._flow, RequestEnded(
                self._status[0], self._started, self._first, time.monotonic(), self._sent, self._complete, usage))


def access_log(flow: Flow, done: RequestEnded) -> None:
    """One line per request, written when its body has been sent; never prompt or completion text. A model's answer
    adds its prompt tokens and how many vLLM's prefix cache served (`prompt=- cached=-` when it reported none)."""
    prompt, cached = done.usage if done.usage is not None else ("-", "-")
    # A shared stack adds whose request it was (the key's name, never the key) and its time in the fair queue.
    name = flow.key_name
    extra = (f" key={name}" if name != ANONYMOUS else "") + (
        f" queued={flow.queued:.2f}s" if flow.queued is not None else "")
    log.info("%s %s %s %.0fms searches=%d bytes=%d prompt=%s cached=%s%s", flow.method,
             flow.path, done.status, (done.ended - done.started) * 1000, flow.tally.searches,
             done.sent, prompt, cached, extra)
