"""The pure rules of what vLLM gets for a /v1/responses request with the hosted web_search tool
(which requests, validation, the ResponsesPlan, the internal tool definitions, replayed history, the first
request), tested without a network by tests/test_responses.py and tests/test_responses_fetch.py."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.apis import citations, mend
from proxy.apis.responses.presentation import HOSTED_ACTIONS, HOSTED_TYPES, first_row, row_for_action
from proxy.core import codec
from proxy.core import validate as V
from proxy.core.codec import as_dict
from proxy.tools import registry
from proxy.tools.base import PAGE

# The hosted tool also opens pages and finds text in them (OpenAI's `open_page` and `find_in_page` actions): each
# action is a proxy tool offered as a function beside the search (presentation.HOSTED_ACTIONS).
SOURCES = "web_search_call.action.sources"
# search_context_size -> results per search. Absent: SEARXNG_RESULTS (default 5).
CONTEXT_RESULTS = {"low": 3, "medium": 5, "high": 10}
# With allowed_domains most of a result page may be filtered out, so ask for a whole page
# (SearXNG's page is 10-30 hits) and cut to the result count after filtering.
FILTER_POOL = 30
# user_location.country (ISO 3166-1 alpha-2) -> SearXNG `language`: a locale, which also picks
# the region for engines that have one. Countries without one main language stay unset.
COUNTRY_LANGUAGE = {
    "US": "en-US", "GB": "en-GB", "UK": "en-GB", "IE": "en-IE", "AU": "en-AU", "NZ": "en-NZ",
    "CA": "en-CA", "IN": "en-IN", "ZA": "en-ZA", "SG": "en-SG", "PH": "en-PH",
    "DE": "de-DE", "AT": "de-AT", "FR": "fr-FR", "IT": "it-IT", "ES": "es-ES", "MX": "es-MX",
    "AR": "es-AR", "CL": "es-CL", "CO": "es-CO", "PT": "pt-PT", "BR": "pt-BR", "NL": "nl-NL",
    "SE": "sv-SE", "NO": "nb-NO", "DK": "da-DK", "FI": "fi-FI", "PL": "pl-PL", "CZ": "cs-CZ",
    "SK": "sk-SK", "HU": "hu-HU", "RO": "ro-RO", "BG": "bg-BG", "GR": "el-GR", "TR": "tr-TR",
    "RU": "ru-RU", "UA": "uk-UA", "JP": "ja-JP", "KR": "ko-KR", "CN": "zh-CN", "TW": "zh-TW",
    "HK": "zh-HK", "ID": "id-ID", "TH": "th-TH", "VN": "vi-VN", "IL": "he-IL", "SA": "ar-SA",
    "EG": "ar-EG", "AE": "ar-AE",
}


@dataclass(frozen=True)
class ResponsesPlan:
    """What the client's hosted tool asked for, read once from the request. Pure data."""
    name: str                       # the internal function tool's name
    hosted: bool                    # a hosted tool is offered (the loop runs); else replay only
    results: int                    # hits per search the model reads
    language: str | None            # SearXNG `language`, from user_location.country
    allowed: tuple[str, ...]        # filters.allowed_domains
    sources: bool                   # include asks for web_search_call.action.sources
    client_tools: list | None       # as the client sent them, echoed back in the response
    client_tool_choice: object      # likewise; None when the client sent none
    # The functions the proxy runs itself, each the proxy tool it stands for, `name` first; the page tools are left
    # out without INJECT_WEB_FETCH or when the client has a function of the tool's name.
    functions: dict[str, str] = field(default_factory=dict)

    @property
    def search_limit(self) -> int:
        """Hits asked of SearXNG: a whole page when a domain filter will throw most away."""
        return max(self.results, FILTER_POOL) if self.allowed else self.results

    @property
    def internal(self) -> tuple[str, ...]:
        """The names of the functions the proxy runs itself: every other call is the client's."""
        return tuple(self.functions)


@dataclass(frozen=True)
class Survey:
    """What the handler's readers ask of a request's `input`, found in one pass over its items (a 1 MB history holds
    ~600, and each reader walking them again cost a tenth of a millisecond): whether every item is an object whose
    string fields are strings (else validate names the first that is not), whether it replays a web_search_call,
    whether a function_call's arguments need mending (mend.responses), whether annotations need taking off."""
    typed: bool = True
    replays: bool = False
    broken_calls: bool = False
    annotated: bool = False


