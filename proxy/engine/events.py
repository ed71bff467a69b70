"""The named events of a request's flow, and the hub observers subscribe to: the engine and the APIs emit them
without knowing who listens; the metrics and the access log subscribe where the worker is put together
(proxy/http/wiring.py). Not run on its own; tests/test_metrics.py sees them through /proxy/metrics.

Every observer gets (environ, payload): the WSGI environ of the request the event belongs to, and what the
event carries. An event nobody subscribed to costs one dictionary lookup.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOOLS_RAN = "tools_ran"          # a ToolSession ran a round; payload: the outcomes as the tools gave them
ROUND_DONE = "round_done"        # the loop finished a round; payload: the outcomes as the client gets them
TOOL_CALL = "tool_call"          # one call outside the loop (Codex's /v1/alpha/search); payload: (tool, outcome)
URL_REFUSED = "url_refused"      # URL provenance refused a page read before it ran; payload: the reason
CAP_HIT = "cap_hit"              # a limit ended the loop; payload: the cap's name ("search_rounds")
CLIENT_LEFT = "client_left"      # the client hung up; payload: the calls to vLLM that this cut
BACKEND_RETRIED = "backend_retried"  # a call to vLLM failed before its answer and went once more; payload: why
REQUEST_ENDED = "request_ended"  # a request's body is done or abandoned; payload: its Finished record

Observer = Callable[[dict, Any], None]


@dataclass(frozen=True)
class Finished:
    """One request as it ended, measured around the whole app (proxy/http/flow.py): monotonic times in seconds."""
    status: str                  # the HTTP status code as text, "-" when none was sent
    started: float
    first_byte: float | None     # when the first non-empty body bytes left; None when none did
    ended: float
    sent: int                    # body bytes handed to the server
    complete: bool               # the body was sent to its end (else the server stopped sending: the client left)
    usage: tuple[int, int] | None = None  # (prompt tokens, of them served by vLLM's prefix cache) the answer reported


class Events:
    """One worker's event hub: observers by event name, called in the order they subscribed, in the greenlet
    that emits (so an observer must be quick and must not raise)."""

    def __init__(self):
        self._observers: dict[str, list[Observer]] = {}

    def subscribe(self, name: str, observer: Observer) -> None:
        self._observers.setdefault(name, []).append(observer)

    def emit(self, name: str, environ: dict, payload: Any = None) -> None:
        for observer in self._observers.get(name, ()):
            observer(environ, payload)
