"""What a request's flow tells its observers: one frozen dataclass per event, and the worker's hub that observers
subscribe to by event type. The engine and the APIs emit them without knowing who listens; the metrics and the
access log subscribe where the worker is put together (proxy/http/wiring.py's `observe`, the one place). Not run on
its own; tests/test_metrics.py sees them through /proxy/metrics, tests/test_faults.py through the access log.

Every observer gets (flow, event): the Flow of the request the event belongs to (proxy/engine/flow.py: its method,
route, key name, time queued, tally), and the event. Before any observer runs the hub has the flow add the event to
its Tally (the searches, page reads and refused fetches a request ran, that its client left), so one count serves
every reader and RequestEnded carries it. An event nobody subscribed to costs one dictionary lookup.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar


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
    # What its rounds did (searches, a client that left) is the flow's tally, which observers are handed beside this.
    usage: tuple[int, int] | None = None  # (prompt tokens, of them served by vLLM's prefix cache) the answer reported


E = TypeVar("E")
Observer = Callable[[Any, Any], None]


class Observed(Protocol):
    """The request an event belongs to, as the hub needs it (proxy/engine/flow.py's Flow)."""

    def saw(self, event: object) -> None: ...


class Events:
    """One worker's event hub: observers by event type, called in the order they subscribed, in the greenlet
    that emits (so an observer must be quick and must not raise)."""

    def __init__(self):
        self._observers: dict[type, list[Observer]] = {}

    def subscribe(self, kind: type[E], observer: Callable[[Any, E], None]) -> None:
        self._observers.setdefault(kind, []).append(observer)

    def emit(self, flow: Observed, event) -> None:
        flow.saw(event)
        for observer in self._observers.get(type(event), ()):
            observer(flow, event)