def survey(body) -> Survey:
    """The Survey of a Responses body (a string `input`, or anything but an object, has nothing to find). Pure."""
    items = body.get("input") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return Survey()
    typed, replays, broken, noted = True, False, False, False
    for item in items:
        typed = typed and V.typed_item(item)
        if not isinstance(item, dict):
            continue
        get = item.get
        kind = get("type")
        if kind == "web_search_call":
            replays = True
        elif kind == "function_call" and not broken:
            broken = mend.mended_arguments(get("arguments")) is not None
        if not noted and (get("annotations") is not None or isinstance(get("content"), list)):  # a call or output: no
            noted = citations.annotated(item)
    return Survey(typed, replays, broken, noted)


def is_hosted(tool) -> bool:
    return V.kind(tool) in HOSTED_TYPES


def is_replayed_search(item) -> bool:
    return isinstance(item, dict) and item.get("type") == "web_search_call"


def validate(body, history: Survey | None = None) -> tuple[str, str | None] | None:
    """(message, param) when the body is not a Responses request the proxy can read, else None (`history`: its
    survey, when made already)."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object.", None
    if not isinstance(body.get("input"), (str, list)):
        return "`input` must be a string or an array of input items.", "input"
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        return "`tools` must be an array of tool objects.", "tools"
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        return "`stream` must be true or false.", "stream"
    include = body.get("include")
    if include is not None and not isinstance(include, list):
        return "`include` must be an array of strings.", "include"
    history = history or survey(body)
    try:
        if not history.typed:
            V.input_items(body["input"])  # names the first item that is not as the survey found
        _check_types(body, history)
    except V.Invalid as e:
        return e.openai_message, e.param
    return None


def _check_types(body: dict, history: Survey) -> None:
    """The fields the rewrite reads (tool types and names, the hosted tool's filters, tool_choice,
    replayed web_search_call items) are of the JSON type it reads them as, or V.Invalid names
    the first that is not."""
    for i, tool in enumerate(body.get("tools") or []):
        V.fields(tool, f"tools[{i}]", type=V.string)
        if tool.get("type") == "namespace":
            for j, sub in enumerate(V.objects(tool.get("tools"), f"tools[{i}].tools")):
                V.fields(sub, f"tools[{i}].tools[{j}]", type=V.string)
        if is_hosted(tool):
            filters = V.obj(tool.get("filters"), f"tools[{i}].filters")
            V.fields(filters, f"tools[{i}].filters", allowed_domains=V.strings)
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        V.fields(choice, "tool_choice", type=V.string, name=V.string, mode=V.string)
        if choice.get("type") == "allowed_tools":
            for j, tool in enumerate(V.objects(choice.get("tools"), "tool_choice.tools")):
                V.fields(tool, f"tool_choice.tools[{j}]", type=V.string)
    for i, item in enumerate(body["input"] if history.replays else ()):
        if is_replayed_search(item):
            V.fields(item, f"input[{i}]", id=V.string, status=V.string)
            action = V.obj(item.get("action"), f"input[{i}].action")
            V.fields(action, f"input[{i}].action", type=V.string, query=V.string, queries=V.strings,
                     url=V.string, pattern=V.string, sources=V.objects)


def needs_rewrite(body: dict, history: Survey | None = None) -> bool:
    """A hosted web search tool is offered, or the history replays a web_search_call (`history`: its survey)."""
    tools = body.get("tools")
    if isinstance(tools, list) and any(is_hosted(t) for t in tools):
        return True
    return (history or survey(body)).replays


def refusal(body: dict) -> tuple[str, str] | None:
    """(message, param) for a searching request the loop cannot serve correctly, else None.

    The loop's turns are separate vLLM responses; the one the client receives exists nowhere
    as a whole, so nothing can continue from it or run it detached.
    """
    tools = body.get("tools")
    if not (isinstance(tools, list) and any(is_hosted(t) for t in tools)):
        return None
    if body.get("previous_response_id"):
        return ("`previous_response_id` can't be used with the web_search tool: the proxy runs the "
                "search loop and keeps no responses. Send the whole conversation in `input` "
                "(with `store: false`, as Codex does).", "previous_response_id")
    if body.get("background"):
        return ("`background` can't be used with the web_search tool: the proxy runs the search "
                "loop inside the request.", "background")
    return None


def tool_names(tools) -> set[str]:
    """Every function name vLLM will see for the client's tools (namespaces flattened as vLLM does)."""
    names = set()
    for t in tools or []:
        if t.get("type") in ("function", "custom") and isinstance(t.get("name"), str):
            names.add(t["name"])
        elif t.get("type") == "namespace":
            for sub in t.get("tools") or []:
                if isinstance(sub, dict) and isinstance(sub.get("name"), str):
                    names.add(f"{t.get('name')}__{sub['name']}")
    return names


