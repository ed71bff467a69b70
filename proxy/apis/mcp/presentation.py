"""How the MCP server shows each proxy tool: one row per tool, keyed by its registry name (also its MCP name), with
the method of server.Tools that runs it, its title, what its description adds to the tool's own, and its annotations.
The server reads these rows and never a tool's name (docs/architecture.md, "How to add a tool"). Pure.
"""
from __future__ import annotations

from dataclasses import dataclass

from mcp.types import ToolAnnotations

from proxy.tools.registry import MCP_MARKER, WEB_FETCH, WEB_SEARCH, tool


@dataclass(frozen=True)
class McpTool:
    tool: str       # the registry name, and the name the client calls
    method: str     # the server.Tools method that runs a call
    title: str
    adds: str = ""  # said after the tool's own description

    @property
    def description(self) -> str:
        return " ".join(filter(None, (tool(self.tool).description, self.adds, MCP_MARKER)))

    @property
    def annotations(self) -> ToolAnnotations:
        # Both only read (a search, a GET of a public page), change nothing, and reach the open web.
        return ToolAnnotations(title=self.title, read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                               open_world_hint=True)


SEARCH = McpTool(WEB_SEARCH, "search", "Web search")
FETCH = McpTool(WEB_FETCH, "fetch", "Read a web page",
                "PDFs come as text. Hidden text is removed; private and cloud-metadata addresses are refused.")
MCP_TOOLS = (SEARCH, FETCH)
