"""Anthropic's wire on /v1/messages and everything under it: the error shape Claude Code and the Anthropic SDK parse
(the proxy's own errors, and vLLM's rewritten into it, since its clients parse only Anthropic's), the stream's
error event, and the ping events that keep a queued stream alive. proxy/apis/wires.py binds it to the route;
pure, not run on its own.
"""
from __future__ import annotations

from flask import Response

from proxy.core import codec
from proxy.core.errors import Wire

# Anthropic's error types by status, which the Anthropic SDK maps to its exception classes.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
                   429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # Anthropic's keep-alive event, as the Messages API sends it


def anthropic_type(status: int) -> str:
    """Anthropic's type for a status: `api_error` is its server's, so any other 4xx is `invalid_request_error`."""
    return ANTHROPIC_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")


def anthropic_error_bytes(status: int, message: str, type_: str | None = None) -> bytes:
    return codec.dumps({"type": "error", "error": {"type": type_ or anthropic_type(status),
                                                   "message": message}})


def as_anthropic_error(status: int, raw: bytes) -> bytes:
    """vLLM's error body in Anthropic's shape; one already in that shape is left as it is."""
    try:
        data = codec.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return anthropic_error_bytes(status, raw.decode("utf-8", "replace").strip()[:4000] or f"vLLM answered HTTP {status}")
    if isinstance(data, dict) and data.get("type") == "error" and isinstance(data.get("error"), dict):
        return raw
    err = data.get("error") if isinstance(data, dict) else None
    message = err.get("message") if isinstance(err, dict) else (err if isinstance(err, str) else None)
    if message is None and isinstance(data, dict) and data.get("detail"):  # FastAPI's own: an unknown path, a 405
        message = data["detail"] if isinstance(data["detail"], str) else codec.dumps(data["detail"]).decode()
    return anthropic_error_bytes(status, str(message or raw.decode("utf-8", "replace"))[:4000])


def anthropic_error(status: int, message: str, type_: str | None = None) -> Response:
    """Anthropic's error shape, which the Anthropic SDK and Claude Code parse."""
    return Response(anthropic_error_bytes(status, message, type_), status=status, mimetype="application/json")


class AnthropicWire(Wire):
    keepalive = PING
    rate_limit_type = "rate_limit_error"

    def error_bytes(self, status: int, message: str, type_: str | None = None) -> bytes:
        # A type only Anthropic's vocabulary has survives; OpenAI's names (the key check's) give way to the status's.
        return anthropic_error_bytes(status, message, type_ if type_ in ANTHROPIC_TYPES.values() else None)

    def stream_error(self, status: int, message: str, raw: bytes | None = None) -> bytes:
        return codec.raw_event("error", as_anthropic_error(status, raw) if raw else anthropic_error_bytes(status, message))

    def upstream_error(self, status: int, raw: bytes) -> bytes:
        return as_anthropic_error(status, raw)


WIRE = AnthropicWire("messages")
