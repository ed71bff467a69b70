"""Run a blocking call in the background while a stream keeps its client alive.

Used by the streaming search loops; not run on its own.
"""
from __future__ import annotations

import threading


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
