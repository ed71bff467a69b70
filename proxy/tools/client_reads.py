"""What each client's requests read and how many links they followed, over a window of time (issue 39): the memory
that makes URL provenance's link limits hold over a whole agent session and not one request. Used by
proxy/tools/provenance.py's Ledger; tested by tests/test_provenance.py.

A conversation's history does not always show what was read (chat completions keep none of the proxy's reads; a
client that compacts drops them), so the link a model followed in one request would come back in the next as a
fresh start. This remembers, per client (its key, or its address), the depth and the root of every page read and
the link fetches charged to each root and in all, for WINDOW seconds. In-process and per worker; behind this small
interface (recall, remember, charge) so a shared store can stand in for it.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW = 3600.0      # seconds a read and a charge are remembered: the README's "per hour"
MAX_CLIENTS = 4096   # least recently seen first out
MAX_URLS = 4096      # per client, oldest first out

ROOT = "root"        # charge()'s answers: the root's budget is spent,
WINDOWED = "window"  # or the client's budget for the window is


def client_of(environ: dict) -> str:
    """Who a request comes from, for the memory: its credential (hashed: the memory keeps no key), else its address
    (gunicorn's peer; forwarded headers are not trusted)."""
    credential = environ.get("HTTP_AUTHORIZATION") or environ.get("HTTP_X_API_KEY")
    if credential:
        return "key:" + hashlib.sha256(str(credential).encode()).hexdigest()[:32]
    return "addr:" + str(environ.get("REMOTE_ADDR") or "")


@dataclass
class _Client:
    urls: OrderedDict = field(default_factory=OrderedDict)      # key -> (depth, root, when)
    charges: deque = field(default_factory=deque)               # (when, root), oldest first


class ClientReads:
    """Per client: each page read's (depth, root) and the link fetches charged, for `window` seconds. Thread-safe."""

    def __init__(self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = MAX_CLIENTS, max_urls: int = MAX_URLS):
        self.window, self._clock = window, clock
        self._max_clients, self._max_urls = max_clients, max_urls
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._lock = threading.Lock()

    def _client(self, client: str, now: float) -> _Client:
        c = self._clients.get(client)
        if c is None:
            c = self._clients[client] = _Client()
            while len(self._clients) > self._max_clients:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(client)
        while c.charges and c.charges[0][0] <= now - self.window:
            c.charges.popleft()
        return c

    def recall(self, client: str, url_key: str) -> tuple[int, str] | None:
        """(depth, root) of a page this client read within the window, or None."""
        now = self._clock()
        with self._lock:
            found = self._client(client, now).urls.get(url_key)
            return (found[0], found[1]) if found is not None and found[2] > now - self.window else None

    def remember(self, client: str, url_key: str, depth: int, root: str) -> None:
        """A page read at `depth` from `root`; a shallower reading already remembered stands."""
        now = self._clock()
        with self._lock:
            urls = self._client(client, now).urls
            old = urls.get(url_key)
            if old is not None and old[0] <= depth and old[2] > now - self.window:
                urls.move_to_end(url_key)
                return
            urls[url_key] = (depth, root, now)
            urls.move_to_end(url_key)
            while len(urls) > self._max_urls:
                urls.popitem(last=False)

    def charge(self, client: str, root: str, per_root: int, per_window: int) -> str | None:
        """Count one link fetch from `root`, or say which budget it would pass (ROOT, WINDOWED) and count nothing.
        Every fetch counts, a repeat too, in a later request too: how often a link is read is a signal as well as
        which, and a page's server sees each read."""
        now = self._clock()
        with self._lock:
            c = self._client(client, now)
            if len(c.charges) >= per_window:
                return WINDOWED
            if sum(1 for _, r in c.charges if r == root) >= per_root:
                return ROOT
            c.charges.append((now, root))
            return None

    def charged(self, client: str) -> int:
        """Link fetches counted for the client within the window."""
        with self._lock:
            return len(self._client(client, self._clock()).charges)
