"""One client request on its way through the proxy: its calls to vLLM, each abortable by a
watch on the client's socket until that call is over, and the transparent relay. Made by proxy.http.app
for every route, used by each API and proxy.engine.loop (the search loop); not run on its own.
"""
from __future__ import annotations

import logging
import select
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from flask import Response

from proxy.core import codec
from proxy.core.config import Config
from proxy.core.errors import Wire
from proxy.engine.admission import Seat, queues, vllm_path
from proxy.engine.events import BackendRetried, ClientLeft, UrlRefused
from proxy.engine.flow import ANONYMOUS, Flow, asks_to_stream, flow_of
from proxy.engine.services import Services
from proxy.runtime import concurrency as runtime
from proxy.tools.client_reads import client_of
from proxy.tools.provenance import Ledger, Rules
from proxy.tools.session import ToolSession
from proxy.transport.http1 import end_to_end_headers
from proxy.transport.vllm import UpstreamError, UpstreamResponse, gateway_status

log = logging.getLogger("proxy")

# A gateway's "my upstream is gone" answers, which vllm-router writes as plain text: 502 on the routes it passes
# through (the worker it chose refused or reset: "Backend request failed: ..."), 500 once its own retries of a chat
# or a GET are spent on a worker that is gone ("Request failed: error sending request ..."), 503 with no worker left
# for now. vLLM's own 500/502/503 (an engine error, /health while the engine is dead) are JSON or empty: those are
# vLLM's answer, relayed as they are.
GATEWAY_GONE = (500, 502, 503)


def gateway_gone(up: UpstreamResponse) -> bool:
    """A gateway in front of vLLM (not vLLM) says the worker it chose is gone. Pure."""
    return up.status in GATEWAY_GONE and up.header("content-type").lower().startswith("text/plain")


STALE = "stale"


