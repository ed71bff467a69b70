"""One client request on its way through the proxy, as each API and the search loop (proxy/engine/loop.py) use it:
its flow (proxy/engine/flow.py), its ToolSession and URL ledger, its seat in the fair queue for each generation call,
and its calls to vLLM, each on the client's watch (proxy/engine/watch.py) and tried again as the one retry policy
says (proxy/engine/retry.py); the byte-for-byte relay is proxy/engine/relay.py's. Made by proxy.http.app for every
route; not run on its own.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from flask import Response

from proxy.core import codec
from proxy.core.config import Config
from proxy.engine.admission import Seat, queues, vllm_path
from proxy.engine.events import BackendRetried, ClientLeft, UrlRefused
from proxy.engine.flow import ANONYMOUS, Flow, flow_of
from proxy.engine.relay import relay
from proxy.engine.relay import response_headers as response_headers  # the APIs' and the loop's, through this façade
from proxy.engine.retry import send
from proxy.engine.services import Services
from proxy.engine.watch import Call, ClientWatch
from proxy.tools.client_reads import client_of
from proxy.tools.provenance import Ledger, Rules
from proxy.tools.session import ToolSession
from proxy.transport.vllm import UpstreamError as UpstreamError  # the APIs reach the transport through the engine
from proxy.transport.vllm import gateway_status as gateway_status

log = logging.getLogger("proxy")


@dataclass
class Exchange:
    """One client request: what it sent, as vLLM should get it, and the way to call vLLM for it."""

    services: Services               # what the worker's requests share (proxy/engine/services.py)
    body: bytes                      # the client's body, as sent
    headers: list                    # the client's headers as vLLM should see them
    target: str                      # path and query string, as sent
    environ: dict                    # WSGI's: read for the client's socket, address and credential, never written
    watch: ClientWatch | None = None
    ledger: Ledger | None = None     # the URLs its fetches may read, from the client's body (each API's handler)
    seat: Seat | None = None         # its ticket in the fair queue for the next call, taken ahead by the loop
    served: bool = False             # a generation call of this request has run: later ones are resumed turns
    flow: Flow = field(init=False)   # the request's flow (proxy/engine/flow.py), which the edge made

    def __post_init__(self):
        self.flow = flow_of(self.environ)

    @property
    def cfg(self) -> Config:
        return self.services.cfg

    def json(self):
        """The client's body decoded, once for every reader of this request; raises as codec.loads does."""
        if self.flow.body is None:
            self.flow.body = codec.Decoded(self.body)
        return self.flow.body.value()

    def relay(self, body: bytes | None = None) -> Response:
        """Send this request on to vLLM unchanged (or with `body` instead of the client's) and
        its answer back unchanged (proxy/engine/relay.py)."""
        return relay(self, self.body if body is None else body)

    def watch_client(self) -> ClientWatch:
        """Start watching the client for the rest of this request (stop() it at the end)."""
        # The callback holds the hub and the flow, not this Exchange: the Exchange holds the watch, and a cycle through
        # it would keep the request's body and its decoded history (megabytes, tens of thousands of objects) alive
        # until the garbage collector's next full pass, which then walks them all (docs/performance.md).
        events, flow = self.services.events, self.flow
        self.watch = ClientWatch(self.environ, lambda aborted: events.emit(flow, ClientLeft(aborted)))
        return self.watch

    def emit(self, event) -> None:
        """Tell the worker's observers (proxy/engine/events.py) what happened to this request."""
        self.services.events.emit(self.flow, event)

    def new_ledger(self, parts) -> Ledger:
        """The ledger of the URLs this request may read, from its conversation's parts, on its client's memory."""
        return Ledger(Rules.of(self.cfg), parts, self.services.reads, client_of(self.environ))

    def session(self, max_pages: int | None = None) -> ToolSession:
        """The request's ToolSession, its page caps WEB_FETCH_MAX_PER_TURN and _PER_REQUEST unless `max_pages`
        gives one for both (Codex's alpha search: ALPHA_SEARCH_MAX_PAGES)."""
        cfg = self.cfg
        per_turn, per_request = ((cfg.web_fetch_max_per_turn, cfg.web_fetch_max_per_request) if max_pages is None
                                 else (max_pages, max_pages))
        # The watch starts after the dialect made its session (loop.run), so the session asks for it per call.
        # No ledger (a handler that gathered nothing) fetches nothing but search results: it fails closed.
        # With people's keys, each searches and reads through caches of their own (Backends.scoped): a shared hit
        # would tell one person what another searched or read, and when.
        name = self.flow.key_name
        backends = self.services.tool_backends.scoped("" if name == ANONYMOUS else name)
        return ToolSession(backends, cfg.max_search_iter, per_turn, per_request,
                           watch=lambda: self.watch,
                           ledger=self.ledger if self.ledger is not None else self.new_ledger([]),
                           on_refused=lambda reason: self.emit(UrlRefused(reason)))

    def queue_seat(self, method: str = "POST", target: str | None = None) -> Seat | None:
        """This request's ticket for its next call to vLLM (taken now if it has none), or None when the call does
        not queue: no fair queue, or not a generation call (admission.queues)."""
        queue = self.services.queue
        if queue is None or not queues(method, self.target if target is None else target):
            return None
        if self.seat is None or self.seat.released:
            self.seat = queue.take(self.flow, resumed=self.served)
        return self.seat

    def call(self, method: str, target: str, body: bytes | None, headers: list) -> Call:
        """Send one request to vLLM and wait for its head, the watch able to abort it
        throughout; raises UpstreamError. The caller ends the call when it is done with it.
        A generation call waits for its seat in the fair queue first (here, blocking, unless the loop waited
        with a stream's keep-alives already); a client that leaves meanwhile gives up its place. A failed attempt
        goes again as the proxy's one retry policy says (proxy/engine/retry.py's send)."""
        salt = self.flow.cache_salt
        if salt and body and method == "POST" and vllm_path(target) in SALTED:
            body = salted(body, salt)
        seat = self.queue_seat(method, target)
        if seat is not None:
            watch = self.watch
            if not seat.wait(lambda: watch is not None and watch.gone):
                raise UpstreamError("unreachable", "the client left while queued for the model")
            self.seat, self.served = None, True
        return send(self.services.backend, method, target, body, headers, self.watch, seat,
                    lambda why, reason: self._retrying(method, target, why, reason))

    def _retrying(self, method: str, target: str, why: str, reason: str) -> None:
        log.warning("%s %s: %s; trying once more", method, target.split("?", 1)[0], why)
        self.emit(BackendRetried(reason))

    def post(self, path: str, payload: dict) -> Call:
        """POST a JSON body to vLLM for one turn of the search loop."""
        headers = [(n, v) for n, v in self.headers if n.lower() not in ("content-type", "accept-encoding")]
        # The loop reads every turn itself (JSON, or SSE frames it relays whole), so it asks for the body as it
        # is: the client's Accept-Encoding would let a compressing gateway in front of vLLM send gzip the loop
        # cannot parse. What the client gets is written by the proxy, uncompressed, as vLLM's own answers are.
        headers += [("Content-Type", "application/json"), ("Accept-Encoding", "identity")]
        # The first turn's body is mostly the client's (its history, as sent): written over the client's bytes.
        call = self.call("POST", path, codec.encoded_over(payload, self.flow.body), headers)
        try:
            # A gateway may compress all the same: undone within the body limit, so the loop still reads JSON and SSE.
            call.response.decode_content(self.cfg.max_body_bytes)
        except BaseException:
            call.end()
            raise
        return call


# vLLM 0.32's APIs that take a cache_salt (ChatCompletionRequest, CompletionRequest, ResponsesRequest, and its
# Anthropic Messages request); count_tokens and tokenize keep nothing in the cache.
SALTED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})


def salted(body: bytes, salt: str) -> bytes:
    """A JSON object's body with `"cache_salt": salt` as its last member, every byte before it as sent: a relay
    stays the client's request, and the salt wins over one the client sent (the last of duplicate keys is the one
    vLLM's JSON parser keeps), so nobody picks another's salt. Anything but an object goes as it is. Pure."""
    text = body.strip()
    if not (text.startswith(b"{") and text.endswith(b"}")):
        return body
    inner = text[:-1].rstrip()
    return inner + (b"" if inner == b"{" else b",") + b'"cache_salt":"' + salt.encode() + b'"}'
