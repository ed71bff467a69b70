"""The one place that knows how the proxy runs: under gunicorn's gevent worker (the shipped one, whose
monkey-patching makes threads greenlets and sockets cooperative) or on plain threads (the development
server, `python proxy-passthrough.py`, and unit tests). Everything that waits, times or runs work side
by side asks here; not run on its own.
"""
from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

try:  # gunicorn's gevent worker patches the socket module before it loads the app
    import gevent
    from gevent import monkey
    GEVENT = monkey.is_module_patched("socket")
except ImportError:
    GEVENT = False

try:  # gevent's select.poll waits on its hub; a zero-timeout look needs the plain system call
    from gevent.monkey import get_original
    system_poll = get_original("select", "poll")
except ImportError:
    system_poll = select.poll


def call_later(seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
    """fn() after `seconds`, off the caller; returns the cancel. Under gevent a bare loop timer (no
    greenlet per call), elsewhere a daemon timer thread."""
    if GEVENT:
        timer = gevent.get_hub().loop.timer(seconds, 0, ref=False)
        timer.start(fn)
        return timer.close
    t = threading.Timer(seconds, fn)
    t.daemon = True
    t.start()
    return t.cancel


def sleep(seconds: float) -> None:
    """Wait without holding up the worker: under gevent only this greenlet sleeps."""
    if GEVENT:
        gevent.sleep(seconds)
    else:
        time.sleep(seconds)


def on_readable(fd: int, callback: Callable[[], object]) -> Callable[[], None] | None:
    """Under gevent, callback() each time `fd` turns readable, as a bare watcher on the event loop (no
    greenlet to spawn, switch to and kill per request); returns the stop, which may be called from inside
    the callback. None on plain threads, where the caller polls in a thread of its own."""
    if not GEVENT:
        return None
    io = gevent.get_hub().loop.io(fd, 1, ref=False)
    io.start(callback)
    return io.stop


def within(seconds: float, fn: Callable[[], object]):
    """fn()'s value, or TimeoutError once `seconds` have passed. Only gevent can stop a wait from outside
    (a lookup in gevent's resolver then finishes on its own); on plain threads fn's own timeouts bound it."""
    if not GEVENT:
        return fn()
    with gevent.Timeout(seconds, False):
        return fn()
    raise TimeoutError(f"not done within {seconds:g} s")


def run_together(fn, items: list, at_most: int) -> list:
    """[fn(item) for item in items], concurrently (up to `at_most` at once) when there are several:
    each is seconds of waiting on SearXNG or a web server. Results in the items' order."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(at_most, len(items))) as pool:
        return list(pool.map(fn, items))


def run_with_keepalive(fn, interval: float, keepalive: bytes, should_stop=lambda: False):
    """Call fn() in a helper thread (a greenlet under gevent); yield `keepalive` every
    `interval` seconds until it finishes, then return its result (via StopIteration.value).

    Use as `result = yield from run_with_keepalive(...)` inside a response generator, so a
    client that hangs up meanwhile is noticed at the next keep-alive write.
    """
    box = {}
    done = threading.Event()

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the waiting generator, which re-raises it
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, daemon=True, name="search").start()
    yield keepalive
    while not done.wait(interval):
        if should_stop():
            return None
        yield keepalive
    if "error" in box:
        raise box["error"]
    return box["value"]
