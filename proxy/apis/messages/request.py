"""Which /v1/messages requests the proxy plays server tools for, the checks they must pass, and
the request vLLM gets instead (the MessagesPlan, the tools as ordinary ones, each following turn); pure,
tested by tests/run.sh tests/test_messages.py tests/test_messages_fetch.py.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from proxy.apis import citations, mend
from proxy.apis.messages.history import Kept, no_kept, rewrite_history
from proxy.apis.messages.presentation import SERVER_TOOLS, ServerTool, row_for_result, row_for_type, server_blocks
from proxy.core import validate as V
from proxy.core.codec import as_dict
from proxy.tools import registry
from proxy.tools.base import NO_LIMITS, Limits, Request

# ---- which requests -------------------------------------------------------------------------

def server_row(tool) -> ServerTool | None:
    """The presentation row of a client's server tool (by its `type`), or None for an ordinary tool: Claude
    Desktop's client-side `WebSearch` and Claude Code's `WebFetch` are ordinary tools."""
    return row_for_type(tool.get("type")) if isinstance(tool, dict) else None


def is_server_tool(tool) -> bool:
    """One of the server tools the proxy plays."""
    return server_row(tool) is not None


def server_specs(body: dict) -> dict[str, dict]:
    """The client's server tools by the proxy tool that plays them (the first of each kind), in the table's order."""
    tools = body.get("tools")
    found: dict[str, dict] = {}
    for t in tools if isinstance(tools, list) else ():
        row = server_row(t)
        if row is not None:
            found.setdefault(row.tool, t)
    return {tool: found[tool] for tool in SERVER_TOOLS if tool in found}


@dataclass(frozen=True)
class History:
    """What the handler's readers ask of a request's history, found in one pass over its blocks (a 1 MB history holds
    ~30,000, and each reader walking them again cost a fraction of a millisecond): the block types in it, whether a
    tool_use's input needs mending (mend.messages), whether a block carries citations, whether every message is an
    object whose role is a string (else validate names the first that is not)."""
    kinds: frozenset[str] = frozenset()
    broken_input: bool = False
    cited: bool = False
    typed: bool = True


def survey(body) -> History:
    """The History of a Messages body (anything but an object has none). Pure."""
    msgs = body.get("messages") if isinstance(body, dict) else None
    kinds: set[str] = set()
    broken = cited = False
    typed = True
    for m in msgs if isinstance(msgs, list) else ():
        typed = typed and V.typed_role(m)
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        for b in content if isinstance(content, list) else ():
            if not isinstance(b, dict):
                continue
            t = b.get("type")
            if isinstance(t, str):
                kinds.add(t)
                broken = broken or (t == "tool_use" and mend.tool_use_broken(b))
            cited = cited or "citations" in b
    return History(frozenset(kinds), broken, cited, typed)


def has_server_blocks(body: dict, history: History | None = None) -> bool:
    return bool((history or survey(body)).kinds & server_blocks())


def needs_rewrite(body, history: History | None = None) -> bool:
    return isinstance(body, dict) and (bool(server_specs(body)) or has_server_blocks(body, history))


def validate(body: dict, history: History | None = None) -> str | None:
    """What makes a request the proxy must rewrite unusable, or None (`history`: its survey, when made already)."""
    history = history or survey(body)
    if not isinstance(body.get("messages"), list) or (
            not history.typed and not all(isinstance(m, dict) for m in body["messages"])):
        return "messages: must be an array of message objects"
    if body.get("tools") is not None and (not isinstance(body["tools"], list)
                                          or not all(isinstance(t, dict) for t in body["tools"])):
        return "tools: must be an array of tool objects"
    specs = server_specs(body)
    for tool, spec in specs.items():
        row = SERVER_TOOLS[tool]
        problem = _spec_problem(tool, spec, row.counts)
        if problem is None and row.cites and spec.get("citations") is not None and not isinstance(spec["citations"], dict):
            problem = f"tools: {tool} citations must be an object like {{\"enabled\": true}}"
        if problem:
            return problem
    try:
        _check_types(body, history)
    except V.Invalid as e:
        return e.anthropic_message
    return None


def _check_types(body: dict, history: History) -> None:
    """The fields the rewrite reads (names, ids, domains, tool_choice, replayed server blocks) are of
    the JSON type it reads them as, or V.Invalid names the first that is not."""
    V.boolean(body.get("stream"), "stream")
    if not history.typed:
        V.roles(body["messages"], "messages", sep=".")  # given() looks roles up
    sub = subrequest(body)
    if sub is not None:  # Claude Code's query goes into SearXNG's URL as the client wrote it
        V.encodable(sub[1], "messages.0.content" + (".0.text" if isinstance(body["messages"][0].get("content"), list) else ""))
    for i, tool in enumerate(body.get("tools") or []):
        V.fields(tool, f"tools.{i}", name=V.string, type=V.string)
        if is_server_tool(tool):
            V.fields(tool, f"tools.{i}", allowed_domains=V.strings, blocked_domains=V.strings)
    if isinstance(body.get("tool_choice"), dict):
        V.fields(body["tool_choice"], "tool_choice", type=V.string, name=V.string)
    kinds = server_blocks()
    if not history.kinds & kinds:
        return  # history without server blocks goes to vLLM as it is: vLLM judges it
    for i, msg in enumerate(body["messages"]):
        content = msg.get("content")
        if not (isinstance(content, list) and any(V.kind(b) in kinds for b in content)):
            continue  # history without server blocks goes to vLLM as it is: vLLM judges it
        for j, block in enumerate(content):
            at = f"messages.{i}.content.{j}"
            block = V.obj(block, at)
            V.fields(block, at, type=V.string, id=V.string, tool_use_id=V.string, name=V.string)
            row = row_for_result(block.get("type"))
            if block.get("type") == "server_tool_use":
                V.fields(block, at, input=V.obj)
            elif row is not None and not (row.result_list and isinstance(block.get("content"), list)):
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


def subrequest(body: dict) -> tuple[str, str] | None:
    """(tool, text) of Claude Code's sub-request for one server tool (only that tool, and one user message
    `<the row's subrequest prefix><text>`, e.g. `Perform a web search for the query: <q>`), else None."""
    tools, msgs = body.get("tools") or [], body.get("messages") or []
    row = server_row(tools[0]) if len(tools) == 1 else None
    if row is None or row.subrequest is None or len(msgs) != 1 or msgs[0].get("role") != "user":
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
    prefix = row.subrequest[0]
    if isinstance(content, str) and content.startswith(prefix):
        return row.tool, content[len(prefix):]
    return None


def subrequest_query(body: dict) -> str | None:
    """The text of Claude Code's sub-request (the <q> of a search's), else None."""
    found = subrequest(body)
    return found[1] if found is not None else None


def served_model_for(model, served: list[str] | None) -> str | None:
    """The served model to use instead of an unknown `model` (ANTHROPIC_ANY_MODEL), or None."""
    if not served or model in served:
        return None
    return served[0]


# ---- the rewrite ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolPlan:
    """One server tool the client offered, as the proxy runs it: its tool, its name on the vLLM side, and the
    client's options (max_uses; domain filters and a page's token budget as Limits; citations)."""
    tool: str                        # the registry name
    name: str                        # the function's name on the vLLM side
    max_uses: int | None = None
    limits: Limits = NO_LIMITS
    citations: dict | None = None    # echoed in each document; {"enabled": true}: pages are cited (char_location)


@dataclass
class MessagesPlan:
    """How one rewritten request runs the server tools."""
    names: dict[str, str]            # every row's tool -> its vLLM-side name (replayed history uses them too)
    offered: dict[str, ToolPlan] = field(default_factory=dict)  # by vLLM-side name: the server tools in `tools`
    client_tools: bool = False       # ordinary tools besides the server tools

    def ours(self) -> set[str]:
        """The vLLM-side names of the calls the proxy runs itself."""
        return set(self.offered)

    def plan_of(self, tool) -> ToolPlan | None:
        """The offered server tool a registry name names, or None."""
        return next((tp for tp in self.offered.values() if tp.tool == tool), None)

    @property
    def cites_pages(self) -> bool:
        """Pages read are cited (char_location) only when their server tool asks for it, as at Anthropic."""
        return any(SERVER_TOOLS[tp.tool].cites and as_dict(tp.citations).get("enabled") is True
                   for tp in self.offered.values())


def internal_name(tools, base: str | None = None) -> str:
    """A tool's own name (`base`; the table's first, web_search, when None), unless the client has an ordinary tool
    of that name: then a free variant."""
    base = base or next(iter(SERVER_TOOLS))
    taken = {t.get("name") for t in tools or [] if isinstance(t, dict) and not is_server_tool(t)}
    name, n = base, 1
    while name in taken:
        name = f"{base}_server" + (f"_{n}" if n > 1 else "")
        n += 1
    return name


def tool_plan(tool: str, name: str, spec: dict) -> ToolPlan:
    """One server tool's options as the proxy runs them. Pure."""
    limits = Limits(tuple(map(str, spec.get("allowed_domains") or ())), tuple(map(str, spec.get("blocked_domains") or ())),
                    spec.get("max_content_tokens"))
    return ToolPlan(tool, name, spec.get("max_uses"), limits, spec.get("citations"))


