"""POST /v1/responses (OpenAI's Responses API, Codex): the hosted web_search tool, run by the
proxy as function tools on vLLM's own /v1/responses (a search, and reading a page or finding
text in it, which the client sees as the hosted tool's `open_page` and `find_in_page`
actions); every other Responses request stays on the transparent relay.

Used by proxy.app; not run on its own. The rules (which requests, the rewrite, replayed
history, how turns, items and usage add up) are pure functions at the top, tested without a
network by tests/test_responses.py; below them, the dialects that proxy.loop drives, the
streamed one numbering its events with proxy/responses_stream.py.
"""
from __future__ import annotations

import copy
import re
import uuid
from dataclasses import dataclass, replace

from flask import Response

from . import citations, codec, loop
from . import validate as V
from .codec import as_dict, as_list
from .errors import error_response
from .exchange import Exchange
from .fetch import (
    FETCH_TOOL_DESCRIPTION,
    URL_SCHEMA,
    FetchOutcome,
    FetchRequest,
    format_page_for_model,
    parse_fetch_arguments,
)
from .responses_stream import ClientStream, Turn, is_client_call
from .search import (
    NOT_EXECUTED,
    QUERY_SCHEMA,
    TOOL_DESCRIPTION,
    SearchOutcome,
    filter_domains,
    format_for_model,
    parse_arguments,
)
from .tools import ToolSession

PATH = "/v1/responses"
HOSTED_TYPES = frozenset({"web_search", "web_search_2025_08_26", "web_search_preview",
                          "web_search_preview_2025_03_11"})
WEB_SEARCH = "web_search"
# The name the internal function takes when the client has a `web_search` function of its own.
FALLBACK_NAME = "web_search_hosted"
# The hosted tool also opens pages and finds text in them (OpenAI's `open_page` and
# `find_in_page` actions); the proxy offers both as functions beside the search, under these
# names, unless the client has tools of those names (then reading pages is the client's).
WEB_FETCH = "web_fetch"
FIND_IN_PAGE = "find_in_page"
FIND_TOOL_DESCRIPTION = (
    "Find a piece of text in a web page: gives each place the text occurs on the page at that URL, "
    "with the words around it. Cheaper than reading the whole page when you only need one fact from it.")
FIND_SCHEMA = {"type": "object",
               "properties": {"url": {"type": "string", "description": "The full http:// or https:// URL of the page."},
                              "pattern": {"type": "string", "description": "The text to look for (not case-sensitive)."}},
               "required": ["url", "pattern"]}
FIND_MATCHES = 10       # places shown per find_in_page call
FIND_CONTEXT = 200      # characters shown on each side of a match
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
class Plan:
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


# ---- pure rules ---------------------------------------------------------------------------

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


def make_plan(body: dict, default_results: int, fetch: bool = True) -> Plan:
    """`fetch`: whether the hosted tool may read pages here (INJECT_WEB_FETCH)."""
    tools = body.get("tools") or []
    hosted = next((t for t in tools if is_hosted(t)), None)
    spec = hosted or {}
    filters = as_dict(spec.get("filters"))
    allowed = filters.get("allowed_domains") or ()
    fetch_name, find_name = page_tools(tools, fetch and hosted is not None)
    return Plan(name=internal_name(tools), hosted=hosted is not None,
                results=result_count(spec.get("search_context_size"), default_results),
                language=language_for(spec.get("user_location")),
                allowed=tuple(str(d) for d in allowed if d),
                sources=SOURCES in (body.get("include") or []),
                client_tools=body.get("tools"), client_tool_choice=body.get("tool_choice"),
                fetch_name=fetch_name, find_name=find_name)


def function_tool(name: str) -> dict:
    return {"type": "function", "name": name, "description": TOOL_DESCRIPTION, "parameters": QUERY_SCHEMA}


