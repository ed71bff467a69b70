"""The server-side tool loop, written once for every API, plain and streamed: each API's
handler builds a dialect (proxy.apis.chat.handler, proxy.apis.messages.handler, proxy.apis.responses.handler) and calls run().

The loop: vLLM answers a turn; when the turn calls the proxy's own tools (proxy/tools/: searches, page reads), the
round's calls run in the request's ToolSession (a stream kept alive meanwhile), their results go into the
conversation and vLLM is asked again, on a seat taken again in the fair queue when there is one
(engine/admission.py); the first turn that calls none of them is the client's answer, and MAX_SEARCH_ITER
rounds end it with an error that names the limit. Every call to vLLM is on the client's
watch while it lasts, so a client that leaves stops vLLM's work at once, and no turn starts
for a client that has gone.

The dialect frames everything the client sees: its steps give what the client gets (a
stream's event bytes; for a plain request, its one Response at the end), the reading and
finishing steps as generators, and the loop passes it on untouched.
"""
from __future__ import annotations

import logging
from collections.abc import Generator, Iterable
from typing import Any, Protocol, cast

from flask import Response

from proxy.core import codec
from proxy.core.codec import comment
from proxy.engine.events import CapHit, RoundDone
from proxy.engine.exchange import Exchange, response_headers
from proxy.engine.watch import Call, ClientWatch
from proxy.runtime.concurrency import run_with_keepalive
from proxy.tools.base import Request
from proxy.tools.session import ToolSession
from proxy.tools.sources import Sources
from proxy.transport.vllm import UpstreamError, UpstreamResponse, gateway_status

log = logging.getLogger("proxy")

CAP_TYPE = "search_iterations_exceeded"  # the error type (OpenAI) or code (Responses) of the cap
CLIENT_CLOSED = "client closed the request"
# A stream's head when it starts before vLLM answers (while it waits in the fair queue).
SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]


class Dialect(Protocol):
    """What one API supplies to the loop: one object per client request, holding that request's state (the
    conversation so far, usage, what the client has been shown). The loop owns the flow and calls these; an
    API's plain and streamed dialects are two small classes over one shared base of its own (each API's
    handler.py under proxy/apis/), never subclasses of the loop's.
    """

    name: str                    # what log lines call this loop
    path: str                    # where every turn is POSTed
    stream: bool
    first_turn: Any              # a turn the proxy made itself, in place of vLLM's first (or None)
    headers: list                # a stream's headers when no vLLM turn opened it
    session: ToolSession         # rounds, repeats, the cap (Exchange.session())
    request: dict                # the next request to send: the first, then each next one
    sources: Sources | None      # the request's numbered sources (proxy/tools/sources.py); None with CITATIONS=off

    def own_calls(self, turn) -> list:
        """The turn's calls of the proxy's own tools; none means the turn is the answer."""

    def requests(self, calls: list) -> list[Request]:
        """Each call parsed, once per round, as the session runs it (registry.parse, with the client's limits)."""

    def run_tools(self, calls: list, requests: list[Request]) -> list:
        """Run one round on self.session (blocking; the calls of one round run together)."""

    def error_reply(self, status: int, message: str, type_: str | None = None) -> Response:
        """The proxy's own error as a whole HTTP answer, in the API's shape."""

    def error(self, status: int, message: str, type_: str | None = None) -> Any:
        """The proxy's error as the last thing the client gets: a Response, or a stream's last events."""

    def finish(self, turn) -> Iterable:
        """The client's answer, from the last turn."""

    def announce(self, calls: list) -> Iterable:
        """The round's calls shown starting (nothing, for a plain request)."""

    def record(self, turn, calls: list, outcomes: list) -> Iterable:
        """The round's results shown, and added to self.request for the next turn."""

    def vllm_reply(self, up: UpstreamResponse, raw: bytes) -> Response:
        """vLLM's own answer (an error on a plain turn, or a first turn it did not stream) as the client's HTTP
        answer; usually vllm_answer."""


