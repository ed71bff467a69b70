"""The fair queue in front of the card: at most MAX_NUM_SEQS generation calls in vLLM at once, the next seat given
round-robin across keys rather than first come (the tickets and the choice live in proxy/backends/state/teamstore.py,
shared by every worker). Exchange.call takes a seat for each call to vLLM of a generation request and gives it
back when the call ends; the search loop waits for a later turn's seat with the stream's keep-alives.

What queues: every POST to vLLM but the few that take it no time on the card (NO_CARD: count_tokens, tokenize,
detokenize, models, health, metrics, version), which must answer at once (Claude Code asks count_tokens while
another of its requests generates). The list is of what does not queue, so a path vLLM generates on that the proxy
does not know by name (/invocations, /inference/v1/generate, whatever a vLLM release adds) queues all the same; and
the decision is on the path as vLLM will read it (percent-decoded, `//` folded: `POST /v1/%63hat/completions`
generates in vLLM and queues here), the one decoded path the routing and the key check read too.

A seat is held for one call, not for the whole request: while a request runs its searches and page reads the
card serves someone else, and its next turn comes back as a resumed ticket, which goes ahead of its own key's first
turns (it keeps its place in its key's line instead of going to the back) but not ahead of other keys: fairness
counts each search round's turn as a turn of its key, so one key's search loops cannot starve another's question.

When the queue's store does not answer (Valkey or Redis with STATE_URL, which the scale overlay's replicas share;
or the SQLite file failing), calls go straight to vLLM, as with MAX_NUM_SEQS=0: vLLM's own first-come queue
decides until the store is back. Fairness is a courtesy, not a bound, so it fails open (unlike URL provenance's
link budget, proxy/tools/client_reads.py). One log line when it stops answering and one when it is back; each call
that got no answer is counted as proxy_state_errors{use="queue"}; the store is asked again after RETRY seconds.
"""
from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Generator

from proxy.backends.state.state import Circuit
from proxy.backends.state.teamstore import StoreError, TeamStorage
from proxy.core import routes
from proxy.engine.flow import Flow
from proxy.runtime import concurrency as runtime

# POSTs that take vLLM no time on the card; every other POST queues (vLLM's decoded path, no trailing slash).
NO_CARD = frozenset({routes.COUNT_TOKENS, "/tokenize", "/detokenize", "/v1/models", "/health", "/metrics",
                     "/version", "/ping"})
POLL = 0.05                         # seconds between a waiter's looks at the queue
RETRY = 5.0                         # seconds a store that did not answer is left alone before it is asked again
QUEUE_USE = "queue"                 # the state metrics' label for the queue's store calls
DOWN = (StoreError, sqlite3.Error)  # what a store that does not answer raises (teamstore_redis, teamstore)

log = logging.getLogger("proxy")


def vllm_path(target: str) -> str:
    """The path of a request target as vLLM routes it: percent-decoded (Starlette decodes before routing), runs of
    `/` folded and no trailing `/`. Pure."""
    path = urllib.parse.unquote(target.split("?", 1)[0])
    return re.sub(r"/{2,}", "/", path).rstrip("/") or "/"


def queues(method: str, target: str) -> bool:
    """Whether a call to vLLM goes through the fair queue: any POST but those that take no card time. Pure."""
    return method == "POST" and vllm_path(target) not in NO_CARD


class Queue:
    """One worker's view of the shared queue."""

    def __init__(self, store: TeamStorage, seats: int, policy: str = "round_robin",
                 on_wait: Callable[[Flow, float], None] | None = None,
                 on_error: Callable[[str, str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.seats = seats
        self.policy = policy      # QUEUE_POLICY: round_robin or tokens
        self.on_wait = on_wait    # (flow, seconds) after each wait: the metrics
        self.on_error = on_error  # (use, op) for each store call that got no answer: the state metrics
        # The store's circuit: a store that did not answer is left alone for RETRY seconds, then one call tries it.
        self.circuit = Circuit(getattr(store, "path", ""), clock=clock, wait=(RETRY, RETRY),
                               down="fair queue: its store %s is not answering (%s): calls go straight to vLLM, "
                                    "first come first served, until it is back",
                               back="fair queue back: its store %s answers again after %.1f s")

    def take(self, flow: Flow, resumed: bool) -> Seat:
        """A ticket in the queue; without one (the store is down) the seat is ready at once."""
        seat = Seat(self, flow, None)
        if self.circuit.allows():
            try:
                seat.ticket = self.store.enqueue(flow.key_name, resumed)
                self.worked()
            except DOWN as e:
                self.failed("enqueue", e)
        return seat

    def failed(self, op: str, error: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(QUEUE_USE, op)
        self.circuit.failed(error)

    def worked(self) -> None:
        self.circuit.worked()


class Seat:
    """One ticket: waiting, then running, then released (by the call's end, or by a client that left)."""

    def __init__(self, queue: Queue, flow: Flow, ticket: str | None):
        self.queue, self.flow, self.ticket = queue, flow, ticket
        self.since = time.monotonic()
        self.running = False
        self.released = False

    def ready(self) -> bool:
        """Admitted yet? Never blocks; a ticket another worker dropped as stale counts as admitted no more."""
        if not self.running and not self.released:
            if self.ticket is None:  # taken while the store was down: straight to vLLM
                self._admitted()
                return True
            try:
                state = self.queue.store.admitted(self.ticket, self.queue.seats, self.queue.policy)
                if state is None:  # our lease lapsed (the worker stalled past LEASE): queue again, at the front
                    self.ticket = self.queue.store.enqueue(self.flow.key_name, True)
                elif state:
                    self._admitted()
                self.queue.worked()
            except DOWN as e:
                self.queue.failed("admitted", e)
                self._abandon()
                self._admitted()
        return self.running

    def _abandon(self) -> None:
        """Give up the ticket without the store: release drops it from this worker's leases before it asks the
        store, so when the store cannot be told the ticket lapses there within the lease instead of holding a seat."""
        ticket, self.ticket = self.ticket, None
        if ticket is not None:
            with contextlib.suppress(*DOWN):  # counted by failed() already; the lease frees it
                self.queue.store.release(ticket)

    def _admitted(self) -> None:
        self.running = True
        waited = time.monotonic() - self.since
        self.flow.queued = (self.flow.queued or 0.0) + waited
        if self.queue.on_wait is not None:
            self.queue.on_wait(self.flow, waited)

    def wait(self, gone: Callable[[], bool]) -> bool:
        """Block (cooperatively) until admitted: True; or until gone() says the client left: False, its place
        given up at once."""
        for _ in self.waiting(gone, float("inf"), b""):
            pass  # no keep-alive is ever due: a plain request waits silently
        return self.running

    def waiting(self, gone: Callable[[], bool], interval: float, keepalive: bytes) -> Generator[bytes, None, bool]:
        """wait() for a stream whose head is out: yields `keepalive` every `interval` seconds while it waits, so no
        client times out on a silent connection; returns True once admitted, False when the client left."""
        last = time.monotonic()
        while not self.ready():
            if gone():
                self.release()
                return False
            if time.monotonic() - last >= interval:
                last = time.monotonic()
                yield keepalive
            runtime.sleep(POLL)
        return True

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.ticket is None:
                return
            try:
                self.queue.store.release(self.ticket)
            except DOWN as e:  # dropped from this worker's leases first: it lapses in the store
                self.queue.failed("release", e)
