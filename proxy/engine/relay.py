"""The transparent relay: a request the proxy has nothing to add to goes to vLLM as the client sent it and vLLM's
answer comes back byte for byte (a stream as iter_raw gives it), on the client's watch; what the proxy writes itself
(its errors, vLLM's error rewritten for the route's clients, a queued stream's keep-alives and error event) is the
flow's wire's. Reached through Exchange.relay (proxy/engine/exchange.py); not run on its own
(tests/test_relay.py).
"""
from __future__ import annotations

import logging
import socket
import urllib.parse
from typing import Protocol

from flask import Response

from proxy.core import codec
from proxy.core.config import Config
from proxy.core.errors import Wire
from proxy.engine.admission import Seat
from proxy.engine.flow import Flow, asks_to_stream
from proxy.engine.watch import Call, ClientWatch
from proxy.transport.http1 import end_to_end_headers
from proxy.transport.vllm import UpstreamError, UpstreamResponse, gateway_status

log = logging.getLogger("proxy")


def response_headers(up: UpstreamResponse) -> list:
    """vLLM's response headers as the client should get them: end to end only, and no
    Content-Length, which whoever writes the body next computes."""
    return [(n, v) for n, v in end_to_end_headers(up.headers) if n.lower() != "content-length"]


class Relayed(Protocol):
    """What the relay uses of a request (proxy/engine/exchange.py's Exchange)."""
    body: bytes
    target: str
    headers: list
    environ: dict
    flow: Flow

    def json(self): ...

    @property
    def cfg(self) -> Config: ...

    def watch_client(self) -> ClientWatch: ...

    def queue_seat(self, method: str = "POST", target: str | None = None) -> Seat | None: ...

    def call(self, method: str, target: str, body: bytes | None, headers: list) -> Call: ...


def relay(ex: Relayed, body: bytes) -> Response:
    """Send the request on unchanged and the answer back unchanged, streaming if it streams."""
    method, wire = ex.flow.method, ex.flow.wire
    watch = ex.watch_client()
    seat = ex.queue_seat(method, ex.target)
    read = ex.json if body is ex.body else (lambda: codec.loads(body))  # the client's: decoded once already
    if seat is not None and not seat.ready() and streams(ex.flow, body, read):
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


def streams(flow: Flow, body: bytes, read) -> bool:
    """Whether a relayed request asks for an event stream: the flag its API's handler set when it parsed the body,
    else (a path no API claims) the body's value as `read()` gives it, looked at once."""
    if flow.stream is None:
        try:
            flow.stream = b'"stream"' in body and asks_to_stream(read())
        except (ValueError, UnicodeDecodeError, RecursionError):
            flow.stream = False
    return flow.stream


def _queued_stream(ex: Relayed, body: bytes, method: str, seat: Seat, watch: ClientWatch):
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
