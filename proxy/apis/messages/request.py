"""Which /v1/messages requests the proxy plays server tools for, the checks they must pass, and
the request vLLM gets instead (the MessagesPlan, the tools as ordinary ones, each following turn); pure,
tested by tests/run.sh tests/test_messages.py tests/test_messages_fetch.py.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from proxy.apis import citations
from proxy.apis.messages.blocks import FETCH_NAME, SERVER_BLOCKS, SERVER_NAME
from proxy.apis.messages.history import Kept, no_kept, rewrite_history
from proxy.core import validate as V
from proxy.tools import registry
from proxy.tools.base import Limits, Request
from proxy.tools.registry import WEB_FETCH, WEB_SEARCH

SERVER_TOOL_PREFIX = "web_search_"
# Every web_fetch_* version is served as web_fetch_20250910: the later ones (the SDK knows
# _20260209, _20260309, _20260318) only add options and share its blocks, as web_search_* do.
FETCH_TOOL_PREFIX = "web_fetch_"
SUBREQUEST_PREFIX = "Perform a web search for the query: "


# ---- which requests -------------------------------------------------------------------------

def _typed(tool, prefix: str) -> bool:
    return isinstance(tool, dict) and str(tool.get("type") or "").startswith(prefix)


def is_search_tool(tool) -> bool:
    """Anthropic's web_search server tool, by type: Claude Desktop's client-side `WebSearch` is a normal tool."""
    return _typed(tool, SERVER_TOOL_PREFIX)


def is_fetch_tool(tool) -> bool:
    """Anthropic's web_fetch server tool, by type (Claude Code's client-side WebFetch is a normal tool)."""
    return _typed(tool, FETCH_TOOL_PREFIX)


def is_server_tool(tool) -> bool:
    """One of the server tools the proxy plays."""
    return is_search_tool(tool) or is_fetch_tool(tool)


def server_tool(body: dict, kind=is_search_tool) -> dict | None:
    """The request's web_search server tool (or, with kind=is_fetch_tool, its web_fetch one)."""
    tools = body.get("tools")
    return next((t for t in tools if kind(t)), None) if isinstance(tools, list) else None


def fetch_tool(body: dict) -> dict | None:
    return server_tool(body, is_fetch_tool)


def has_server_blocks(body: dict) -> bool:
    msgs = body.get("messages")
    return isinstance(msgs, list) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list)
        and any(V.kind(b) in SERVER_BLOCKS for b in m["content"]) for m in msgs)


def needs_rewrite(body) -> bool:
    return isinstance(body, dict) and (server_tool(body, is_server_tool) is not None or has_server_blocks(body))


def validate(body: dict) -> str | None:
    """What makes a request the proxy must rewrite unusable, or None."""
    if not isinstance(body.get("messages"), list) or not all(isinstance(m, dict) for m in body["messages"]):
        return "messages: must be an array of message objects"
    if body.get("tools") is not None and (not isinstance(body["tools"], list)
                                          or not all(isinstance(t, dict) for t in body["tools"])):
        return "tools: must be an array of tool objects"
    fetch = fetch_tool(body)
    problem = _spec_problem(SERVER_NAME, server_tool(body) or {}, ("max_uses",)) \
        or _spec_problem(FETCH_NAME, fetch or {}, ("max_uses", "max_content_tokens")) \
        or (None if fetch is None or fetch.get("citations") is None or isinstance(fetch["citations"], dict)
            else "tools: web_fetch citations must be an object like {\"enabled\": true}")
    if problem:
        return problem
    try:
        _check_types(body)
    except V.Invalid as e:
        return e.anthropic_message
    return None


