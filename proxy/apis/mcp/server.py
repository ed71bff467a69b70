"""The MCP server at /mcp: web_search and web_fetch as MCP tools, on the official SDK's MCPServer (`mcp`), each call
run by a ToolSession (proxy/tools/session.py) on the worker's backends exactly as every API's calls are: the same
search failover, cache and engine health, the same fetcher with its SSRF rules, bounds and hidden-text removal, the
same events (so a key's calls count in its usage, and the metrics see them). What is MCP's own is thin: the tools'
argument schemas, the text result (never structured output: Claude Code hands the model structured output as JSON
with every newline escaped), `isError` for a failed call, and provenance without a conversation (provenance.py).

build() makes the server; proxy/http/mcp_bridge.py serves its streamable HTTP app inside the Flask app. Tested end
to end under gunicorn with the SDK's own client by tests/test_mcp.py (`tests/run.sh tests/test_mcp.py`).
"""
from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from proxy.apis.mcp.presentation import FETCH, MCP_TOOLS, SEARCH
from proxy.apis.mcp.provenance import McpReads
from proxy.core import routes
from proxy.engine.events import RoundDone, UrlRefused
from proxy.engine.exchange import Exchange
from proxy.engine.services import Services
from proxy.tools import registry
from proxy.tools.base import Limits, Outcome
from proxy.tools.client_reads import client_of
from proxy.tools.provenance import Ledger, Rules

NAME = "coding-stack-web"
INSTRUCTIONS = ("Web search and page reading run by the coding stack's proxy: search to find pages, then read one as "
                "Markdown. Read URLs that a search returned or the user gave; other URLs are rationed.")


def result(outcome: Outcome) -> CallToolResult:
    """A call's outcome as the MCP result a client shows: the text the model reads, an error when the call failed
    (a search that found nothing is an answer, not an error). Pure."""
    return CallToolResult(content=[TextContent(type="text", text=registry.text(outcome))],
                          is_error=outcome.status == "failed")


def environ_of(ctx: Context) -> dict:
    """The WSGI environ of the HTTP request a call came in (the bridge puts it in the ASGI scope)."""
    request: Any = ctx.request_context.request
    return request.scope["wsgi_environ"]


class Tools:
    """The two tools of one worker, on its Services."""

    def __init__(self, services: Services):
        cfg = services.cfg
        self.services = services
        self.provenance = McpReads(Rules.of(cfg), services.reads, cfg.mcp_unsourced_per_hour)

    def _run(self, environ: dict, request, ledger: Ledger | None = None, limit: int | None = None) -> Outcome:
        """One call on a ToolSession of its own, on the client's watch, told to the worker's observers."""
        ex = Exchange(self.services, b"", [], routes.MCP, environ)
        ex.ledger = ledger
        session = ex.session()
        watch = ex.watch_client()
        try:
            [outcome] = session.run([request], limit=limit)
        finally:
            watch.stop()
        ex.emit(RoundDone((outcome,), session.searches))
        return outcome

    def search(self, query: Annotated[str, Field(description="The search query, a few keywords.")],
                   ctx: Context,
                   count: Annotated[int | None, Field(ge=1, le=20, description="How many results (default: the "
                                                      "proxy's SEARXNG_RESULTS).")] = None,
                   domains: Annotated[list[str] | None, Field(description="Keep only results on these domains "
                                                              "(example.com covers its subdomains).")] = None,
                   ) -> CallToolResult:
        environ = environ_of(ctx)
        request = registry.parse(SEARCH.tool, {"query": query},
                                 Limits(allowed_domains=tuple(domains or ()), results=count))
        outcome = self._run(environ, request, limit=count)
        self.provenance.searched(client_of(environ), getattr(request, "query", query), registry.sources(outcome))
        return result(outcome)

    def fetch(self, url: Annotated[str, Field(description="The full http:// or https:// URL to read.")],
                  ctx: Context,
                  max_tokens: Annotated[int | None, Field(ge=1, description="Cut the page's text after about this "
                                                          "many tokens (4 characters each).")] = None,
                  ) -> CallToolResult:
        environ = environ_of(ctx)
        client = client_of(environ)
        tool = registry.tool(FETCH.tool)
        request = tool.parse({"url": url}, Limits(max_tokens=max_tokens))
        ledger = self.provenance.ledger(client, request.shown) if request.early is None else None
        if ledger is not None and not isinstance(ledger, Ledger):
            # Refused before anything is looked up, counted as every API's provenance refusals are.
            ex = Exchange(self.services, b"", [], routes.MCP, environ)
            ex.emit(UrlRefused(ledger.reason))
            outcome = tool.failure(request, "url_not_allowed", f"Fetch failed: {ledger.message}")
            ex.emit(RoundDone((outcome,), 0))
            return result(outcome)
        outcome = self._run(environ, request, ledger)
        for page in registry.sources(outcome):
            if ledger is not None:
                self.provenance.read(client, ledger, request.shown, page)
        return result(outcome)


def build(services: Services) -> MCPServer:
    """The MCP server with both tools. Results are text only (structured_output=False), so a client shows, and
    hands its model, the readable text."""
    server: MCPServer = MCPServer(NAME, instructions=INSTRUCTIONS)
    tools = Tools(services)
    for row in MCP_TOOLS:
        server.add_tool(getattr(tools, row.method), name=row.tool, description=row.description,
                        annotations=row.annotations, structured_output=False)
    return server
