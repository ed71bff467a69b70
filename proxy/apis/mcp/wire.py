"""JSON-RPC's wire on /mcp: the proxy's own errors (a bad key, a foreign origin, a body too large) as a JSON-RPC
error object, the shape an MCP client parses. proxy/apis/wires.py binds it to the route; pure, not run on its own.
"""
from __future__ import annotations

from flask import Response

from proxy.core import codec
from proxy.core.errors import Wire


def jsonrpc_error_bytes(status: int, message: str, code: int = -32600) -> bytes:
    """An HTTP error as a JSON-RPC error object with no id, the shape an MCP client parses (the request it refuses
    was never read as a JSON-RPC message, so it has no id to answer)."""
    return codec.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


def jsonrpc_error(status: int, message: str, code: int = -32600) -> Response:
    return Response(jsonrpc_error_bytes(status, message, code), status=status, mimetype="application/json")


class JsonRpcWire(Wire):
    def error_bytes(self, status: int, message: str, type_: str | None = None) -> bytes:
        return jsonrpc_error_bytes(status, message)


WIRE = JsonRpcWire("mcp")