def internal_tools(plan: Plan) -> list[dict]:
    """The functions vLLM sees for the hosted tool: search, and reading pages when offered."""
    out = [function_tool(plan.name)]
    if plan.fetch_name:
        out.append({"type": "function", "name": plan.fetch_name, "description": FETCH_TOOL_DESCRIPTION,
                    "parameters": URL_SCHEMA})
    if plan.find_name:
        out.append({"type": "function", "name": plan.find_name, "description": FIND_TOOL_DESCRIPTION,
                    "parameters": FIND_SCHEMA})
    return out


def rewrite_tools(tools: list, plan: Plan) -> list:
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


def replay(items: list, name: str, fetch_name: str | None = None, find_name: str | None = None) -> list:
    """web_search_call items (which vLLM rejects) as the function_call and output pair vLLM takes."""
    out = []
    for i, item in enumerate(items):
        if not is_replayed_search(item):
            out.append(item)
            continue
        function, arguments, output = replayed_call(item, name, fetch_name, find_name)
        call_id = item.get("id") or f"ws_replay_{i}"
        out.append({"type": "function_call", "call_id": call_id, "name": function,
                    "arguments": codec.arguments_text(arguments)})
        out.append({"type": "function_call_output", "call_id": call_id, "output": output})
    return out


def first_request(body: dict, plan: Plan) -> dict:
    """The body vLLM gets on the first turn; every field not named here as the client sent it."""
    out = dict(body)
    if isinstance(body.get("input"), list):
        out["input"] = replay(citations.without_annotations(body["input"]), plan.name, plan.fetch_name, plan.find_name)
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


def is_search_call(item, name: str) -> bool:
    return (isinstance(item, dict) and item.get("type") == "function_call"
            and item.get("name") == name and not item.get("namespace"))


def is_internal_call(item, plan: Plan) -> bool:
    """A call of one of the proxy's functions (search, open a page, find in a page): the proxy runs it."""
    return any(is_search_call(item, n) for n in plan.internal)


def search_calls(output, plan: Plan) -> list[dict]:
    return [i for i in output or [] if is_internal_call(i, plan)]


def shape(outcome: SearchOutcome, plan: Plan) -> SearchOutcome:
    """The client's filters and result count applied to what SearXNG found. Pure."""
    outcome = filter_domains(outcome, plan.allowed or None)
    if len(outcome.hits) > plan.results:
        outcome = SearchOutcome(**{**outcome.__dict__, "hits": outcome.hits[:plan.results]})
    return outcome


@dataclass(frozen=True)
class Found:
    """What one find_in_page call produced: the pattern, and the page fetch it looked in."""
    pattern: str
    fetched: FetchOutcome


def arguments_of(call: dict) -> dict:
    """A call's arguments as an object; {} when they are not one (the parsers say why)."""
    try:
        return as_dict(codec.tool_arguments(call.get("arguments")))
    except ValueError:
        return {}


FIND_USAGE = f'Call {FIND_IN_PAGE} with {{"url": "https://...", "pattern": "text"}}.'


def find_request(arguments) -> FetchRequest:
    """A find_in_page call as the fetch it needs, refused early when there is no pattern. Pure."""
    request = parse_fetch_arguments(arguments)
    if request.early is not None:
        # The fetch core's refusal tells how to call web_fetch; this call was find_in_page.
        said = request.early.message.replace('Call web_fetch with {"url": "https://..."}.', FIND_USAGE)
        return replace(request, early=replace(request.early, message=said))
    pattern = arguments_of({"arguments": arguments}).get("pattern")
    if not (isinstance(pattern, str) and pattern.strip()):
        return replace(request, early=FetchOutcome(request.url, error_code="invalid_tool_input",
                                                   message=f'Find failed: missing "pattern". {FIND_USAGE}'))
    return request


def tool_request(call: dict, plan: Plan):
    """A call of the proxy's as ToolSession.run takes it: a parsed query, or a fetch limited
    to the hosted tool's allowed_domains (which OpenAI's tool applies to opened pages too)."""
    arguments = call.get("arguments")
    if call.get("name") == plan.fetch_name:
        return replace(parse_fetch_arguments(arguments), allowed_domains=plan.allowed)
    if call.get("name") == plan.find_name:
        return replace(find_request(arguments), allowed_domains=plan.allowed)
    return parse_arguments(arguments)