class PlainDialect(Dialect, Protocol):
    """A request answered with one JSON body: turns are read whole, and errors are HTTP answers."""

    def parse(self, up: UpstreamResponse, raw: bytes, data: dict) -> Any:
        """The turn in vLLM's JSON object, or a Response to end with when it is not one."""


class StreamDialect(Dialect, Protocol):
    """A request answered with one event stream over every turn: vLLM's events relayed as they come,
    searches shown while they run, errors as the stream's last events."""

    def stream_turn(self, up: UpstreamResponse) -> Generator[bytes, None, Any]:
        """Relay one turn's events, returning the turn gathered (None once what ends the loop was yielded)."""

    def refused(self, status: int, raw: bytes) -> bytes:
        """A later turn that vLLM answered with an error (or without a stream), as the stream's end."""

    def keepalive(self, requests: list[Request]) -> bytes:
        """What keeps the client's idle timeouts away while a round runs; usually searching_comment."""


AnyDialect = PlainDialect | StreamDialect


def sources_for(ex: Exchange) -> Sources | None:
    """A request's numbered sources, or None when CITATIONS is off."""
    return Sources() if ex.cfg.citations else None


def vllm_answer(up: UpstreamResponse, raw: bytes) -> Response:
    """vLLM's own answer, sent on as the client's HTTP answer (its errors, on any plain turn)."""
    return Response(raw, status=up.status, headers=response_headers(up))


def searching_comment(shown: list[str]) -> bytes:
    """A stream's keep-alive while a round runs: an SSE comment naming what is being looked up (with nothing
    to name, the wait for a seat in the fair queue)."""
    if not any(shown):
        return comment("queued for the model")
    return comment("searching " + ", ".join(repr(q) for q in shown if q))


def _read(d: AnyDialect, call: Call):
    """A generator: what the client gets of one turn, returning the turn (None once what ends the loop was
    yielded)."""
    if d.stream:
        return (yield from _read_stream(cast(StreamDialect, d), call))
    return (yield from _read_plain(cast(PlainDialect, d), call))


def _read_plain(d: PlainDialect, call: Call):
    """One turn from vLLM's whole body."""
    raw = call.read()
    up = call.response
    if up.status != 200:
        yield d.vllm_reply(up, raw)  # vLLM's own error, on any turn, as vLLM wrote it
        return None
    try:
        data = codec.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        log.warning("%s turn %d: vLLM answered 200 with a body that is not a JSON object", d.name, d.session.rounds + 1)
        yield d.error(502, "vLLM answered 200 with a body that is not a JSON object.")
        return None
    turn = d.parse(up, raw, data)
    if isinstance(turn, Response):
        yield turn
        return None
    return turn


def _read_stream(d: StreamDialect, call: Call):
    """Relay one turn's events, gathering the turn."""
    up = call.response
    if not streaming(up):
        yield d.refused(up.status, call.read())
        return None
    return (yield from d.stream_turn(up))


def streaming(up: UpstreamResponse) -> bool:
    return up.status == 200 and up.is_event_stream


def run(ex: Exchange, d: AnyDialect) -> Response:
    """Serve one searching request the dialect's way: a plain Response, or a streamed one."""
    watch = ex.watch_client()
    if not d.stream:
        rounds = _rounds(ex, d, None, watch)
        try:
            answer = next(rounds, None)
        finally:
            rounds.close()  # the loop's own cleanup: every call it made is ended
            watch.stop()
        return answer if answer is not None else d.error(499, CLIENT_CLOSED)
    call, headers = None, d.headers
    seat = ex.queue_seat("POST", d.path) if d.first_turn is None else None
    if seat is not None and not seat.ready():
        # Queued behind other people's requests: the stream starts now and carries keep-alives while it waits
        # (_rounds), so no client or gateway times out on a silent connection; vLLM's answer to the first turn then
        # arrives inside the stream, a refusal as the dialect's error events.
        return Response(_streamed(ex, d, None, watch), status=200, headers=headers or SSE_HEADERS,
                        direct_passthrough=True)
    if d.first_turn is None:
        # The first turn opens before the client's answer does: until vLLM streams, its
        # status and body are still the client's to get.
        opened = _open_first_turn(ex, d, watch)
        if isinstance(opened, Response):
            watch.stop()
            return opened
        call = opened
        headers = response_headers(call.response)
    return Response(_streamed(ex, d, call, watch), status=200, headers=headers, direct_passthrough=True)


