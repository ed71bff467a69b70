"""How Anthropic's Messages API shows each proxy tool: one row per tool, keyed by its registry name. The handler,
the rewrite and the replay read these rows and never a tool's name, so a tool the Messages API offers is one row
here (docs/architecture.md, "How to add a tool"). Pure; tests/test_messages.py, tests/test_messages_fetch.py and
tests/test_new_tool.py (a tool made up for the test, served end to end).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.apis.messages import blocks
from proxy.tools.base import NOT_EXECUTED, Outcome
from proxy.tools.registry import WEB_FETCH, WEB_SEARCH
from proxy.tools.sources import Sources, numbered
from proxy.tools.web_search import format_for_model


@dataclass(frozen=True)
class ServerTool:
    """One proxy tool as an Anthropic server tool: what the client names it, the blocks it sees, what the model
    reads live and replayed, how its calls count in usage, what its max_uses refusal says."""
    tool: str                  # the registry name: the server_tool_use block's `name` too
    type_prefix: str           # the client's tool `type` starts with it ("web_search_" for web_search_20250305)
    result_type: str           # its result block's `type`
    result_list: bool          # a result's `content` is a list when it worked (else always one object)
    usage_key: str | None      # its count in usage.server_tool_use (None: not counted there)
    counts: tuple[str, ...]    # its options that must be whole positive numbers
    cites: bool                # its `citations` option ({"enabled": true}) applies: pages are cited
    used_up: str               # what the model reads past max_uses ({limit} is filled in)
    scope: tuple[str, str]     # the description's sentences for allowed_domains and blocked_domains ({domains})
    result_block: Callable[[str, Any, dict | None], dict]       # (tool_use_id, outcome, citations) -> its block
    model_text: Callable[[Any, dict], str]                      # (outcome, the call's input) -> what the model reads
    replayed: Callable[[Any, dict, Sources | None], str]  # (block content, call input, sources) -> text
    counted: Callable[[dict], bool]                             # a result block that counts in usage
    # Claude Code's sub-request for this tool: (the text its one user message starts with, the argument the rest is);
    # the proxy makes the model's call itself (request.subrequest).
    subrequest: tuple[str, str] | None = None


def _search_replayed(content, call_input: dict, sources: Sources | None) -> str:
    outcome = blocks.outcome_from_block(str(call_input.get("query", "")), content)
    return numbered(sources, outcome, format_for_model(outcome))


SERVER_TOOLS: dict[str, ServerTool] = {t.tool: t for t in (
    ServerTool(
        tool=WEB_SEARCH, type_prefix="web_search_", result_type="web_search_tool_result", result_list=True,
        usage_key="web_search_requests", counts=("max_uses",), cites=False,
        used_up=("Not searched: this request allows at most {limit} searches (max_uses) and they are used up. "
                 "Answer from the results you already have."),
        scope=(" Only results from these domains are shown: {domains}.",
               " Results from these domains are never shown: {domains}."),
        result_block=lambda use_id, outcome, cite: blocks.result_block(use_id, outcome),
        # What the search's block replays to (a line the block has no room for is not written live either).
        model_text=lambda outcome, call_input: blocks.search_text(outcome, str(call_input.get("query", ""))),
        replayed=_search_replayed, counted=blocks.counts_as_search,
        subrequest=("Perform a web search for the query: ", "query")),
    # Every web_fetch_* version is served as web_fetch_20250910: the later ones (the SDK knows _20260209,
    # _20260309, _20260318) only add options and share its blocks, as web_search_* do.
    ServerTool(
        tool=WEB_FETCH, type_prefix="web_fetch_", result_type="web_fetch_tool_result", result_list=False,
        usage_key="web_fetch_requests", counts=("max_uses", "max_content_tokens"), cites=True,
        used_up=("Not fetched: this request allows at most {limit} fetches (max_uses) and they are used up. "
                 "Answer from the pages you already have."),
        scope=(" Only pages on these domains can be fetched: {domains}.",
               " Pages on these domains are never fetched: {domains}."),
        result_block=blocks.fetch_result_block,
        model_text=lambda outcome, call_input: blocks.fetch_model_text(outcome),
        replayed=lambda content, call_input, sources: blocks.replayed_text(content, sources),
        counted=blocks.counts_as_fetch),
)}


def row_for_type(tool_type) -> ServerTool | None:
    """The row whose server tool a client's tool `type` names, or None for an ordinary tool."""
    kind = str(tool_type or "")
    return next((t for t in SERVER_TOOLS.values() if kind.startswith(t.type_prefix)), None)


def row_for_result(block_type) -> ServerTool | None:
    """The row whose result block has this `type`."""
    return next((t for t in SERVER_TOOLS.values() if t.result_type == block_type), None)


def server_blocks() -> frozenset[str]:
    """Every block type that is a server tool's: server_tool_use and each row's result block."""
    return frozenset({"server_tool_use"} | {t.result_type for t in SERVER_TOOLS.values()})


def usage_keys() -> list[str]:
    """The counts usage.server_tool_use always carries (anthropic 2.16's ServerToolUsage requires both of the
    first two tools', and Anthropic always sends them)."""
    return [t.usage_key for t in SERVER_TOOLS.values() if t.usage_key]


def with_counts(usage: dict | None, counts: dict[str, int]) -> dict:
    """Usage with server_tool_use: every row's count, 0 where none ran (anthropic 2.16's ServerToolUsage requires
    web_search_requests and web_fetch_requests, and Anthropic always sends both)."""
    return {**(usage or {"input_tokens": 0, "output_tokens": 0}),
            "server_tool_use": {key: counts.get(key, 0) for key in usage_keys()}}


def result_block(tool_use_id: str, outcome: Outcome, cite: dict | None = None) -> dict:
    """The server tool's result block for one call (web_search_tool_result, web_fetch_tool_result)."""
    return SERVER_TOOLS[outcome.tool].result_block(tool_use_id, outcome, cite)


def model_text(outcome: Outcome, call_input: dict | None = None) -> str:
    """The tool_result text of one call of a round, as its tool's row makes it."""
    return SERVER_TOOLS[outcome.tool].model_text(outcome, call_input or {})


def tool_results(calls: list[dict], ours: list[dict], outcomes: list,
                 sources: Sources | None = None, pages: bool = False) -> dict:
    """The user turn answering every tool call of a turn: the results of the proxy's calls (`ours`, in `outcomes`'
    order; `sources`: numbered for citing, pages only when their server tool has citations enabled), the
    not-executed stub for the client's own."""
    text = {id(c): numbered(sources, o, model_text(o, blocks.as_dict(c.get("input"))), pages)
            for c, o in zip(ours, outcomes, strict=True)}
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.get("id"),
                                         "content": text.get(id(c), NOT_EXECUTED)} for c in calls]}
