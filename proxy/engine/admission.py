"""The fair queue in front of the card: at most MAX_NUM_SEQS generation calls in vLLM at once, the next seat given
round-robin across keys rather than first come (the tickets and the choice live in proxy/backends/teamstore.py,
shared by every worker). Exchange.call takes a seat for each call to vLLM of a generation request and gives it
back when the call ends; the search loop waits for a later turn's seat with the stream's keep-alives.

What queues: POSTs that make vLLM generate (chat completions, /v1/completions, /v1/messages, /v1/responses).
What does not: /v1/models, count_tokens, tokenize, health and metrics, which take vLLM no time on the card and
must answer at once (Claude Code asks count_tokens while another of its requests generates).

A seat is held for one call, not for the whole request: while a request runs its searches and page reads the
card serves someone else, and its next turn comes back as a resumed ticket, which goes ahead of every first turn
(it keeps its place in the line instead of going to the back).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

from proxy.backends.teamstore import TeamStore
from proxy.core import routes
from proxy.runtime import concurrency as runtime

if TYPE_CHECKING:  # only for annotations: redis-py loads only with STATE_URL (proxy/http/wiring.py)
    from proxy.backends.teamstore_redis import RedisTeamStore

KEY_NAME = "proxy.key"              # environ: the name of the request's key (proxy/http/team.py); "-" when open
QUEUED = "proxy.queued_seconds"     # environ: seconds the request waited for seats, over all its calls
METERED = "proxy.metered"           # environ: the request's usage counts against its key (proxy/http/team.py)
# environ: a usage object the client did not ask to see (a chat stream without stream_options.include_usage, asked
# of vLLM for a metered request all the same, so its tokens count against the key's tokens per day)
USAGE_UNSEEN = "proxy.usage_unseen"
ANONYMOUS = "-"                     # every request of a proxy without keys: one key, so first come first served
GENERATION = frozenset({routes.CHAT, routes.MESSAGES, routes.RESPONSES, "/v1/completions"})
POLL = 0.05                         # seconds between a waiter's looks at the queue


def queues(method: str, target: str) -> bool:
    """Whether a call to vLLM goes through the fair queue: a generation POST. Pure."""
    return method == "POST" and target.split("?", 1)[0] in GENERATION


class Queue:
    """One worker's view of the shared queue."""

    def __init__(self, store: TeamStore | RedisTeamStore, seats: int, policy: str = "round_robin", on_wait: Callable[[dict, float], None] | None = None):
        self.store = store
        self.seats = seats
        self.policy = policy      # QUEUE_POLICY: round_robin or tokens
        self.on_wait = on_wait    # (environ, seconds) after each wait: the metrics

    def take(self, environ: dict, resumed: bool) -> Seat:
        return Seat(self, environ, self.store.enqueue(environ.get(KEY_NAME) or ANONYMOUS, resumed))


class Seat:
    """One ticket: waiting, then running, then released (by the call's end, or by a client that left)."""

    def __init__(self, queue: Queue, environ: dict, ticket: str):
        self.queue, self.environ, self.ticket = queue, environ, ticket
        self.since = time.monotonic()
        self.running = False
        self.released = False

    def ready(self) -> bool:
        """Admitted yet? Never blocks; a ticket another worker dropped as stale counts as admitted no more."""
        if not self.running and not self.released:
            state = self.queue.store.admitted(self.ticket, self.queue.seats, self.queue.policy)
            if state is None:  # our lease lapsed (the worker stalled past LEASE): queue again, at the front
                self.ticket = self.queue.store.enqueue(self.environ.get(KEY_NAME) or ANONYMOUS, True)
            elif state:
                self._admitted()
        return self.running

    def _admitted(self) -> None:
        self.running = True
        waited = time.monotonic() - self.since
        self.environ[QUEUED] = self.environ.get(QUEUED, 0.0) + waited
        if self.queue.on_wait is not None:
            self.queue.on_wait(self.environ, waited)

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
            self.queue.store.release(self.ticket)