def function_name(tool: str, taken: set[str]) -> str | None:
    """The function a proxy tool is offered as: its own name, unless the client has a function of that name; then its
    row's fallback (numbered until free), or None: the client's tool does that job and the model is not shown two
    tools for one."""
    if tool not in taken:
        return tool
    fallback = HOSTED_ACTIONS[tool].fallback
    if fallback is None:
        return None
    name, n = fallback, 2
    while name in taken:
        name, n = f"{fallback}_{n}", n + 1
    return name


def internal_name(tools) -> str:
    """The first action's function (`web_search`, or its fallback when the client has a function of that name)."""
    return function_name(first_row().tool, tool_names(tools)) or first_row().tool


def hosted_functions(tools, pages: bool) -> dict[str, str]:
    """The functions offered for the hosted tool, each the proxy tool it runs: every action's, the ones that read
    pages only when `pages` (INJECT_WEB_FETCH)."""
    taken, out = tool_names(tools), {}
    for row in HOSTED_ACTIONS.values():
        name = function_name(row.tool, taken)
        if name is not None and (pages or registry.tool(row.tool).kind != PAGE):
            out[name] = row.tool
    return out


def offers_mcp_reader(tools) -> bool:
    """Whether the client's tools include the page reader of the proxy's own MCP server (registry.mcp_copy), as a
    function or inside a namespace (Codex 0.171.0 sends a server's tools as namespace `mcp__<server>`). Pure."""
    for t in tools if isinstance(tools, list) else ():
        if not isinstance(t, dict):
            continue
        namespaced = t.get("type") == "namespace" and isinstance(t.get("tools"), list)
        inner = t["tools"] if namespaced else [t]
        prefix = f"{t.get('name')}__" if namespaced else ""
        for f in inner:
            copy = registry.mcp_copy(prefix + str(f.get("name")), f.get("description")) if isinstance(f, dict) else None
            if copy is not None and registry.tool(copy).kind == PAGE:
                return True
    return False


def language_for(location) -> str | None:
    if not isinstance(location, dict) or not isinstance(location.get("country"), str):
        return None
    return COUNTRY_LANGUAGE.get(location["country"].strip().upper())


def result_count(size, default: int) -> int:
    return CONTEXT_RESULTS.get(size, default) if isinstance(size, str) else default


def make_plan(body: dict, default_results: int, fetch: bool = True) -> ResponsesPlan:
    """`fetch`: whether the hosted tool may read pages here (INJECT_WEB_FETCH)."""
    tools = body.get("tools") or []
    hosted = next((t for t in tools if is_hosted(t)), None)
    spec = hosted or {}
    filters = as_dict(spec.get("filters"))
    allowed = filters.get("allowed_domains") or ()
    # A client that offers this stack's MCP page reader (Codex's mcp__<server>__web_fetch) already has one.
    functions = hosted_functions(tools, fetch and not offers_mcp_reader(tools)) if hosted is not None else {}
    return ResponsesPlan(name=internal_name(tools), hosted=hosted is not None,
                results=result_count(spec.get("search_context_size"), default_results),
                language=language_for(spec.get("user_location")),
                allowed=tuple(str(d) for d in allowed if d),
                sources=SOURCES in (body.get("include") or []),
                client_tools=body.get("tools"), client_tool_choice=body.get("tool_choice"), functions=functions)


def function_tool(name: str, tool: str) -> dict:
    """A proxy tool as a Responses function under `name`: the tool's own description and schema."""
    t = registry.tool(tool)
    return {"type": "function", "name": name, "description": t.description, "parameters": t.schema}


def internal_tools(plan: ResponsesPlan) -> list[dict]:
    """The functions vLLM sees for the hosted tool: search, and reading pages when offered."""
    return [function_tool(name, tool) for name, tool in plan.functions.items()]


