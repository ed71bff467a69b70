"""The pure rules of what vLLM gets for a /v1/responses request with the hosted web_search tool
(which requests, validation, the ResponsesPlan, the internal tool definitions, replayed history, the first
request), tested without a network by tests/test_responses.py and tests/test_responses_fetch.py."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proxy.apis import citations
from proxy.core import codec
from proxy.core import validate as V
from proxy.core.codec import as_dict, as_list
from proxy.tools import registry
from proxy.tools.registry import FIND_IN_PAGE, WEB_FETCH, WEB_SEARCH

HOSTED_TYPES = frozenset({"web_search", "web_search_2025_08_26", "web_search_preview",
                          "web_search_preview_2025_03_11"})
# The name the internal function takes when the client has a `web_search` function of its own.
FALLBACK_NAME = "web_search_hosted"
# The hosted tool also opens pages and finds text in them (OpenAI's `open_page` and
# `find_in_page` actions); the proxy offers both as functions beside the search, under these
# names, unless the client has tools of those names (then reading pages is the client's).
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
    fetch_name: str | None = None   # the internal page-reading function; None: not offered
    find_name: str | None = None    # the internal find-in-page function; None: not offered

    @property
    def search_limit(self) -> int:
        """Hits asked of SearXNG: a whole page when a domain filter will throw most away."""
        return max(self.results, FILTER_POOL) if self.allowed else self.results

    @property
    def internal(self) -> tuple[str, ...]:
        """The names of the functions the proxy runs itself: every other call is the client's."""
        return tuple(n for n in (self.name, self.fetch_name, self.find_name) if n)


def is_hosted(tool) -> bool:
    return V.kind(tool) in HOSTED_TYPES


def is_replayed_search(item) -> bool:
    return isinstance(item, dict) and item.get("type") == "web_search_call"


def validate(body) -> tuple[str, str | None] | None:
    """(message, param) when the body is not a Responses request the proxy can read, else None."""
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
    try:
        _check_types(body)
    except V.Invalid as e:
        return e.openai_message, e.param
    return None


def _check_types(body: dict) -> None:
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
    for i, item in enumerate(body["input"] if isinstance(body["input"], list) else ()):
        if is_replayed_search(item):
            V.fields(item, f"input[{i}]", id=V.string, status=V.string)
            action = V.obj(item.get("action"), f"input[{i}].action")
            V.fields(action, f"input[{i}].action", type=V.string, query=V.string, queries=V.strings,
                     url=V.string, pattern=V.string, sources=V.objects)


def needs_rewrite(body: dict) -> bool:
    """A hosted web search tool is offered, or the history replays a web_search_call."""
    tools = body.get("tools")
    if isinstance(tools, list) and any(is_hosted(t) for t in tools):
        return True
    return isinstance(body.get("input"), list) and any(is_replayed_search(i) for i in body["input"])


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


def internal_name(tools) -> str:
    """`web_search`, unless the client has a function of its own by that name."""
    taken = tool_names(tools)
    if WEB_SEARCH not in taken:
        return WEB_SEARCH
    name, n = FALLBACK_NAME, 2
    while name in taken:
        name, n = f"{FALLBACK_NAME}_{n}", n + 1
    return name


def page_tools(tools, enabled: bool) -> tuple[str | None, str | None]:
    """(fetch name, find name) for a request offering the hosted tool. Each is left out when
    INJECT_WEB_FETCH is off or the client has a tool of that name: a client that reads pages
    itself keeps its tool, and the model is not shown two tools for one job."""
    if not enabled:
        return None, None
    taken = tool_names(tools)
    return (None if WEB_FETCH in taken else WEB_FETCH), (None if FIND_IN_PAGE in taken else FIND_IN_PAGE)


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
    fetch_name, find_name = page_tools(tools, fetch and hosted is not None)
    return ResponsesPlan(name=internal_name(tools), hosted=hosted is not None,
                results=result_count(spec.get("search_context_size"), default_results),
                language=language_for(spec.get("user_location")),
                allowed=tuple(str(d) for d in allowed if d),
                sources=SOURCES in (body.get("include") or []),
                client_tools=body.get("tools"), client_tool_choice=body.get("tool_choice"),
                fetch_name=fetch_name, find_name=find_name)