def settle(call: dict, outcome, plan: Plan):
    """One call's outcome as the client and the model get it: searches shaped, finds paired with their pattern."""
    if isinstance(outcome, SearchOutcome):
        return shape(outcome, plan)
    if call.get("name") == plan.find_name:
        return Found(str(arguments_of(call).get("pattern") or "").strip(), outcome)
    return outcome


def run_searches(session: ToolSession, calls: list[dict], plan: Plan) -> list:
    """One round: every internal call of a turn (searches and page reads), concurrently."""
    outcomes = session.run([tool_request(c, plan) for c in calls], limit=plan.search_limit, language=plan.language)
    return [settle(c, o, plan) for c, o in zip(calls, outcomes, strict=True)]


def find_in_text(text: str, pattern: str, limit: int = FIND_MATCHES, context: int = FIND_CONTEXT) -> tuple[list[str], int]:
    """(up to `limit` excerpts around the places `pattern` occurs, how many places). Pure.

    The pattern is literal text, case-insensitive: a model-written regular expression could
    take exponential time. A match inside the previous excerpt adds no excerpt of its own.
    """
    spans = [m.span() for m in re.finditer(re.escape(pattern), text, re.IGNORECASE)] if pattern else []
    windows: list[tuple[int, int]] = []
    for a, b in spans:
        if windows and a < windows[-1][1]:
            continue
        windows.append((max(0, a - context), min(len(text), b + context)))
    excerpts = [("…" if lo else "") + " ".join(text[lo:hi].split()) + ("…" if hi < len(text) else "")
                for lo, hi in windows[:limit]]
    return excerpts, len(spans)


def format_found(found: Found) -> str:
    """What the model reads for a find_in_page call. Pure."""
    page = found.fetched.page
    if page is None:
        return found.fetched.message
    excerpts, count = find_in_text(page.text, found.pattern)
    cut = " (only the beginning of the page was searched: the rest is past the proxy's limit)" if page.truncated else ""
    if not excerpts:
        return f'"{found.pattern}" does not occur in {page.url} ({len(page.text)} characters searched){cut}.'
    head = f'"{found.pattern}" occurs {count} {"time" if count == 1 else "times"} in {page.url}' + (
        f' "{page.title}"' if page.title else "") + cut + ":"
    more = [f"(showing the first {len(excerpts)})"] if len(excerpts) < count else []
    return "\n".join([head] + [f"[{i}] {e}" for i, e in enumerate(excerpts, 1)] + more)


def tool_output(outcome) -> str:
    """The text the model reads for one internal call. Pure."""
    if isinstance(outcome, Found):
        return format_found(outcome)
    if isinstance(outcome, FetchOutcome):
        return format_page_for_model(outcome)
    return format_for_model(outcome)


def numbered_output(outcome, sources: citations.Sources | None) -> str:
    """tool_output with its sources numbered for citing (a find_in_page result is not a source of its own)."""
    return tool_output(outcome) if isinstance(outcome, Found) else citations.numbered(sources, outcome, tool_output(outcome))


def ws_id(call: dict) -> str:
    """The web_search_call id for an internal call: the same suffix as vLLM's fc_ id."""
    ident = call.get("id") or ""
    return "ws_" + (ident[3:] if ident.startswith("fc_") else uuid.uuid4().hex[:16])


def call_action(call: dict, plan: Plan) -> dict:
    """The action a call shows as, from its arguments alone (a stream shows it before it runs):
    `search` with its query, `open_page` with its URL, `find_in_page` with URL and pattern. Pure."""
    args = arguments_of(call)
    url, pattern = (v.strip() if isinstance(v, str) else "" for v in (args.get("url"), args.get("pattern")))
    if call.get("name") == plan.fetch_name:
        return {"type": "open_page", "url": url} if url else {"type": "open_page"}
    if call.get("name") == plan.find_name:
        return {"type": "find_in_page", "url": url, "pattern": pattern}
    return {"type": "search", "query": parse_arguments(call.get("arguments"))[0] or ""}


