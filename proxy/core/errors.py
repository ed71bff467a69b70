"""OpenAI's error bodies (vLLM and the openai SDK speak it), and Wire: how a route's clients are told the proxy's
own errors and are kept waiting. Wire itself speaks OpenAI's shape, vLLM's, so the relay of every path no API claims
uses it as it is; an API whose clients parse another shape declares a Wire of its own in its package
(proxy/apis/<api>/wire.py) and proxy/apis/wires.py binds it to its route. The engine, the key check and gunicorn's
own errors ask the request's wire and never which API it is.

Used by the handlers, the relay and the key check; not run on its own.
"""
from __future__ import annotations

from flask import Response

from proxy.core import codec

# The type names OpenAI's API uses; the SDK only reads message/status, humans read type.
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         413: "invalid_request_error", 422: "invalid_request_error", 502: "bad_gateway",
         503: "service_unavailable", 504: "gateway_timeout"}


def error_body(status: int, message: str, type_: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_ or default_type(status),
                      "param": param, "code": status}}


def default_type(status: int) -> str:
    """OpenAI's type for a status: every 4xx is the client's (a 405 or 414 too), every other the server's."""
    return TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "server_error")


def error_response(status: int, message: str, type_: str | None = None, param: str | None = None) -> Response:
    return Response(codec.dumps(error_body(status, message, type_, param)), status=status,
                    mimetype="application/json")


def sse_error(status: int, message: str, type_: str | None = None) -> bytes:
    """An error inside a stream that already answered 200, framed as vLLM frames it."""
    return codec.data(error_body(status, message, type_)) + codec.DONE


class Wire:
    """One route's wire as the proxy writes it: OpenAI's here (vLLM's own, so the relay's), an API's subclass where
    its clients parse another shape. Every body is byte for byte what that API's clients get today
    (tests/test_client_errors.py, docs/apis.md "Errors on every route")."""

    keepalive = codec.comment("queued for the model")  # a relayed stream's bytes while it waits for a seat
    rate_limit_type = "rate_limit_exceeded"            # the error type of a key's 429

    def __init__(self, api: str):
        self.api = api  # the route's api label (core/routes.py) it is the wire of

    def error_bytes(self, status: int, message: str, type_: str | None = None) -> bytes:
        """The proxy's own error body for a status and a sentence (and a type, where the shape has one)."""
        return codec.dumps(error_body(status, message, type_))

    def error(self, status: int, message: str, type_: str | None = None) -> Response:
        return Response(self.error_bytes(status, message, type_), status=status, mimetype="application/json")

    def stream_error(self, status: int, message: str, raw: bytes | None = None) -> bytes:
        """An error as a relayed stream's last bytes, its head already sent: vLLM's own body when it wrote one."""
        if raw:
            return b"data: " + raw.strip().replace(b"\n", b" ") + b"\n\n" + codec.DONE
        return sse_error(status, message)

    def upstream_error(self, status: int, raw: bytes) -> bytes | None:
        """vLLM's error body as this route's clients must get it, or None when they parse vLLM's shape as it is."""
        return None
