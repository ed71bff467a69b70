"""Error bodies in the shapes clients parse: OpenAI's (vLLM and the openai SDK speak it) and,
on /v1/messages, Anthropic's.

Used by the handlers and the search loop; not run on its own.
"""
from __future__ import annotations

from flask import Response

from proxy.core import codec
from proxy.core.routes import route_of

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


# Anthropic's error types by status, which the Anthropic SDK maps to its exception classes.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
                   429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


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


def jsonrpc_error_bytes(status: int, message: str, code: int = -32600) -> bytes:
    """An HTTP error as a JSON-RPC error object with no id, the shape an MCP client parses (the request it refuses
    was never read as a JSON-RPC message, so it has no id to answer)."""
    return codec.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


def jsonrpc_error(status: int, message: str, code: int = -32600) -> Response:
    return Response(jsonrpc_error_bytes(status, message, code), status=status, mimetype="application/json")


def error_for_path(path: str, status: int, message: str, type_: str | None = None) -> Response:
    """The proxy's own error in the shape the route's clients parse: Anthropic's under
    /v1/messages (Claude Code, the Anthropic SDK), JSON-RPC's on /mcp, OpenAI's everywhere else."""
    return Response(error_bytes_for_path(path, status, message, type_), status=status, mimetype="application/json")


def error_bytes_for_path(path: str, status: int, message: str, type_: str | None = None) -> bytes:
    """error_for_path's body, for a writer without Flask (gunicorn's own errors, proxy/http/gunicorn_errors.py)."""
    if route_of(path).errors == "jsonrpc":
        return jsonrpc_error_bytes(status, message)
    if route_of(path).errors == "anthropic":
        return anthropic_error_bytes(status, message, type_ if type_ in ANTHROPIC_TYPES.values() else None)
    return codec.dumps(error_body(status, message, type_))