def _check_types(body: dict) -> None:
    """The fields the rewrite reads (names, ids, domains, tool_choice, replayed server blocks) are of
    the JSON type it reads them as, or V.Invalid names the first that is not."""
    V.boolean(body.get("stream"), "stream")
    for i, tool in enumerate(body.get("tools") or []):
        V.fields(tool, f"tools.{i}", name=V.string, type=V.string)
        if is_server_tool(tool):
            V.fields(tool, f"tools.{i}", allowed_domains=V.strings, blocked_domains=V.strings)
    if isinstance(body.get("tool_choice"), dict):
        V.fields(body["tool_choice"], "tool_choice", type=V.string, name=V.string)
    for i, msg in enumerate(body["messages"]):
        content = msg.get("content")
        if not (isinstance(content, list) and any(V.kind(b) in SERVER_BLOCKS for b in content)):
            continue  # history without server blocks goes to vLLM as it is: vLLM judges it
        for j, block in enumerate(content):
            at = f"messages.{i}.content.{j}"
            block = V.obj(block, at)
            V.fields(block, at, type=V.string, id=V.string, tool_use_id=V.string, name=V.string)
            if block.get("type") == "server_tool_use":
                V.fields(block, at, input=V.obj)
            elif block.get("type") == "web_search_tool_result" and not isinstance(block.get("content"), list):
                V.fields(V.obj(block.get("content"), f"{at}.content"), f"{at}.content", error_code=V.string)
            elif block.get("type") == "web_fetch_tool_result":
                V.fields(V.obj(block.get("content"), f"{at}.content"), f"{at}.content", error_code=V.string)