def web_search_item(call: dict, outcome, plan: Plan) -> dict:
    """The client's record of one call: failed only when SearXNG gave no usable answer, or
    the page could not be read."""
    if isinstance(outcome, SearchOutcome):
        action: dict[str, object] = {"type": "search", "query": outcome.query}
        if plan.sources:
            action["sources"] = [{"type": "url", "url": h.url} for h in outcome.hits]
        failed = outcome.status == "failed"
    else:
        action = call_action(call, plan)
        failed = not (outcome.fetched if isinstance(outcome, Found) else outcome).ok
    return {"id": ws_id(call), "type": "web_search_call", "status": "failed" if failed else "completed", "action": action}


def pending_item(call: dict, plan: Plan) -> dict:
    """A call's web_search_call as a stream announces it, before it has run. Pure."""
    return {"id": ws_id(call), "type": "web_search_call", "status": "in_progress", "action": call_action(call, plan)}


def visible_output(turn_output: list, plan: Plan, outcomes: dict) -> list:
    """A search turn's items as the client sees them: each internal call replaced by its
    web_search_call; the client's own calls of that turn were not run, so they go."""
    out = []
    for item in turn_output or []:
        if is_internal_call(item, plan):
            out.append(web_search_item(item, outcomes[item.get("call_id")], plan))
        elif not is_client_call(item):
            out.append(item)
    return out


def call_outputs(turn_output: list, plan: Plan, outcomes: dict, sources: citations.Sources | None = None) -> list:
    """One output item per call of the turn, in order: results, or the not-executed stub."""
    out = []
    for item in turn_output or []:
        if is_internal_call(item, plan):
            out.append({"type": "function_call_output", "call_id": item.get("call_id"),
                        "output": numbered_output(outcomes[item.get("call_id")], sources)})
        elif item.get("type") == "function_call":
            out.append({"type": "function_call_output", "call_id": item.get("call_id"), "output": NOT_EXECUTED})
        elif item.get("type") == "custom_tool_call":
            out.append({"type": "custom_tool_call_output", "call_id": item.get("call_id"), "output": NOT_EXECUTED})
    return out


def as_items(input_) -> list:
    return [{"role": "user", "content": input_}] if isinstance(input_, str) else list(input_)


def forced(choice, name: str) -> bool:
    """The choice makes the model call a tool this turn: after a search, that is satisfied."""
    if choice == "required":
        return True
    if isinstance(choice, dict):
        if choice.get("type") == "function" and choice.get("name") == name:
            return True
        return choice.get("type") == "allowed_tools" and choice.get("mode") == "required"
    return False


def next_request(request: dict, turn_output: list, plan: Plan, outcomes: dict,
                 sources: citations.Sources | None = None) -> dict:
    """The following turn: the turn's items and their outputs appended to `input`."""
    out = {**request, "input": as_items(request["input"]) + list(turn_output) + call_outputs(turn_output, plan, outcomes, sources)}
    if forced(request.get("tool_choice"), plan.name):
        out["tool_choice"] = "auto"
    return out


def add_usage(total, turn):
    """Sum two usage objects: counts add, per-turn lists concatenate, the rest is the latest."""
    if not turn:
        return total
    if not total:
        return copy.deepcopy(turn)
    return _sum(total, turn)


