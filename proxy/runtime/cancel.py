"""How one web fetch or SearXNG call ends early: at its wall-clock deadline, or when its client leaves.

Used by proxy/backends/pages/fetcher.py and proxy/backends/search/searxng.py (the client's watch, proxy/engine/exchange.py's ClientWatch,
calls abort()); not run on its own. Socket timeouts bound each receive, not the call: a server
dripping one header byte a second stays under any of them. So a Cancel shuts down the sockets it
watches when it fires, which wakes a reader blocked in them (a greenlet under gevent, or a plain
thread) with an end of stream or an error; the caller then asks `reason` what happened.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from proxy.runtime import concurrency as runtime

TIMEOUT = "timeout"
GONE = "gone"


class Cancel:
    """A call's deadline and abort switch; abort() is safe from any greenlet, thread or loop callback."""

    def __init__(self, seconds: float | None = None):
        self.reason: str | None = None
        self._hooks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._disarm: Callable[[], None] | None = None
        if seconds is not None:
            self.arm(seconds)

    def arm(self, seconds: float) -> None:
        """Fire abort(TIMEOUT) after `seconds` (replacing an earlier deadline)."""
        self.disarm()
        self._disarm = runtime.call_later(max(0.0, seconds), lambda: self.abort(TIMEOUT))

    def disarm(self) -> None:
        """No deadline any more (the client's abort still works)."""
        if self._disarm is not None:
            self._disarm()
            self._disarm = None

    @property
    def fired(self) -> bool:
        return self.reason is not None

    def on_abort(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run hook() when the call is aborted (at once if it already was); returns the undo."""
        with self._lock:
            fired = self.reason is not None
            if not fired:
                self._hooks.append(hook)
        if fired:
            hook()

        def undo():
            with self._lock:
                if hook in self._hooks:
                    self._hooks.remove(hook)
        return undo

    def watch(self, sock) -> Callable[[], None]:
        """Shut `sock` down when the call is aborted; returns the undo."""
        return self.on_abort(lambda: _shut(sock))

    def abort(self, reason: str = GONE) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def close(self) -> None:
        """The call is over: its deadline goes, and nothing it watched is touched any more."""
        self.disarm()
        with self._lock:
            self._hooks = []


class Watch(Protocol):
    """What aborts a call when its client leaves (proxy/engine/watch.py's ClientWatch)."""

    def attach(self, call: Cancel) -> None: ...

    def detach(self, call: Cancel) -> None: ...


@contextmanager
def watched(watch: Watch | None) -> Iterator[Cancel]:
    """A Cancel for one fetch or search, on the client's watch while the call runs (aborted at once if
    the client already left), closed after it; with no watch (the development server), just a Cancel."""
    cancel = Cancel()
    if watch is not None:
        watch.attach(cancel)
    try:
        yield cancel
    finally:
        if watch is not None:
            watch.detach(cancel)
        cancel.close()


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already: the call ended on its own
