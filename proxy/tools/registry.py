"""The server-side tools the proxy runs, one plug-in module each (proxy/tools/base.py's Tool), and the functions
the rest of the proxy reaches them by: a call's arguments parsed by the tool's name, an outcome's text and
citation sources by the tool that made it. Adding a tool is one module, one entry here, and one row in each API's
presentation table (docs/architecture.md, "How to add a tool").
"""
from __future__ import annotations

from typing import Any

from proxy.tools import find_in_page, web_fetch, web_search
from proxy.tools.base import NO_LIMITS, Cited, Limits, Outcome, Request, Tool

WEB_SEARCH = web_search.TOOL.name
WEB_FETCH = web_fetch.TOOL.name
FIND_IN_PAGE = find_in_page.TOOL.name

TOOLS: dict[str, Tool] = {t.name: t for t in (web_search.TOOL, web_fetch.TOOL, find_in_page.TOOL)}

# Ends the description of each tool the proxy's MCP server (/mcp) offers: a client passes it to the model with the
# tool, so a request that already offers this stack's MCP tools is known by it, whatever name the client gave them.
MCP_MARKER = "(Served by the coding stack's proxy over MCP.)"


def mcp_copy(name, description) -> str | None:
    """The proxy tool a client's tool stands for when it is this stack's MCP tool as the client offers it: its
    description carries MCP_MARKER, or its name is Claude Code's and Codex's `mcp__<server>__<tool>`; else None.
    Pure."""
    if not isinstance(name, str):
        return None
    for ours in (WEB_SEARCH, WEB_FETCH):
        if name.endswith(ours) and ((isinstance(description, str) and MCP_MARKER in description)
                                    or (name.startswith("mcp__") and name.endswith("__" + ours))):
            return ours
    return None


def tool(name: str) -> Tool:
    return TOOLS[name]


def parse(name: str, arguments: Any, limits: Limits = NO_LIMITS) -> Request:
    """A call of the named tool, from the model's arguments, within the client's limits. Pure."""
    return TOOLS[name].parse(arguments, limits)


def text(outcome: Outcome) -> str:
    """What the model reads for one outcome. Pure."""
    return TOOLS[outcome.tool].text(outcome)


def sources(outcome: Outcome) -> list[Cited]:
    """What one outcome offers for citing. Pure."""
    return TOOLS[outcome.tool].sources(outcome)