def _sum(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        merged = {k: (_sum(a[k], v) if k in a else v) for k, v in b.items()}
        return {**{k: v for k, v in a.items() if k not in b}, **merged}
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    return b if b is not None else a


def complete_usage(usage):
    """Usage with every count openai 3.57's ResponseUsage requires (0 where vLLM left one out: builds
    without prompt caching omit input_tokens_details.cache_write_tokens), so a strict typed client
    loads it; None (no usage) stays None. Pure."""
    if not isinstance(usage, dict):
        return usage
    out = {"input_tokens": 0, "output_tokens": 0, **usage}
    out.setdefault("total_tokens", (out["input_tokens"] or 0) + (out["output_tokens"] or 0))
    out["input_tokens_details"] = {"cached_tokens": 0, "cache_write_tokens": 0, **as_dict(usage.get("input_tokens_details"))}
    out["output_tokens_details"] = {"reasoning_tokens": 0, **as_dict(usage.get("output_tokens_details"))}
    return out


def client_view(response: dict, plan: Plan) -> dict:
    """A response object as the client should see it: its own tools echoed, not the function."""
    out = dict(response)
    if plan.hosted:
        out["tools"] = plan.client_tools
        if plan.client_tool_choice is not None:
            out["tool_choice"] = plan.client_tool_choice
    return out


def final_response(last: dict, first: dict, output: list, usage, plan: Plan) -> dict:
    """The one response the client receives: the first turn's id and created_at, the last
    turn's status, every visible item, usage summed over the turns."""
    out = client_view(last, plan)
    out["id"], out["created_at"] = first.get("id"), first.get("created_at")
    out["output"] = output
    out["usage"] = complete_usage(usage)
    return out


def failed_response(base: dict, output: list, usage, plan: Plan, code: str, message: str) -> dict:
    out = client_view(base, plan)
    out.update(status="failed", output=output, usage=complete_usage(usage), error={"code": code, "message": message})
    return out


# ---- the handler --------------------------------------------------------------------------

def handle(ex: Exchange) -> Response:
    try:
        body = codec.loads(ex.body)
    except (ValueError, UnicodeDecodeError):
        return ex.relay()  # not ours to judge: vLLM answers it in its own words
    if not isinstance(body, dict) or not needs_rewrite(body):
        return ex.relay()
    problem = validate(body) or refusal(body)
    if problem:
        return error_response(400, problem[0], param=problem[1])
    plan = make_plan(body, ex.cfg.searxng_results, ex.cfg.inject_web_fetch)
    request = first_request(body, plan)
    if not plan.hosted:
        # History only: the model has no search tool this time, so vLLM's answer is final.
        return ex.relay(codec.dumps(request))
    dialect = StreamedResponses if body.get("stream") else PlainResponses
    return loop.run(ex, dialect(ex, request, plan))


def vllm_error(status: int, raw: bytes) -> str:
    try:
        message = codec.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:300].decode("utf-8", "replace")
    return f"vLLM answered HTTP {status}: {message}"


# ---- the dialects: the search loop (proxy.loop) as the hosted web_search tool ----------------

class _Responses(loop.Dialect):
    """What both kinds of Responses request share: the search calls, the searches as the
    client's filters shape them, the next request."""

    path = PATH

    def __init__(self, ex: Exchange, request: dict, plan: Plan):
        super().__init__(ex, request)
        self.plan = plan
        self.usage: dict | None = None

    def searches(self, turn) -> list:
        return search_calls(turn.output, self.plan)

    def queries(self, calls: list) -> list:
        """(what the keep-alive names, None) per call: the query, or the page's URL."""
        return [r if isinstance(r, tuple) else (r.url, None) for r in (tool_request(c, self.plan) for c in calls)]

    def search(self, calls: list) -> list:
        return run_searches(self.session, calls, self.plan)

    def follow(self, turn, calls: list, outcomes: list) -> dict:
        """The next request: the turn's items and their outputs appended; the outcomes by call_id."""
        by_call = dict(zip([c.get("call_id") for c in calls], outcomes, strict=True))
        self.request = next_request(self.request, turn.output, self.plan, by_call, self.sources)
        return by_call

    def error_reply(self, status, message, type_=None) -> Response:
        return error_response(status, message, type_=type_)


class _Answer:
    """A whole response object, as a plain turn."""

    def __init__(self, data: dict):
        self.data, self.output = data, data.get("output") or []


class PlainResponses(loop.Plain, _Responses):
    """Non-streaming: one response holding every turn's visible items, usage summed."""

    name = "responses"

    def __init__(self, ex, request, plan):
        super().__init__(ex, request, plan)
        self.first: dict | None = None           # the first turn's response: its id and created_at are the client's
        self.output: list = []      # the visible items of the turns before the last

    def parse(self, up, raw, data) -> _Answer:
        self.first = self.first or data
        self.usage = add_usage(self.usage, data.get("usage"))
        return _Answer(data)

    def finish(self, turn: _Answer):
        output = citations.cited_items(self.output + list(turn.output), self.sources)
        result = final_response(turn.data, self.first or turn.data, output, self.usage, self.plan)
        yield Response(codec.dumps(result), status=200, mimetype="application/json")

    def record(self, turn: _Answer, calls, outcomes):
        self.output += visible_output(turn.output, self.plan, self.follow(turn, calls, outcomes))
        return ()


