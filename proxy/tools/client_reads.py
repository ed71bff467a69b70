"""What each client's requests read and how many links they followed, over a window of time (issue 39): the memory
that makes URL provenance's link limits hold over a whole agent session and not one request. Used by
proxy/tools/provenance.py's Ledger; tested by tests/test_provenance.py.

A conversation's history does not always show what was read (chat completions keep none of the proxy's reads; a
client that compacts drops them), so the link a model followed in one request would come back in the next as a
fresh start. This remembers, per client (its key, or its address), the depth and the root of every page read, the
links each page read showed (so a later request that has the page from its history, or Codex's next web.run call,
reads on from it wherever it is served), and the link fetches charged to each root and in all, for WINDOW seconds.
Two implementations of one small interface (Reads: recall, remember, charge, links): ClientReads in this process,
per worker (STATE_URL empty, as it always was), and SharedReads in the shared state store (STATE_URL, proxy/backends/state/state.py), so that the hourly budget holds across
every worker and replica instead of multiplying by them. Picked in proxy/http/wiring.py.

The store down (StateDown): a link fetch is refused (DOWN: the budget is an exfiltration bound, and a bound nobody
can count is no bound; LiteLLM's silent fall back to per-pod limits is what issue 42 says not to repeat), while URLs
the user, a tool or a search gave are still read, at depth 0 (recall answers "not known"). A page an earlier request
read comes back at the link depth limit when not known (provenance.py), a link fetch, so it is refused too. What
remember could not write is lost; it matters only for link reads, which are refused while the store is down. Every
call that got no answer is counted by the store (proxy_state_errors{use="reads"|"link_charges"|"page_links"}).
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from proxy.backends.state.state import State, StateDown

WINDOW = 3600.0      # seconds a read and a charge are remembered: docs/web-tools.md's "per hour"
MAX_CLIENTS = 4096   # least recently seen first out
MAX_URLS = 4096      # per client, oldest first out

ROOT = "root"        # charge()'s answers: the root's budget is spent,
WINDOWED = "window"  # or the client's budget for the window is,
DOWN = "down"        # or the shared store could not count it (SharedReads only)

READS_USE = "reads"            # the state store's names for a client's pages read (depth, root) ...
CHARGES_USE = "link_charges"   # ... and its link charges, one map per client ...
LINKS_USE = "page_links"       # ... and the links each page read showed it
# The links kept of one page: the first ones, up to this many characters in all (a page of a thousand links keeps
# most of them; the store's value limit is never reached).
MAX_LINK_CHARS = 256 * 1024
STEPS = 6                      # SharedReads counts charges in WINDOW/STEPS buckets (ten minutes)


def client_of(environ: dict) -> str:
    """Who a request comes from, for the memory: its credential (hashed: the memory keeps no key), else its address
    (gunicorn's peer; forwarded headers are not trusted)."""
    credential = environ.get("HTTP_AUTHORIZATION") or environ.get("HTTP_X_API_KEY")
    if credential:
        return "key:" + hashlib.sha256(str(credential).encode()).hexdigest()[:32]
    return "addr:" + str(environ.get("REMOTE_ADDR") or "")


class Reads(Protocol):
    """A client's pages read and link charges over the window (ClientReads, SharedReads)."""

    def recall(self, client: str, url_key: str) -> tuple[int, str] | None: ...

    def remember(self, client: str, url_key: str, depth: int, root: str) -> None: ...

    def charge(self, client: str, root: str, per_root: int, per_window: int) -> str | None: ...

    def charged(self, client: str) -> int: ...

    def remember_links(self, client: str, url_key: str, links: list[str]) -> None: ...

    def links(self, client: str, url_key: str) -> list[str]: ...


def kept_links(links: list[str]) -> list[str]:
    """The links of a page that are kept: the first ones within MAX_LINK_CHARS. Pure."""
    out, used = [], 0
    for link in dict.fromkeys(links):
        used += len(link)
        if used > MAX_LINK_CHARS:
            break
        out.append(link)
    return out


@dataclass
class _Client:
    urls: OrderedDict = field(default_factory=OrderedDict)      # key -> (depth, root, when)
    charges: deque = field(default_factory=deque)               # (when, root), oldest first
    links: OrderedDict = field(default_factory=OrderedDict)     # key -> (the page's links, when)


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

    def remember_links(self, client: str, url_key: str, links: list[str]) -> None:
        """The links a page read showed the model, for a later request of the client that reads on from it."""
        now = self._clock()
        with self._lock:
            kept = self._client(client, now).links
            kept[url_key] = (tuple(kept_links(links)), now)
            kept.move_to_end(url_key)
            while len(kept) > self._max_urls:
                kept.popitem(last=False)

    def links(self, client: str, url_key: str) -> list[str]:
        """The links remembered of a page this client read within the window ([] when none)."""
        now = self._clock()
        with self._lock:
            found = self._client(client, now).links.get(url_key)
            return list(found[0]) if found is not None and found[1] > now - self.window else []


class SharedReads:
    """ClientReads in the shared state store: every worker and replica on one STATE_URL counts one budget per client.

    A page read is one value (use "reads", key client + URL, TTL the window). The charges are one map per client
    (use "link_charges"), counted in buckets of WINDOW/STEPS seconds of wall time (the replicas' common clock):
    field "a:<bucket>" counts all link fetches, "r:<bucket>:<root digest>" those from one root. A fetch is charged
    with the store's atomic count and then judged on what count returned plus the closed buckets before it, which
    no one writes any more: two replicas asking for the last read at once get 1 and 2 back, and only one reads. The
    budget is summed over the current bucket and the STEPS before it, so any hour holds at most per_window charges
    and a charge is forgotten 60 to 70 minutes after it was made. Bounded: fields of older buckets are dropped as
    they are seen, a new root's field is made only while the budgets are not spent, and every key has a TTL."""

    def __init__(self, state: State, window: float = WINDOW, wall: Callable[[], float] = time.time):
        self.state, self.window, self._wall = state, window, wall
        self.step = window / STEPS

    def recall(self, client: str, url_key: str) -> tuple[int, str] | None:
        try:
            found = self.state.get(READS_USE, client + "\n" + url_key)
        except StateDown:
            return None  # not known: a given URL reads at depth 0, an earlier read at the depth limit (see above)
        value = found.value if found is not None else None
        if (isinstance(value, list) and len(value) == 2 and type(value[0]) is int and value[0] >= 0
                and isinstance(value[1], str)):
            return value[0], value[1]
        return None  # absent, or not what remember writes (the store counted a bad value as "decode" if it was)

    def remember(self, client: str, url_key: str, depth: int, root: str) -> None:
        old = self.recall(client, url_key)
        if old is not None and old[0] <= depth:
            return
        try:
            self.state.put(READS_USE, client + "\n" + url_key, [depth, root], self.window)
        except StateDown:
            pass  # counted by the store; only link reads needed it, and they are refused while it is down

    def _tally(self, client: str, now: int) -> tuple[dict[str, int], list[str]]:
        """This client's live buckets' counts by field, and the fields of buckets past the window."""
        live: dict[str, int] = {}
        old: list[str] = []
        for name, value in self.state.fields(CHARGES_USE, client).items():
            head, _, rest = name.partition(":")
            bucket = rest.partition(":")[0]
            if head not in ("a", "r") or not bucket.isdigit():
                old.append(name)  # not a field this writes: dropped, never counted
            elif int(bucket) < now - STEPS:
                old.append(name)
            else:
                # A count that is not digits was not written by count(): taken as spent, the safe side.
                live[name] = int(value) if value.isdigit() else 1 << 30
        return live, old

    def charge(self, client: str, root: str, per_root: int, per_window: int) -> str | None:
        now = int(self._wall() // self.step)
        root_field = f"r:{now}:" + hashlib.sha256(root.encode("utf-8", "surrogatepass")).hexdigest()[:24]
        all_field = f"a:{now}"
        ttl = self.window + self.step
        try:
            live, old = self._tally(client, now)
            if old:
                self.state.drop_fields(CHARGES_USE, client, old)
            spent = sum(n for f, n in live.items() if f.startswith("a:"))
            on_root = sum(n for f, n in live.items() if f.startswith("r:") and f.endswith(root_field[-24:]))
            if spent >= per_window:
                return WINDOWED
            if on_root >= per_root:
                return ROOT
            # The atomic part: what count returns is this fetch's place in the current bucket.
            if on_root - live.get(root_field, 0) + self.state.count(CHARGES_USE, client, root_field, ttl) > per_root:
                return ROOT
            if spent - live.get(all_field, 0) + self.state.count(CHARGES_USE, client, all_field, ttl) > per_window:
                return WINDOWED
            return None
        except StateDown:
            return DOWN

    def charged(self, client: str) -> int:
        try:
            live, _ = self._tally(client, int(self._wall() // self.step))
        except StateDown:
            return 0
        return sum(n for f, n in live.items() if f.startswith("a:"))

    def remember_links(self, client: str, url_key: str, links: list[str]) -> None:
        try:
            self.state.put(LINKS_USE, client + "\n" + url_key, kept_links(links), self.window)
        except StateDown:
            pass  # counted by the store; a later request reads on from the page only once it is read again

    def links(self, client: str, url_key: str) -> list[str]:
        try:
            found = self.state.get(LINKS_USE, client + "\n" + url_key)
        except StateDown:
            return []
        value = found.value if found is not None else None
        # Only what remember_links writes: a list of strings (a shared store is hostile too).
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
