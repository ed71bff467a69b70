"""The pure rules of /v1/chat/completions with the proxy's tools (validation, which tools to inject
and their definitions, forced tool_choice, the proxy's own calls, usage over turns, the messages
and request of the next turn), tested without a network by tests/run.sh tests/test_rules.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from proxy.apis import citations, mend
from proxy.apis.chat.presentation import CHAT_TOOLS
from proxy.core import codec
from proxy.core import validate as V
from proxy.tools import registry
from proxy.tools.base import NOT_EXECUTED
from proxy.tools.sources import Sources, numbered


def chat_tool(name: str) -> dict:
    """A proxy tool as a chat function definition: the tool's own name, description and schema."""
    tool = registry.tool(name)
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.schema}}


@dataclass(frozen=True)
class Survey:
    """What the handler's readers ask of a request's `messages`, found in one pass over them (a 1 MB history holds
    ~600, and each reader walking them again cost a tenth of a millisecond): whether every message is an object whose
    role is a string (else validate names the first that is not), whether a tool call's arguments need mending
    (mend.chat), whether annotations need taking off (citations.without_annotations)."""
    typed: bool = True
    broken_calls: bool = False
    annotated: bool = False


def survey(body) -> Survey:
    """The Survey of a chat body (anything without a `messages` array has nothing to find). Pure."""
    messages = body.get("messages") if isinstance(body, dict) else None
    typed, broken, noted = True, False, False
    for m in messages if isinstance(messages, list) else ():
        typed = typed and V.typed_role(m)
        if not isinstance(m, dict):
            continue
        calls = m.get("tool_calls")
        broken = broken or (isinstance(calls, list) and any(map(mend.chat_call_broken, calls)))
        if not noted and (m.get("annotations") is not None or isinstance(m.get("content"), list)):  # text: no
            noted = citations.annotated(m)
    return Survey(typed, broken, noted)


def validate(body, history: Survey | None = None) -> tuple[str, str | None] | None:
    """(message, param) when the body is not a chat request vLLM could take, or has a field the
    proxy reads of the wrong JSON type; else None (`history`: its survey, when made already)."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object.", None
    if not isinstance(body.get("messages"), list):
        return "`messages` must be an array of message objects.", "messages"
    history = history or survey(body)
    if not history.typed and not all(isinstance(m, dict) for m in body["messages"]):
        return "Every entry of `messages` must be an object.", "messages"
    if "tools" in body and body["tools"] is not None:
        if not isinstance(body["tools"], list) or not all(isinstance(t, dict) for t in body["tools"]):
            return "`tools` must be an array of tool objects.", "tools"
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        return "`stream` must be true or false.", "stream"
    if "stream_options" in body and body["stream_options"] is not None and not isinstance(body["stream_options"], dict):
        return "`stream_options` must be an object.", "stream_options"
    if "tool_choice" in body and not isinstance(body["tool_choice"], (str, dict, type(None))):
        return "`tool_choice` must be a string or an object.", "tool_choice"
    try:
        if not history.typed:
            V.roles(body["messages"], "messages")  # given() and the citations' reader look roles up
        # The names the proxy compares with its own tools' (tool_name, forced_tool).
        for i, tool in enumerate(body.get("tools") or []):
            V.string(tool.get("name"), f"tools[{i}].name")
            V.string(V.obj(tool.get("function"), f"tools[{i}].function").get("name"), f"tools[{i}].function.name")
        if isinstance(body.get("tool_choice"), dict):
            choice = V.obj(body["tool_choice"].get("function"), "tool_choice.function")
            V.string(choice.get("name"), "tool_choice.function.name")
    except V.Invalid as e:
        return e.openai_message, e.param
    return None


def tool_name(tool: dict) -> str | None:
    """The name of one of the client's tool definitions (a function's, or a bare tool's)."""
    fn = tool.get("function")
    return fn.get("name") if isinstance(fn, dict) else tool.get("name")


def tools_to_inject(body: dict, offered: tuple[str, ...] = tuple(CHAT_TOOLS)) -> tuple[str, ...]:
    """The names of the proxy's tools this request gets, of those its settings offer (presentation.offered), none
    when adding one would change what the client asked for. Pure.

    None when the client forbids tools (tool_choice "none") or asks for several choices (a loop
    can only follow one); each offered tool unless the client has a tool of that name (its calls are its own).
    """
    if body.get("tool_choice") == "none" or (body.get("n") or 1) != 1:
        return ()
    theirs = {tool_name(t) for t in body.get("tools") or []}
    # The same tools from the proxy's own MCP server, as the client offers them (mcp__stack__web_search): a second
    # copy would only make the model choose between two names for one search.
    theirs |= {registry.mcp_copy(tool_name(t), tool_description(t)) for t in body.get("tools") or []}
    return tuple(name for name in offered if name not in theirs)