def retry_reason(failure: UpstreamError | None, gone: int | None, tried: set[str]) -> str | None:
    """The proxy's one retry policy for a call to vLLM (the transport tries each attempt once): why the attempt that
    ended in `failure` (or in a gateway's plain-text `gone` status) goes again, or None; `tried` holds the retries
    spent ("stale", "failed"). Every retry is on a new connection. Pure.

    - "stale": a pooled keep-alive connection failed where the server cannot have acted on the request
      (UpstreamError.stale, http1.may_retry): once, quietly, since it is the pool's hazard, not vLLM's failure.
    - "unreachable": nothing of an answer came (refused, reset or closed before the head); or the gateway's status
      (vllm-router: the worker it chose is gone): once, logged and counted (BackendRetried). Nothing has reached the
      client yet, a failed attempt's generation was aborted with its connection (so the client never sees two
      answers), and behind a router the second try finds a live worker (its circuit breaker opened on the first).
    Never once the head is in: from then on the caller may have sent bytes to the client.
    """
    if failure is not None:
        if failure.stale and STALE not in tried:
            return STALE
        return "unreachable" if failure.unanswered and "failed" not in tried else None
    return str(gone) if gone is not None and "failed" not in tried else None


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

    def relay(self, body: bytes | None = None) -> Response:
        """Send this request on to vLLM unchanged (or with `body` instead of the client's) and
        its answer back unchanged."""
        return relay(self, self.body if body is None else body)

    def watch_client(self) -> ClientWatch:
        """Start watching the client for the rest of this request (stop() it at the end)."""
        self.watch = ClientWatch(self.environ, lambda aborted: self.emit(ClientLeft(aborted)))
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
        goes again as retry_reason says (the proxy's one retry policy), keeping the seat: it is the same call to the
        card, not a new arrival."""
        salt = self.flow.cache_salt
        if salt and body and method == "POST" and vllm_path(target) in SALTED:
            body = salted(body, salt)
        seat = self.queue_seat(method, target)
        if seat is not None:
            watch = self.watch
            if not seat.wait(lambda: watch is not None and watch.gone):
                raise UpstreamError("unreachable", "the client left while queued for the model")
            self.seat, self.served = None, True
        tried: set[str] = set()
        while True:
            call = Call(self.watch, seat)
            try:
                # every retry on a new connection: a pooled one may be the next stale one
                call._response = self.services.backend.request(method, target, body, headers, on_open=call.opened,
                                                               fresh=bool(tried))
            except UpstreamError as e:
                reason = None if call.aborted else retry_reason(e, None, tried)
                if reason is None:
                    call.end()
                    raise
                why = str(e)
            except BaseException:
                call.end()
                raise
            else:
                gone = call.response.status if gateway_gone(call.response) else None
                reason = None if call.aborted else retry_reason(None, gone, tried)
                if reason is None:
                    return call
                why = f"a gateway answered {gone}"
            call.seat = None  # kept for the retry
            call.end()  # a gateway's answer unread: the connection closes, and its short error body goes with it
            tried.add(STALE if reason == STALE else "failed")
            if reason != STALE:
                self._retrying(method, target, why, reason)

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
        call = self.call("POST", path, codec.dumps(payload), headers)
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


def response_headers(up: UpstreamResponse) -> list:
    """vLLM's response headers as the client should get them: end to end only, and no
    Content-Length, which whoever writes the body next computes."""
    return [(n, v) for n, v in end_to_end_headers(up.headers) if n.lower() != "content-length"]


# ---- the transparent relay ------------------------------------------------------------------------

def relay(ex: Exchange, body: bytes) -> Response:
    """Send the request on unchanged and the answer back unchanged, streaming if it streams."""
    method, wire = ex.flow.method, ex.flow.wire
    watch = ex.watch_client()
    seat = ex.queue_seat(method, ex.target)
    if seat is not None and not seat.ready() and streams(ex.flow, body):
        return Response(_queued_stream(ex, body, method, seat, watch), status=200, headers=QUEUED_HEADERS,
                        direct_passthrough=True)
    send_body = body if body or method in ("POST", "PUT", "PATCH") else None
    try:
        call = ex.call(method, ex.target, send_body, ex.headers)
    except UpstreamError as e:
        watch.stop()
        if watch.gone:
            # Not vLLM's failure: the watch cut the connection for a client that left.
            return wire.error(499, "client closed the request")
        return gateway_error(e, method, ex.target, wire)
    up = call.response
    headers = proxied_location(response_headers(up), ex.cfg.backend_url)
    if up.header("content-length") and not up.is_event_stream:
        try:
            data = call.read()
        except UpstreamError as e:
            if watch.gone:
                return wire.error(499, "client closed the request")
            return gateway_error(e, method, ex.target, wire)
        finally:
            watch.stop()
        # vLLM writes its errors in OpenAI's shape (or FastAPI's {"detail": ...}) on every path; a route whose clients
        # parse another shape (Anthropic's) gets it in theirs, whoever wrote the error. The status is vLLM's.
        rewritten = wire.upstream_error(up.status, data) if up.status >= 400 and method != "HEAD" else None
        if rewritten is not None:
            data = rewritten
            headers = [(n, v) for n, v in headers if n.lower() != "content-type"] + [("Content-Type", "application/json")]
        resp = Response(data, status=up.status, headers=headers)
        if method == "HEAD":
            # No body follows a HEAD answer, so vLLM's Content-Length (the GET's) is the one.
            resp.headers["Content-Length"] = str(up.content_length)
        return _without_default_type(resp, up)

    def stream():
        # Bytes go out exactly as they came in.
        try:
            yield from up.iter_raw()
        except UpstreamError as e:
            if watch.gone:
                return
            # The client must see a broken body, not a clean end that looks complete: cut
            # its connection before the final chunk (gunicorn then ignores the EPIPE quietly,
            # where a raised error would log a traceback for vLLM's failure).
            log.warning("%s %s: %s", method, ex.target.split("?", 1)[0], gateway_status(e)[1])
            client = ex.environ.get("gunicorn.socket")
            if client is None:
                raise
            client.shutdown(socket.SHUT_RDWR)
        finally:
            watch.stop()
            call.end()
    return _without_default_type(Response(stream(), status=up.status, headers=headers, direct_passthrough=True), up)


def proxied_location(headers: list, backend_url: str) -> list:
    """vLLM's headers with a redirect to its own address made relative. Pure.

    vLLM (Starlette) answers `POST /v1/messages/` with a 307 to `/v1/messages`, as an absolute URL built from the Host
    the proxy sent, which is vLLM's own address: a client following it would leave the proxy for an address it
    cannot reach (or that has no web tools). Relative, it comes back here."""
    origin = urllib.parse.urlsplit(backend_url)
    out = []
    for name, value in headers:
        if name.lower() == "location":
            there = urllib.parse.urlsplit(value)
            if there.netloc and (there.scheme, there.netloc) == (origin.scheme, origin.netloc):
                value = urllib.parse.urlunsplit(("", "", there.path or "/", there.query, there.fragment))
        out.append((name, value))
    return out


QUEUED_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]


def streams(flow: Flow, body: bytes) -> bool:
    """Whether a relayed request asks for an event stream: the flag its API's handler set when it parsed the body,
    else (a path no API claims, whose body nothing else reads) the body read here, once."""
    if flow.stream is None:
        try:
            flow.stream = b'"stream"' in body and asks_to_stream(codec.loads(body))
        except (ValueError, UnicodeDecodeError, RecursionError):
            flow.stream = False
    return flow.stream


def _queued_stream(ex: Exchange, body: bytes, method: str, seat: Seat, watch: ClientWatch):
    """A relayed stream that must wait for a seat in the fair queue: its head goes out at once and the API's
    keep-alives while it waits (Anthropic's ping events on /v1/messages, an SSE comment elsewhere), so no client
    times out on a silent connection; then vLLM's stream byte for byte, or its refusal as the stream's error event.
    The head is the price: the status is 200 before vLLM has answered, as in the search loop's streams."""
    wire = ex.flow.wire
    try:
        if not (yield from seat.waiting(lambda: watch.gone, ex.cfg.keepalive_interval, wire.keepalive)):
            return
        try:
            call = ex.call(method, ex.target, body, ex.headers)
        except UpstreamError as e:
            if not watch.gone:
                yield wire.stream_error(*gateway_status(e))
            return
        try:
            up = call.response
            if up.status != 200 or not up.is_event_stream:
                yield wire.stream_error(up.status if up.status != 200 else 502, "", call.read())
                return
            yield from up.iter_raw()  # from here on, exactly vLLM's bytes
        except UpstreamError as e:
            if not watch.gone:
                # As relay's stream: the client must see a broken body, not a clean end that looks complete.
                log.warning("%s %s: %s", method, ex.target.split("?", 1)[0], gateway_status(e)[1])
                client = ex.environ.get("gunicorn.socket")
                if client is not None:
                    client.shutdown(socket.SHUT_RDWR)
        finally:
            call.end()
    finally:
        seat.release()
        watch.stop()


def _without_default_type(resp: Response, up) -> Response:
    """Flask gives every response a Content-Type; a relayed one has vLLM's or none at all."""
    if not up.header("content-type"):
        del resp.headers["Content-Type"]
    return resp


def gateway_error(e: UpstreamError, method: str, target: str, wire: Wire) -> Response:
    status, msg = gateway_status(e)
    log.warning("%s %s: %s", method, target.split("?", 1)[0], msg)
    return wire.error(status, msg)