def rewrite_tools(tools: list, plan: ResponsesPlan) -> list:
    """The hosted tool becomes the internal functions, in its place; further hosted entries go."""
    out, done = [], False
    for t in tools:
        if is_hosted(t):
            if not done:
                out += internal_tools(plan)
                done = True
            continue
        out.append(t)
    return out


def rewrite_tool_choice(choice, name: str, page_names: tuple[str, ...] = ()):
    """A choice forcing the hosted tool forces its search (`name`); an allowed_tools list naming
    it allows the page functions too (the hosted tool opens pages); everything else as sent."""
    if is_hosted(choice):
        return {"type": "function", "name": name}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools" and isinstance(choice.get("tools"), list):
        tools: list = []
        for t in choice["tools"]:
            tools += [{"type": "function", "name": n} for n in (name, *page_names)] if is_hosted(t) else [t]
        return {**choice, "tools": tools}
    return choice


def rewrite_include(include: list) -> list:
    """vLLM 0.32 validates `include` against a closed list without the web_search_call
    entries, so those stay with the proxy (which honours them itself)."""
    return [i for i in include if not (isinstance(i, str) and i.startswith("web_search_call."))]


def replayed_call(item: dict, plan: ResponsesPlan) -> tuple[str, dict, str]:
    """(function, arguments, output) standing for one earlier web_search_call. Pure.

    A call is replayed as a call of the function its action's tool is offered as in this request, so the model
    sees what it did in the words of its tools; when this request has no such function (or the item lacks what
    that tool needs) it is told as the first action's (a search for the URL), so no call names a tool the model
    does not have.
    """
    action, failed = as_dict(item.get("action")), item.get("status") == "failed"
    row = row_for_action(action.get("type"))
    by_tool = {tool: name for name, tool in plan.functions.items()}
    told = row.replayed(action, failed) if row is not None and row.tool in by_tool else None
    if row is None or told is None:
        row, told = first_row(), first_row().replayed(action, failed)
    arguments, output = told or ({}, "")
    return by_tool.get(row.tool, plan.name), arguments, output


Kept = Callable[[str], "dict[str, str] | None"]  # what the model read of a call, by its web_search_call id


def kept_call(item: dict, kept: Kept) -> tuple[str, str, str] | None:
    """(function, arguments text, output) exactly as the model read them when the call ran, if this worker still
    keeps them (services.KeptResults). Pure but for the lookup."""
    record = kept(item["id"]) if isinstance(item.get("id"), str) else None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("name", "arguments", "output")):
        return None
    return record["name"], record["arguments"], record["output"]


def replay(items: list, plan: ResponsesPlan, kept: Kept = lambda _: None) -> list:
    """web_search_call items (which vLLM rejects) as the function_call and output pair vLLM takes: the very call
    and result the model read when it ran, while `kept` has them; else what the client kept of it."""
    out = []
    for i, item in enumerate(items):
        if not is_replayed_search(item):
            out.append(item)
            continue
        call_id = item.get("id") or f"ws_replay_{i}"
        record = kept_call(item, kept)
        if record is None:
            function, arguments, output = replayed_call(item, plan)
            record = function, codec.arguments_text(arguments), output
        out.append({"type": "function_call", "call_id": call_id, "name": record[0], "arguments": record[1]})
        out.append({"type": "function_call_output", "call_id": call_id, "output": record[2]})
    return out


def first_request(body: dict, plan: ResponsesPlan, kept: Kept = lambda _: None, history: Survey | None = None) -> dict:
    """The body vLLM gets on the first turn; every field not named here as the client sent it (`history`: the body's
    survey, when made already). An input it leaves alone stays the same list, so codec.encoded_over sends its bytes."""
    out = dict(body)
    history = history or survey(body)
    if history.annotated:
        out["input"] = citations.without_annotations(body["input"])
    if history.replays:
        out["input"] = replay(out["input"], plan, kept)
    if isinstance(body.get("include"), list):
        out["include"] = rewrite_include(body["include"])
    if plan.hosted:
        out["tools"] = rewrite_tools(body["tools"], plan)
        if "tool_choice" in body:
            out["tool_choice"] = rewrite_tool_choice(body["tool_choice"], plan.name, plan.internal[1:])
        # The client's response is assembled from several vLLM responses, none of which is
        # it; storing them would only hand out ids that resume from half a conversation.
        out["store"] = False
    return out
