"""How the chat completions API shows each proxy tool: one row per tool, keyed by its registry name, saying which
setting offers it. Chat shows a tool as a plain function: its definition is the tool's own (name, description,
schema), what the model reads is the tool's text with its sources numbered, and those sources become the answer's
url_citation annotations; so a row holds only what differs per tool. The rules read these rows and never a
tool's name, so a tool chat offers is one row here (docs/architecture.md, "How to add a tool"). Pure;
tests/test_rules.py and tests/test_new_tool.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy.core.config import Config
from proxy.tools.registry import WEB_FETCH, WEB_SEARCH


@dataclass(frozen=True)
class ChatTool:
    """One proxy tool as a chat function the proxy adds to a request."""
    tool: str                          # the registry name: the function's name
    offered: Callable[[Config], bool]  # the setting that offers it (INJECT_WEB_SEARCH, INJECT_WEB_FETCH)


# In the order the functions are added to a request's tools.
CHAT_TOOLS: dict[str, ChatTool] = {t.tool: t for t in (
    ChatTool(WEB_SEARCH, lambda cfg: cfg.inject_web_search),
    ChatTool(WEB_FETCH, lambda cfg: cfg.inject_web_fetch),
)}


def offered(cfg: Config) -> tuple[str, ...]:
    """The tools chat offers with these settings, in the table's order."""
    return tuple(name for name, row in CHAT_TOOLS.items() if row.offered(cfg))