def vllm_tool(tp: ToolPlan) -> dict:
    """A server tool as an ordinary tool for vLLM: the tool's description, with the client's filters said, and its
    schema."""
    tool, row = registry.tool(tp.tool), SERVER_TOOLS[tp.tool]
    desc = tool.description
    for domains, sentence in ((tp.limits.allowed_domains, row.scope[0]), (tp.limits.blocked_domains, row.scope[1])):
        if domains:
            desc += sentence.format(domains=", ".join(domains))
    return {"name": tp.name, "description": desc, "input_schema": tool.schema}


def rewrite(body: dict, cite: bool = True, kept: Kept = no_kept,
            history: History | None = None) -> tuple[dict, MessagesPlan]:
    """The request as vLLM accepts it: the server tools as ordinary tools, server blocks in
    history as tool_use/tool_result (`kept`: the live text of results their blocks cannot rebuild, by
    tool_use_id); every other field unchanged (`history`: its survey, when made already). Pure but for the lookup."""
    history = history or survey(body)
    tools = body.get("tools")
    names = {tool: internal_name(tools, tool) for tool in SERVER_TOOLS}
    offered = {names[t]: tool_plan(t, names[t], spec) for t, spec in server_specs(body).items()}
    plan = MessagesPlan(names, offered, client_tools=any(not is_server_tool(t) for t in tools or []))
    out = dict(body)
    if tools is not None:
        out["tools"] = [vllm_tool(plan.offered[names[row.tool]]) if (row := server_row(t)) is not None else t
                        for t in tools]
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and tc.get("type") == "tool":
        forced = plan.plan_of(tc.get("name"))
        if forced is not None and forced.name != forced.tool and not _client_has(tools, forced.tool):
            out["tool_choice"] = {**tc, "name": forced.name}
    served = has_server_blocks(body, history)
    if served:
        out["messages"] = rewrite_history(body["messages"], names, cite, kept)
    if served or history.cited:
        out["messages"] = citations.without_citations(out["messages"])  # an earlier answer's cited text blocks
    return out, plan