def tool_description(tool: dict) -> str | None:
    """The description of one of the client's tool definitions (a function's, or a bare tool's)."""
    fn = tool.get("function")
    return fn.get("description") if isinstance(fn, dict) else tool.get("description")


def with_tools(body: dict, names) -> dict:
    """A copy of the request with the proxy's named tools added; every other field as it was."""
    return {**body, "tools": list(body.get("tools") or []) + [chat_tool(n) for n in names]}


def forced_tool(tool_choice) -> str | None:
    """The function a tool_choice forces, if it forces one."""
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        return tool_choice["function"].get("name")
    return None


def forces_proxy_tool(tool_choice) -> bool:
    """Whether a tool_choice forces one of the proxy's tools (forced once, then \"auto\")."""
    return forced_tool(tool_choice) in CHAT_TOOLS


def call_name(call: dict):
    """The function a tool call calls."""
    return (call.get("function") or {}).get("name")


def is_proxy_call(call: dict, ours: tuple[str, ...]) -> bool:
    """Whether the proxy runs this call: one of its injected tools (`ours`)."""
    return call_name(call) in ours


def tool_request(call: dict):
    """A call of the proxy's as the tool session runs it, parsed by the tool it names."""
    return registry.parse(call_name(call), (call.get("function") or {}).get("arguments"))


def add_usage(total: dict | None, turn: dict | None) -> dict | None:
    """Sum two usage objects: token counts add, reasoning and cached tokens add, the rest is the latest."""
    if not turn:
        return total
    if not total:
        return codec.loads(codec.dumps(turn))
    out = dict(turn)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        out[key] = (total.get(key) or 0) + (turn.get(key) or 0)
    # Reasoning tokens add, and so do the prompt tokens the prefix cache served (--enable-prompt-tokens-details).
    for details, key in (("completion_tokens_details", "reasoning_tokens"), ("prompt_tokens_details", "cached_tokens")):
        a = (total.get(details) or {}).get(key)
        b = (turn.get(details) or {}).get(key)
        if a is not None or b is not None:
            out[details] = {**(turn.get(details) or {}), key: (a or 0) + (b or 0)}
    return out


def assistant_turn(message: dict) -> dict:
    """The assistant message to append, as vLLM wrote it: reasoning stays so the chat
    template decides what the model sees again; the response-only null fields go."""
    out = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": c.get("id"), "type": "function",
                              "function": {"name": (c.get("function") or {}).get("name"),
                                           "arguments": (c.get("function") or {}).get("arguments") or ""}}
                             for c in message["tool_calls"]]
    for key in ("reasoning", "reasoning_content"):
        if message.get(key):
            out[key] = message[key]
    return out


def tool_results(calls: list[dict], outcomes: list, ours=tuple(CHAT_TOOLS),
                 sources: Sources | None = None) -> list[dict]:
    """One tool message per call, in order: the proxy's results (of the calls named in `ours`,
    in `outcomes`' order, their sources numbered for citing), or the not-executed stub."""
    found = iter(outcomes)
    return [{"role": "tool", "tool_call_id": c.get("id"),
             "content": numbered(sources, o := next(found), registry.text(o)) if is_proxy_call(c, ours)
             else NOT_EXECUTED}
            for c in calls]


def next_request(body: dict, messages: list[dict]) -> dict:
    """The following turn: same request, longer history; a forced proxy tool is forced once."""
    out = {**body, "messages": messages}
    if forces_proxy_tool(body.get("tool_choice")):
        out["tool_choice"] = "auto"
    return out


def completion_calls(data: dict) -> list | None:
    """The tool calls of a chat completion's first choice, or None when it isn't one. Pure."""
    try:
        choice = (data.get("choices") or [{}])[0]
        calls = (choice.get("message") or {}).get("tool_calls") or []
    except (AttributeError, TypeError, IndexError, KeyError):
        return None
    return calls if isinstance(calls, list) and all(isinstance(c, dict) for c in calls) else None