class StreamedResponses(loop.Stream, _Responses):
    """Streaming: vLLM's events live, the internal function_call held back and replaced by
    web_search_call events, every turn folded into one client stream."""

    name = "responses stream"

    def __init__(self, ex, request, plan):
        super().__init__(ex, request, plan)
        self.out = ClientStream(lambda response: client_view(response, plan))
        if self.sources is not None:
            self.out.citer = citations.Citer(self.sources, citations.url_citation)
        self.turn: Turn | None = None  # the latest turn: a failure shows its response
        self.placed: list = []         # (call, client output_index) of the round's searches

    def relay(self, up):
        turn = self.turn = Turn(self.session.rounds == 0)
        yield from self.out.relay(up, turn)
        if turn.error is not None:
            yield self.error(502, turn.error)
            return None
        if turn.response is None:
            yield self.error(502, "vLLM ended the stream early (no response.completed); the answer is incomplete")
            return None
        self.usage = add_usage(self.usage, turn.response.get("usage"))
        turn.output = turn.response.get("output") or []
        self.out.adopt(turn.output)
        return turn

    def finish(self, turn: Turn):
        yield from turn.flush(self.out)
        response = turn.response or {}  # relay returns a turn only once its response.completed came
        items = citations.cited_items(list(self.out.items), self.sources, self.out.citer.found if self.out.citer else None)
        final = final_response(response, self.out.first or response, items, self.usage, self.plan)
        yield self.out.emit({"type": "response.completed", "response": final, "sequence_number": 0})

    def announce(self, calls):
        """Each call shown starting (a search or a page read alike, as OpenAI shows page opens):
        its web_search_call item, in progress and searching."""
        self.placed, shown = [], []
        for call in calls:
            item = pending_item(call, self.plan)
            index = self.out.new_index(item)
            self.placed.append((call, index))
            shown += [self.out.emit({"type": kind, **fields, "output_index": index, "sequence_number": 0})
                      for kind, fields in (("response.output_item.added", {"item": item}),
                                           ("response.web_search_call.in_progress", {"item_id": item["id"]}),
                                           ("response.web_search_call.searching", {"item_id": item["id"]}))]
        return shown

    def record(self, turn: Turn, calls, outcomes):
        """Each search's result shown: completed (unless it failed), then its item done."""
        self.follow(turn, calls, outcomes)
        shown = []
        for (call, index), outcome in zip(self.placed, outcomes, strict=True):
            item = self.out.items[index] = web_search_item(call, outcome, self.plan)
            if item["status"] == "completed":
                shown.append(self.out.emit({"type": "response.web_search_call.completed", "item_id": item["id"],
                                            "output_index": index, "sequence_number": 0}))
            shown.append(self.out.emit({"type": "response.output_item.done", "item": item, "output_index": index,
                                        "sequence_number": 0}))
        return shown

    def error(self, status, message, type_=None) -> bytes:
        """The stream's end as a failed response with the items the client already saw, or a
        bare error event, as OpenAI sends, when no response was opened to fail."""
        code = type_ or "server_error"
        first = self.out.first
        if first is None:
            return self.out.emit({"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0})
        # ResponseError.code is a closed list in openai 3.57 (no room for the cap's own name): the name rides
        # in the message, so a strict typed client still loads the failed response.
        resp = failed_response((self.turn and self.turn.response) or first, list(self.out.items), self.usage,
                               self.plan, "server_error", message if type_ is None else f"{message} ({type_})")
        resp["id"], resp["created_at"] = first.get("id"), first.get("created_at")
        return self.out.emit({"type": "response.failed", "response": resp, "sequence_number": 0})

    def refused(self, status, raw) -> bytes:
        return self.error(status, vllm_error(status, raw))