def _client_has(tools, name) -> bool:
    return any(isinstance(t, dict) and not is_server_tool(t) and t.get("name") == name for t in tools or [])


# ---- the calls the proxy runs and the turns after the first ---------------------------------

def tool_request(call: dict, plan: MessagesPlan) -> Request:
    """A call of the model's as the session runs it: parsed by the tool its vLLM-side name stands for, with the
    client's options for that server tool. Pure."""
    tp = plan.offered[str(call.get("name"))]
    return registry.parse(tp.tool, call.get("input"), tp.limits)


def next_request(body: dict, messages: list[dict], plan: MessagesPlan) -> dict:
    """The following turn: longer history; a choice that forces searching is relaxed after the
    first round so the model writes its answer instead of searching forever."""
    out = {**body, "messages": messages}
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and ((tc.get("type") == "tool" and tc.get("name") in plan.ours() | set(plan.names.values()))
                                 or (tc.get("type") == "any" and not plan.client_tools)):
        out["tool_choice"] = {k: v for k, v in tc.items() if k == "disable_parallel_tool_use"} | {"type": "auto"}
    return out


def shortcut_turn(sub: tuple[str, str], plan: MessagesPlan) -> list[dict]:
    """The tool call the model would have written for Claude Code's sub-request (`sub`: subrequest's answer)."""
    tool, text = sub
    row = SERVER_TOOLS[tool]
    arg = row.subrequest[1] if row.subrequest else "query"
    return [{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": plan.names[tool], "input": {arg: text}}]