def function_tool(name: str, tool: str = WEB_SEARCH) -> dict:
    """A proxy tool as a Responses function under `name`: the tool's own description and schema."""
    t = registry.tool(tool)
    return {"type": "function", "name": name, "description": t.description, "parameters": t.schema}


def internal_tools(plan: ResponsesPlan) -> list[dict]:
    """The functions vLLM sees for the hosted tool: search, and reading pages when offered."""
    out = [function_tool(plan.name)]
    if plan.fetch_name:
        out.append(function_tool(plan.fetch_name, WEB_FETCH))
    if plan.find_name:
        out.append(function_tool(plan.find_name, FIND_IN_PAGE))
    return out


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


def replayed_query(item: dict) -> str:
    action = as_dict(item.get("action"))
    if action.get("type") == "find_in_page":
        return f"{action.get('pattern') or ''} {action.get('url') or ''}".strip()
    queries = as_list(action.get("queries"))
    return str(action.get("query") or (queries[0] if queries else "") or action.get("url") or "")


def replayed_output(item: dict, query: str) -> str:
    """What the model reads for an earlier search: only what the client kept of it."""
    if item.get("status") == "failed":
        return f'Search failed for "{query}" (in an earlier turn).'
    action = as_dict(item.get("action"))
    urls = [s.get("url") for s in action.get("sources") or [] if isinstance(s, dict) and s.get("url")]
    if urls:
        return "\n".join([f'Search results for "{query}" (an earlier turn; only the URLs were kept):']
                         + [f"[{i}] {u}" for i, u in enumerate(urls, 1)])
    return (f'Searched for "{query}" in an earlier turn; the results are not kept in the '
            "conversation. Search again if you need them.")


def replayed_call(item: dict, name: str, fetch_name: str | None = None,
                  find_name: str | None = None) -> tuple[str, dict, str]:
    """(function, arguments, output) standing for one earlier web_search_call. Pure.

    A page opened (or searched in) becomes a call of the page function when this request
    offers one, so the model sees what it did in the words of its tools; without one it is
    told as a search for the URL, so no call names a tool it does not have.
    """
    action = as_dict(item.get("action"))
    kind, url, failed = action.get("type"), str(action.get("url") or ""), item.get("status") == "failed"
    if kind == "open_page" and fetch_name and url:
        return fetch_name, {"url": url}, (
            f"Opening {url} failed (in an earlier turn)." if failed else
            f"Opened {url} in an earlier turn; its text is not kept in the conversation. Open it again if you need it.")
    if kind == "find_in_page" and find_name and url:
        pattern = str(action.get("pattern") or "")
        return find_name, {"url": url, "pattern": pattern}, (
            f'Finding "{pattern}" in {url} failed (in an earlier turn).' if failed else
            f'Looked for "{pattern}" in {url} in an earlier turn; what was found is not kept in the '
            "conversation. Look again if you need it.")
    query = replayed_query(item)
    return name, {"query": query}, replayed_output(item, query)


Kept = Callable[[str], "dict[str, str] | None"]  # what the model read of a call, by its web_search_call id


def kept_call(item: dict, kept: Kept) -> tuple[str, str, str] | None:
    """(function, arguments text, output) exactly as the model read them when the call ran, if this worker still
    keeps them (services.KeptResults). Pure but for the lookup."""
    record = kept(item["id"]) if isinstance(item.get("id"), str) else None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("name", "arguments", "output")):
        return None
    return record["name"], record["arguments"], record["output"]


def replay(items: list, name: str, fetch_name: str | None = None, find_name: str | None = None,
           kept: Kept = lambda _: None) -> list:
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
            function, arguments, output = replayed_call(item, name, fetch_name, find_name)
            record = function, codec.arguments_text(arguments), output
        out.append({"type": "function_call", "call_id": call_id, "name": record[0], "arguments": record[1]})
        out.append({"type": "function_call_output", "call_id": call_id, "output": record[2]})
    return out


def first_request(body: dict, plan: ResponsesPlan, kept: Kept = lambda _: None) -> dict:
    """The body vLLM gets on the first turn; every field not named here as the client sent it."""
    out = dict(body)
    if isinstance(body.get("input"), list):
        out["input"] = replay(citations.without_annotations(body["input"]), plan.name, plan.fetch_name, plan.find_name,
                              kept)
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
