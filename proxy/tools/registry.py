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
