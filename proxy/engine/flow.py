"""One request's flow: everything the proxy knows of a request while it runs, in one typed object. The WSGI edge
(proxy/http/flow.py's RequestFlow) builds it once, before any route, and is the only writer of the environ (one key,
FLOW); from then on every layer reads and writes the flow's fields: the key check (proxy/http/team.py) its key name,
cache salt and admission, the fair queue its seconds queued, each API's handler the stream flag it parsed, the event
hub its tally, the edge the usage read off the answer; and every observer of the request's events gets it with the
event (proxy/engine/events.py). Not run on its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from proxy.backends.state.teamstore import Admitted
from proxy.core import codec, routes
from proxy.core.errors import Wire
from proxy.engine.events import ClientLeft, RoundDone, UrlRefused
from proxy.tools import registry
from proxy.tools.base import PAGE

FLOW = "proxy.flow"  # the environ's one key of the proxy's, written by the edge alone
ANONYMOUS = "-"      # the key name of every request of a proxy without keys: one key, so first come first served


class UsageReader(Protocol):
    """What reads a model answer's usage as it leaves (proxy/observe/usage.py's UsageScan, a layer above)."""
    stream: bool
    usage_seen: bool
    text_events: int

    def headers(self, headers: list[tuple[str, str]]) -> None: ...

    def feed(self, chunk: bytes) -> None: ...

    def result(self) -> dict[str, int]: ...

    def streamed_tokens(self) -> int: ...


@dataclass
class Tally:
    """What the request's events added up to so far: one count for every reader (the access log's searches, a key's
    searches, page reads and refused fetches, the metrics' disconnects)."""
    searches: int = 0          # searches its rounds sent out (not answered from the request's memory)
    page_reads: int = 0        # pages its rounds read
    refused_fetches: int = 0   # page reads URL provenance refused
    client_left: bool = False  # its client watch saw the client go

    def saw(self, event: object) -> None:
        if isinstance(event, RoundDone):
            self.searches += event.searches
            self.page_reads += sum(1 for o in event.outcomes if registry.tool(o.tool).kind == PAGE and o.status == "ok")
        elif isinstance(event, UrlRefused):
            self.refused_fetches += 1
        elif isinstance(event, ClientLeft):
            self.client_left = True

    def figures(self) -> dict[str, int]:
        """The counts a key's day adds up (proxy/http/team.py)."""
        return {"searches": self.searches, "page_reads": self.page_reads, "refused_fetches": self.refused_fetches}


@dataclass(eq=False)
class Flow:
    """One request, from the edge to its last body byte."""
    method: str
    path: str                            # the whole path (proxy/http/app.py's WholePath has folded SCRIPT_NAME in)
    route: routes.Route                  # the route the path falls under, found once at the edge
    wire: Wire                           # its route's wire: how its clients are told errors (proxy/apis/wires.py)
    key_name: str = ANONYMOUS            # whose key (proxy/http/team.py); ANONYMOUS without keys
    cache_salt: str | None = None        # the key's prefix-cache salt, with a keys file: every generation call carries it
    admitted: Admitted | None = None     # its row among the requests in flight: set when its usage counts against its key
    queued: float | None = None          # seconds it waited for seats over all its calls; None when it never queued
    tally: Tally = field(default_factory=Tally)
    scan: UsageReader | None = None      # reads a model answer's usage as it leaves (the edge's, for the metrics and the key)
    usage_unseen: dict | None = None     # a stream's usage the client did not ask to see, kept for its key's tokens per day
    body_bytes: int = 0                  # the size of its body: a stream whose usage never comes is charged its prompt by it
    stream: bool | None = None           # its body's `"stream": true`, set where the body was parsed; None until then
    # Its body and the body's JSON, decoded at most once for every reader (the session key, the API's handler). Held
    # here, to the request's end, so the history's tens of thousands of objects are freed after the answer has gone
    # out rather than between vLLM's answer and the client's (docs/performance.md, "Freed after the answer").
    body: codec.Decoded | None = None

    @property
    def metered(self) -> bool:
        """Its usage counts against its key (a keys-file key's POST, admitted)."""
        return self.admitted is not None

    def saw(self, event: object) -> None:
        """An event of this request (the hub tells every one)."""
        self.tally.saw(event)

    def owned(self, ident: str) -> str:
        """An id a client chose (a Codex thread id, a Responses ws_ id) as the proxy keeps what it names: under the
        request's key name, so a member who learns or guesses another's id opens nothing of theirs (key names never
        hold ':'). "" stays "" (no id: nothing kept). Pure."""
        return f"{self.key_name}:{ident}" if ident else ""


def flow_of(environ: dict) -> Flow:
    """The request's flow, which the edge put in its environ before anything else ran."""
    return environ[FLOW]


def asks_to_stream(body: object) -> bool:
    """Whether a parsed request body asks for an event stream (`"stream": true`). Pure."""
    return isinstance(body, dict) and body.get("stream") is True
