"""What a request's flow tells its observers: one frozen dataclass per event, and the worker's hub that observers
subscribe to by event type. The engine and the APIs emit them without knowing who listens; the metrics and the
access log subscribe where the worker is put together (proxy/http/wiring.py's `observe`, the one place). Not run on
its own; tests/test_metrics.py sees them through /proxy/metrics, tests/test_faults.py through the access log.

Every observer gets (environ, event): the WSGI environ of the request the event belongs to (its method and path),
and the event. Observers never write the environ: what one event must tell a later one (the searches a request
ran, that its client left) the hub keeps in the request's Tally, and RequestEnded carries it. An event nobody
subscribed to costs one dictionary lookup.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar


@dataclass(frozen=True)
class RoundDone:
    """A round of tool calls is done (the loop's, alpha search's)."""
    outcomes: tuple     # as the client gets them (a request's own max_uses refusals included)
    searches: int = 0   # searches it sent out (not answered from the request's memory): the access log's count


@dataclass(frozen=True)
class UrlRefused:
    """URL provenance refused a page read before it ran."""
    reason: str         # proxy/tools/provenance.py's: not_given, link_depth, link_budget


@dataclass(frozen=True)
class CapHit:
    """A limit ended the loop."""
    cap: str            # "search_rounds" (MAX_SEARCH_ITER)


@dataclass(frozen=True)
class ClientLeft:
    """The client hung up (and per call attached to its watch afterwards)."""
    aborted: int        # the calls to vLLM this cut


@dataclass(frozen=True)
class BackendRetried:
    """A call to vLLM failed before its answer and went once more."""
    reason: str         # unreachable (refused, reset, closed), or the gateway's status: 500, 502, 503


@dataclass(frozen=True)
class RequestEnded:
    """One request as it ended, measured around the whole app (proxy/http/flow.py): monotonic times in seconds."""
    status: str                  # the HTTP status code as text, "-" when none was sent
    started: float
    first_byte: float | None     # when the first non-empty body bytes left; None when none did
    ended: float
    sent: int                    # body bytes handed to the server
    complete: bool               # the body was sent to its end (else the server stopped sending: the client left)
    searches: int = 0            # searches its rounds sent out
    client_left: bool = False    # its client watch saw the client go
    usage: tuple[int, int] | None = None  # (prompt tokens, of them served by vLLM's prefix cache) the answer reported


E = TypeVar("E")
Observer = Callable[[dict, Any], None]
TALLY = "proxy.events_tally"  # the environ key of the request's Tally: the hub's alone


@dataclass
class Tally:
    """What a request's events added up to so far, kept by the hub for the RequestEnded it ends with."""
    searches: int = 0
    client_left: bool = False

    def saw(self, event) -> None:
        if isinstance(event, RoundDone):
            self.searches += event.searches
        elif isinstance(event, ClientLeft):
            self.client_left = True


class Events:
    """One worker's event hub: observers by event type, called in the order they subscribed, in the greenlet
    that emits (so an observer must be quick and must not raise)."""

    def __init__(self):
        self._observers: dict[type, list[Observer]] = {}

    def subscribe(self, kind: type[E], observer: Callable[[dict, E], None]) -> None:
        self._observers.setdefault(kind, []).append(observer)

    def emit(self, environ: dict, event) -> None:
        tally(environ).saw(event)
        for observer in self._observers.get(type(event), ()):
            observer(environ, event)


def tally(environ: dict) -> Tally:
    """The request's Tally (made at its first event)."""
    found = environ.get(TALLY)
    if found is None:
        found = environ[TALLY] = Tally()
    return found
