"""/mcp served inside the Flask app: the MCP SDK's streamable HTTP app (ASGI) behind a2wsgi's ASGI-to-WSGI bridge,
since the proxy's server is gunicorn's gevent worker, a WSGI server. The route in proxy/http/app.py runs after the
key check (every request, not only `initialize`), checks the Origin header (origin_refusal), then hands the request's
WSGI environ to the bridge, which runs the SDK on an asyncio loop of its own in this worker (a greenlet under the
gevent worker) and gives the answer back as a WSGI body. Not run on its own; tests/test_mcp.py runs it under
gunicorn.

The SDK's app is stateless (a new transport per request, no session id), so any worker or replica answers any
request, and it answers in JSON, not SSE: the tools send no progress or server requests a stream would carry. Two
things the SDK expects of an ASGI server are done here by hand: a2wsgi runs no lifespan, so the session manager's
task group is started on the bridge's loop at the first request; and the SDK's own DNS-rebinding check, which
answers 421 for any Host it was not told of (a compose service name, a LAN address), is off, since the Origin check
here is what stops a browser page, and a client that is not a browser sends no Origin.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import TYPE_CHECKING, Any, cast

from flask import Response

from proxy.apis.mcp.wire import jsonrpc_error
from proxy.core import routes
from proxy.core.config import Config
from proxy.engine.services import Services

if TYPE_CHECKING:  # the SDK and the bridge load at the first /mcp request (McpBridge._start)
    from a2wsgi import ASGIMiddleware


def origin_refusal(origin: str | None, allowed: tuple[str, ...]) -> Response | None:
    """A 403 for a request a browser page on another origin sent (the MCP spec's MUST against DNS rebinding: such a
    page may reach a server on loopback or the LAN), else None. MCP clients that are not browsers send no Origin;
    MCP_ALLOWED_ORIGINS lists the browser origins allowed (`*` allows any). Pure."""
    if not origin:
        return None
    wanted = origin.strip().rstrip("/").lower()
    if "*" in allowed or wanted in {a.strip().rstrip("/").lower() for a in allowed}:
        return None
    return jsonrpc_error(403, f"Origin {origin[:200]!r} is not allowed to call this MCP server (MCP_ALLOWED_ORIGINS).")


class McpBridge:
    """One worker's /mcp: the SDK's app behind the bridge, made and started at the first request (a proxy that is
    never asked for MCP starts no loop)."""

    def __init__(self, services: Services, cfg: Config):
        self.services, self.cfg = services, cfg
        self._wsgi: ASGIMiddleware | None = None
        self._lock = threading.Lock()

    def wsgi(self) -> ASGIMiddleware:
        with self._lock:
            if self._wsgi is None:
                self._wsgi = self._start()
            return self._wsgi

    def _start(self) -> ASGIMiddleware:
        # Imported here: the SDK costs a worker 0.7 s and 39 MiB to load, which a proxy nobody asks for MCP keeps.
        from a2wsgi import ASGIMiddleware
        from mcp.server.transport_security import TransportSecuritySettings

        from proxy.apis.mcp import server as mcp_server

        # The SDK logs a line per request and per refused call at INFO; the proxy's access log already has one line
        # per request, and a tool's failure is its result. Its warnings and errors stay.
        logging.getLogger("mcp").setLevel(logging.WARNING)
        server = mcp_server.build(self.services)
        app = server.streamable_http_app(
            streamable_http_path=routes.MCP, stateless_http=True, json_response=True,
            max_request_body_size=self.cfg.max_body_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        # Starlette and a2wsgi each type the ASGI interface their own way (MutableMapping against TypedDicts).
        bridge = ASGIMiddleware(cast(Any, app))
        started: concurrent.futures.Future = concurrent.futures.Future()

        async def run_manager():
            # What an ASGI server's lifespan would do: hold the session manager's task group open for the worker's
            # life (stateless requests each run in it).
            async with server.session_manager.run():
                started.set_result(True)
                await asyncio.Event().wait()

        asyncio.run_coroutine_threadsafe(run_manager(), bridge.loop)
        started.result(timeout=30)
        return bridge

    def __call__(self, environ: dict, origin: str | None):
        """The answer to one /mcp request: a 403 for a foreign origin, a 405 for GET and DELETE, else the WSGI app
        Flask runs for it."""
        refusal = origin_refusal(origin, self.cfg.mcp_allowed_origins)
        if refusal is not None:
            return refusal
        if environ.get("REQUEST_METHOD") != "POST":
            # The spec's answer when the server offers no stream of its own (GET) and has no sessions to end
            # (DELETE); the SDK, stateless, would hold a GET open for ever.
            refused = jsonrpc_error(405, "This MCP server is stateless: it answers POST only.")
            refused.headers["Allow"] = "POST"
            return refused
        # Flask runs a returned WSGI app on a copy of the environ: the copy holds the same flow (the edge made it
        # before any route), so the tools' searches are counted where the request's end reads them.
        return self.wsgi()
