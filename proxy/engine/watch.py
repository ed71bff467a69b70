"""The client's watch and one call to vLLM on it: a client that hangs up while the proxy waits on vLLM has every
call live for it aborted, which is how vLLM learns to stop. Exchange.watch_client starts the watch and Exchange.call
makes each Call (proxy/engine/exchange.py); the search loop and the relay stop them. Not run on its own
(tests/test_client_leaving.py).
"""
from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable
from typing import Protocol

from proxy.engine.admission import Seat
from proxy.runtime import concurrency as runtime
from proxy.transport.vllm import UpstreamResponse

log = logging.getLogger("proxy")


class Abortable(Protocol):
    """What a watch can stop: a call to vLLM (Call), or a fetch or search (proxy.runtime.cancel.Cancel)."""

    def abort(self) -> None: ...


class ClientWatch:
    """Notices a client that hangs up while the proxy waits on vLLM, and aborts the calls to
    vLLM that are live for it (each call attaches itself, and detaches when it is over).

    WSGI has no disconnect signal, so the proxy watches the client socket for readability:
    a peek that returns b"" means the client closed. Anything else (a pipelined request)
    ends the watch without consuming a byte. Under gunicorn's gevent worker (the shipped
    one) the watch is a bare event-loop callback; under its thread-based workers, a thread
    polling select(). Flask's development server gives no socket, so nothing is watched.
    """

    def __init__(self, environ, on_left: Callable[[int], None] | None = None):
        self._sock = environ.get("gunicorn.socket")
        self._on_left = on_left  # told how many calls each leaving cut (the ClientLeft event)
        self._calls: set[Abortable] = set()
        self._stop = threading.Event()
        self.gone = False
        self._io = None
        if self._sock is None:
            return
        # Peek through the OS socket, never gevent's wrapper: a gevent recv that finds nothing
        # parks on the socket's single read event, the one gunicorn waits on for the client's
        # next keep-alive request, and the two waiters collide (ConcurrentObjectUseError, a
        # 500 for that next request; scripts/load_test.py found it). MSG_DONTWAIT never parks.
        self._raw = getattr(self._sock, "_sock", self._sock)
        # Under gevent a read watcher of its own on the loop: no greenlet to spawn, switch to and kill
        # per request (a spawned watcher cost every request a hub round trip).
        self._io = runtime.on_readable(self._raw.fileno(), self._check)
        if self._io is None:
            threading.Thread(target=self._poll, daemon=True, name="client-watch").start()

    def _check(self) -> bool:
        """The socket turned readable: True when the watch is over (client gone or not)."""
        if self._stop.is_set():
            return True  # the request is over: what arrived is the client's next request
        try:
            data = self._raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # nothing there after all (gunicorn read it first)
        except (OSError, ValueError):
            data = b""
        if data:
            self._end()
            return True
        self.gone = True
        self._end()
        log.info("client went away; aborting the backend request and its fetches and searches")
        calls = list(self._calls)
        self._left(len(calls))
        for call in calls:
            call.abort()
        return True

    def _poll(self):
        while not self._stop.is_set():
            try:
                readable, _, _ = select.select([self._raw], [], [], 0.5)
            except (OSError, ValueError):
                readable = [self._raw]  # a socket select() refuses is closed: _check finds that out
            if readable and self._check():
                return

    def attach(self, call: Abortable):
        """Watch over a live call; it is aborted at once if the client already left."""
        self._calls.add(call)
        if self.gone:
            self._left(1)
            call.abort()

    def _left(self, aborted: int):
        if self._on_left is not None:
            self._on_left(aborted)

    def detach(self, call: Abortable):
        self._calls.discard(call)

    def _end(self):
        if self._io is not None:
            self._io()  # may run inside the watcher's own callback: it stops, it does not close
            self._io = None

    def stop(self):
        self._stop.set()
        self._end()


class Call:
    """One request to vLLM for one client, from before its socket exists until it is over.

    The client's watch aborts it through here and nowhere else. Before vLLM has answered,
    the connection is this call's alone (taken from the pool, or new), so cutting its socket
    is safe; after, the abort is UpstreamResponse.abort, which leaves a finished response's
    connection alone: once back in the pool it may be serving another client. end() takes
    the call off the watch, so nothing of this request holds the connection afterwards.
    """

    __slots__ = ("_response", "_conn", "_aborted", "_watch", "seat")

    def __init__(self, watch: ClientWatch | None, seat: Seat | None = None):
        self._response: UpstreamResponse | None = None  # set by Exchange.call once vLLM's head is in
        self._conn = None
        self._aborted = False
        self._watch = watch
        self.seat = seat  # its seat in the fair queue, given back when it ends
        if watch is not None:
            watch.attach(self)

    @property
    def aborted(self) -> bool:
        """The client's watch stopped this call: its failure is the watch's doing, not vLLM's."""
        return self._aborted

    @property
    def response(self) -> UpstreamResponse:
        """vLLM's answer; every Call that Exchange.call returns has one."""
        if self._response is None:
            raise RuntimeError("Call.response read before vLLM answered")
        return self._response

    def opened(self, conn):
        """Backend.request's on_open: the socket exists and nothing has been sent yet."""
        self._conn = conn
        if self._aborted:
            _cut(conn)  # the client left while it connected: the send fails, vLLM gets nothing

    def abort(self):
        """Stop vLLM's work for this call now; safe from any greenlet or thread."""
        self._aborted = True
        if self._response is not None:
            self._response.abort()
        elif self._conn is not None:
            _cut(self._conn)  # still inside Backend.request, which wakes with an error

    def read(self) -> bytes:
        """The whole body; the call is over after it, whatever happens."""
        try:
            return self.response.read()
        finally:
            self.end()

    def end(self):
        """The call is over: off the watch, then its connection back to the pool if vLLM's
        answer was read to its end, else closed, which is how vLLM learns to stop."""
        if self._watch is not None:
            self._watch.detach(self)
        if self._response is not None:
            self._response.close()
        if self.seat is not None:
            self.seat.release()


def _cut(conn):
    """Shut a connection in use by a call from any greenlet; a reader blocked on it wakes."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: the abort has nothing left to do