def _open_first_turn(ex: Exchange, d: AnyDialect, watch: ClientWatch) -> Call | Response:
    """The first turn's call once vLLM streams it, or the whole answer when vLLM did not."""
    try:
        call = ex.post(d.path, d.request)
        return call if streaming(call.response) else d.vllm_reply(call.response, call.read())
    except UpstreamError as e:
        return d.error_reply(499, CLIENT_CLOSED) if watch.gone else _gateway_error(d, e, d.error_reply)


def _streamed(ex: Exchange, d: AnyDialect, call, watch: ClientWatch):
    try:
        yield from _rounds(ex, d, call, watch)
    finally:
        watch.stop()


def _rounds(ex: Exchange, d: AnyDialect, call, watch: ClientWatch):
    """The loop itself; yields what the client gets. `call` is the first turn when already open."""
    session = d.session
    turn = d.first_turn
    try:
        while True:
            if turn is None:
                if call is None:
                    if d.stream:
                        yield from _wait_for_seat(ex, cast(StreamDialect, d), watch)
                    if watch.gone:
                        return  # no turn starts for a client that has gone
                    call = ex.post(d.path, d.request)
                turn = yield from _read(d, call)
                call.end()
                call = None
                if turn is None:
                    return
            calls = d.own_calls(turn)
            if not calls:
                yield from d.finish(turn)
                return
            if session.exhausted:
                ex.emit(CapHit("search_rounds"))
                yield d.error(422, session.cap_message(), CAP_TYPE)
                return
            yield from d.announce(calls)
            searched = session.searches
            outcomes = yield from _run_round(ex, d, calls, watch)
            if outcomes is not None:
                ex.emit(RoundDone(tuple(outcomes), session.searches - searched))
            if watch.gone or outcomes is None:
                return
            yield from d.record(turn, calls, outcomes)
            turn = None
    except UpstreamError as e:
        if not watch.gone:  # else it is the watch's doing, not vLLM's failure
            yield _gateway_error(d, e, d.error)
    finally:
        if call is not None:
            call.end()


def _wait_for_seat(ex: Exchange, d: StreamDialect, watch: ClientWatch):
    """A generator waiting for the next turn's seat in the fair queue, the stream kept alive meanwhile; a client
    that leaves gives up its place at once."""
    seat = ex.queue_seat("POST", d.path)
    if seat is None:
        return
    yield from seat.waiting(lambda: watch.gone, ex.cfg.keepalive_interval, d.keepalive([]))


def _run_round(ex: Exchange, d: AnyDialect, calls: list, watch: ClientWatch):
    """A generator running one round of the proxy's tool calls, returning their outcomes (None when a stream's
    client left meanwhile); a stream is kept alive while it runs. Each call is parsed once, here."""
    requests = d.requests(calls)
    if not d.stream:
        return d.run_tools(calls, requests)
    keepalive = cast(StreamDialect, d).keepalive(requests)
    return (yield from run_with_keepalive(lambda: d.run_tools(calls, requests), ex.cfg.keepalive_interval, keepalive,
                                          should_stop=lambda: watch.gone))


def _gateway_error(d: AnyDialect, e: UpstreamError, frame):
    """vLLM unreachable or silent: 502 or 504 in the API's shape, and one log line."""
    status, msg = gateway_status(e)
    log.warning("%s turn %d: %s", d.name, d.session.rounds + 1, msg)
    return frame(status, msg)