def _positive(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def _spec_problem(label: str, spec: dict, counts: tuple[str, ...]) -> str | None:
    """What is wrong with one server tool's options, or None (Anthropic's rules: whole counts,
    and allowed_domains or blocked_domains, not both)."""
    for key in counts:
        if spec.get(key) is not None and not _positive(spec[key]):
            return f"tools: {label} {key} must be a positive integer"
    if spec.get("allowed_domains") and spec.get("blocked_domains"):
        return f"tools: {label} may have allowed_domains or blocked_domains, not both"
    for key in ("allowed_domains", "blocked_domains"):
        if spec.get(key) is not None and not isinstance(spec[key], list):
            return f"tools: {label} {key} must be an array of domains"
    return None


def subrequest_query(body: dict) -> str | None:
    """The <q> of Claude Code's search sub-request (only the server tool; one user message
    `Perform a web search for the query: <q>`), else None."""
    tools, msgs = body.get("tools") or [], body.get("messages") or []
    if len(tools) != 1 or not is_search_tool(tools[0]) or len(msgs) != 1 or msgs[0].get("role") != "user":
        return None
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and tc.get("type") == "none":
        return None
    content = msgs[0].get("content")
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if len(texts) != 1 or len(content) != 1:
            return None
        content = texts[0]
    if isinstance(content, str) and content.startswith(SUBREQUEST_PREFIX):
        return content[len(SUBREQUEST_PREFIX):]
    return None


def served_model_for(model, served: list[str] | None) -> str | None:
    """The served model to use instead of an unknown `model` (ANTHROPIC_ANY_MODEL), or None."""
    if not served or model in served:
        return None
    return served[0]


# ---- the rewrite ----------------------------------------------------------------------------

@dataclass(frozen=True)
class FetchPlan:
    """The web_fetch tool's options, as the fetch core takes them."""
    max_uses: int | None = None
    allowed: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    max_tokens: int | None = None    # max_content_tokens
    citations: dict | None = None    # echoed in each document; {"enabled": true}: pages are cited (char_location)


@dataclass
class MessagesPlan:
    """How one rewritten request searches and fetches."""
    name: str                        # the search tool's name on the vLLM side
    server: bool                     # the web_search tool is in `tools` (else only history is rewritten)
    max_uses: int | None = None
    allowed: list = field(default_factory=list)
    blocked: list = field(default_factory=list)
    client_tools: bool = False       # ordinary tools besides the server tools
    fetch_name: str = FETCH_NAME     # the fetch tool's name on the vLLM side
    fetch: FetchPlan | None = None   # None: no web_fetch tool in `tools`

    def ours(self) -> set[str]:
        """The vLLM-side names of the calls the proxy runs itself."""
        return ({self.name} if self.server else set()) | ({self.fetch_name} if self.fetch else set())


def internal_name(tools, base: str = SERVER_NAME) -> str:
    """`web_search` (or `web_fetch`), unless the client has an ordinary tool of that name: then a free variant."""
    taken = {t.get("name") for t in tools or [] if isinstance(t, dict) and not is_server_tool(t)}
    name, n = base, 1
    while name in taken:
        name = f"{base}_server" + (f"_{n}" if n > 1 else "")
        n += 1
    return name


def search_tool(name: str, plan: MessagesPlan) -> dict:
    """web_search as an ordinary tool for vLLM: the tool's description, with the client's domain filters said."""
    tool = registry.tool(WEB_SEARCH)
    desc = tool.description
    if plan.allowed:
        desc += " Only results from these domains are shown: " + ", ".join(map(str, plan.allowed)) + "."
    if plan.blocked:
        desc += " Results from these domains are never shown: " + ", ".join(map(str, plan.blocked)) + "."
    return {"name": name, "description": desc, "input_schema": tool.schema}


def fetch_plan(spec: dict) -> FetchPlan:
    return FetchPlan(max_uses=spec.get("max_uses"), allowed=tuple(map(str, spec.get("allowed_domains") or ())),
                     blocked=tuple(map(str, spec.get("blocked_domains") or ())),
                     max_tokens=spec.get("max_content_tokens"), citations=spec.get("citations"))


def fetch_tool_for_vllm(name: str, fp: FetchPlan) -> dict:
    """web_fetch as an ordinary tool for vLLM: the tool's description and schema, with the client's filters said."""
    tool = registry.tool(WEB_FETCH)
    desc = tool.description
    if fp.allowed:
        desc += " Only pages on these domains can be fetched: " + ", ".join(fp.allowed) + "."
    if fp.blocked:
        desc += " Pages on these domains are never fetched: " + ", ".join(fp.blocked) + "."
    return {"name": name, "description": desc, "input_schema": tool.schema}


def rewrite(body: dict, cite: bool = True, kept: Kept = no_kept) -> tuple[dict, MessagesPlan]:
    """The request as vLLM accepts it: the server tool as an ordinary tool, server blocks in
    history as tool_use/tool_result (`kept`: the live text of results their blocks cannot rebuild, by
    tool_use_id); every other field unchanged. Pure but for the lookup."""
    spec, fspec = server_tool(body), fetch_tool(body)
    tools = body.get("tools")
    name = internal_name(tools)
    plan = MessagesPlan(name=name, server=spec is not None,
                max_uses=(spec or {}).get("max_uses"),
                allowed=list((spec or {}).get("allowed_domains") or []),
                blocked=list((spec or {}).get("blocked_domains") or []),
                client_tools=any(not is_server_tool(t) for t in tools or []),
                fetch_name=internal_name(tools, FETCH_NAME), fetch=fetch_plan(fspec) if fspec is not None else None)
    out = dict(body)
    if tools is not None:
        out["tools"] = [search_tool(name, plan) if is_search_tool(t)
                        else fetch_tool_for_vllm(plan.fetch_name, plan.fetch) if is_fetch_tool(t) and plan.fetch
                        else t for t in tools]
    tc = body.get("tool_choice")
    if spec is not None and isinstance(tc, dict) and tc.get("type") == "tool" and tc.get("name") == SERVER_NAME \
            and name != SERVER_NAME and not _client_has(tools, SERVER_NAME):
        out["tool_choice"] = {**tc, "name": name}
    if has_server_blocks(body):
        out["messages"] = rewrite_history(body["messages"], name, plan.fetch_name, cite, kept)
    out["messages"] = citations.without_citations(out["messages"])  # an earlier answer's cited text blocks
    return out, plan


def _client_has(tools, name) -> bool:
    return any(isinstance(t, dict) and not is_server_tool(t) and t.get("name") == name for t in tools or [])


# ---- the calls the proxy runs and the turns after the first ---------------------------------

def fetch_request(arguments, fp: FetchPlan) -> Request:
    """A web_fetch call as the fetch tool runs it, with the client's options for the tool. Pure."""
    return registry.parse(WEB_FETCH, arguments, Limits(fp.allowed, fp.blocked, fp.max_tokens))


def search_request(arguments, plan: MessagesPlan) -> Request:
    """A web_search call as the search tool runs it, with the client's domain filters. Pure."""
    return registry.parse(WEB_SEARCH, arguments, Limits(tuple(plan.allowed), tuple(plan.blocked)))


def next_request(body: dict, messages: list[dict], plan: MessagesPlan) -> dict:
    """The following turn: longer history; a choice that forces searching is relaxed after the
    first round so the model writes its answer instead of searching forever."""
    out = {**body, "messages": messages}
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and ((tc.get("type") == "tool" and tc.get("name") in plan.ours() | {plan.name})
                                 or (tc.get("type") == "any" and not plan.client_tools)):
        out["tool_choice"] = {k: v for k, v in tc.items() if k == "disable_parallel_tool_use"} | {"type": "auto"}
    return out


def shortcut_turn(query: str, plan: MessagesPlan) -> list[dict]:
    """The tool call the model would have written for Claude Code's sub-request."""
    return [{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": plan.name, "input": {"query": query}}]

