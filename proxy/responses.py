"""POST /v1/responses (OpenAI's Responses API, Codex): the hosted web_search tool, run by the
proxy as a function tool on vLLM's own /v1/responses; every other Responses request stays on
the transparent relay.

Used by proxy.app; not run on its own. The rules (which requests, the rewrite, replayed
history, how turns, items and usage add up) are pure functions at the top, tested without a
network by tests/test_responses.py; below them, the dialects that proxy.loop drives, the
streamed one numbering its events with proxy/responses_stream.py.
"""
from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass

from flask import Response

from . import jsonio, loop
from .errors import error_response
from .exchange import Exchange, encode_json
from .jsonio import as_dict, as_list
from .responses_stream import ClientStream, Turn, is_client_call
from .search import (
    NOT_EXECUTED,
    QUERY_SCHEMA,
    TOOL_DESCRIPTION,
    SearchOutcome,
    SearchSession,
    filter_domains,
    format_for_model,
    parse_arguments,
)

PATH = "/v1/responses"
HOSTED_TYPES = frozenset({"web_search", "web_search_2025_08_26", "web_search_preview",
                          "web_search_preview_2025_03_11"})
WEB_SEARCH = "web_search"
# The name the internal function takes when the client has a `web_search` function of its own.
FALLBACK_NAME = "web_search_hosted"
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

    @property
    def fetch_limit(self) -> int:
        return max(self.results, FILTER_POOL) if self.allowed else self.results


# ---- pure rules ---------------------------------------------------------------------------

def is_hosted(tool) -> bool:
    return isinstance(tool, dict) and tool.get("type") in HOSTED_TYPES


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
    return None


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


def language_for(location) -> str | None:
    if not isinstance(location, dict) or not isinstance(location.get("country"), str):
        return None
    return COUNTRY_LANGUAGE.get(location["country"].strip().upper())


def result_count(size, default: int) -> int:
    return CONTEXT_RESULTS.get(size, default) if isinstance(size, str) else default


def make_plan(body: dict, default_results: int) -> Plan:
    tools = body.get("tools") or []
    hosted = next((t for t in tools if is_hosted(t)), None)
    spec = hosted or {}
    filters = as_dict(spec.get("filters"))
    allowed = filters.get("allowed_domains") or ()
    return Plan(name=internal_name(tools), hosted=hosted is not None,
                results=result_count(spec.get("search_context_size"), default_results),
                language=language_for(spec.get("user_location")),
                allowed=tuple(str(d) for d in allowed if d),
                sources=SOURCES in (body.get("include") or []),
                client_tools=body.get("tools"), client_tool_choice=body.get("tool_choice"))


def function_tool(name: str) -> dict:
    return {"type": "function", "name": name, "description": TOOL_DESCRIPTION, "parameters": QUERY_SCHEMA}


def rewrite_tools(tools: list, name: str) -> list:
    """The hosted tool becomes the function tool, in its place; further hosted entries go."""
    out, done = [], False
    for t in tools:
        if is_hosted(t):
            if not done:
                out.append(function_tool(name))
                done = True
            continue
        out.append(t)
    return out


def rewrite_tool_choice(choice, name: str):
    """A choice naming the hosted tool names the function instead; everything else as sent."""
    if is_hosted(choice):
        return {"type": "function", "name": name}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools" and isinstance(choice.get("tools"), list):
        return {**choice, "tools": [{"type": "function", "name": name} if is_hosted(t) else t
                                    for t in choice["tools"]]}
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


def replay(items: list, name: str) -> list:
    """web_search_call items (which vLLM rejects) as the function_call and output pair vLLM takes."""
    out = []
    for i, item in enumerate(items):
        if not is_replayed_search(item):
            out.append(item)
            continue
        query = replayed_query(item)
        call_id = item.get("id") or f"ws_replay_{i}"
        out.append({"type": "function_call", "call_id": call_id, "name": name,
                    "arguments": json.dumps({"query": query}, ensure_ascii=False)})
        out.append({"type": "function_call_output", "call_id": call_id, "output": replayed_output(item, query)})
    return out


def first_request(body: dict, plan: Plan) -> dict:
    """The body vLLM gets on the first turn; every field not named here as the client sent it."""
    out = dict(body)
    if isinstance(body.get("input"), list):
        out["input"] = replay(body["input"], plan.name)
    if isinstance(body.get("include"), list):
        out["include"] = rewrite_include(body["include"])
    if plan.hosted:
        out["tools"] = rewrite_tools(body["tools"], plan.name)
        if "tool_choice" in body:
            out["tool_choice"] = rewrite_tool_choice(body["tool_choice"], plan.name)
        # The client's response is assembled from several vLLM responses, none of which is
        # it; storing them would only hand out ids that resume from half a conversation.
        out["store"] = False
    return out


def is_search_call(item, name: str) -> bool:
    return (isinstance(item, dict) and item.get("type") == "function_call"
            and item.get("name") == name and not item.get("namespace"))


def search_calls(output, name: str) -> list[dict]:
    return [i for i in output or [] if is_search_call(i, name)]


def shape(outcome: SearchOutcome, plan: Plan) -> SearchOutcome:
    """The client's filters and result count applied to what SearXNG found. Pure."""
    outcome = filter_domains(outcome, plan.allowed or None)
    if len(outcome.hits) > plan.results:
        outcome = SearchOutcome(**{**outcome.__dict__, "hits": outcome.hits[:plan.results]})
    return outcome


def run_searches(session: SearchSession, calls: list[dict], plan: Plan) -> list[SearchOutcome]:
    """One round: every search call of a turn, concurrently, shaped for the client."""
    outcomes = session.run([parse_arguments(c.get("arguments")) for c in calls],
                           limit=plan.fetch_limit, language=plan.language)
    return [shape(o, plan) for o in outcomes]


def ws_id(call: dict) -> str:
    """The web_search_call id for an internal call: the same suffix as vLLM's fc_ id."""
    ident = call.get("id") or ""
    return "ws_" + (ident[3:] if ident.startswith("fc_") else uuid.uuid4().hex[:16])


def web_search_item(call: dict, outcome: SearchOutcome, plan: Plan) -> dict:
    """The client's record of one search: failed only when SearXNG gave no usable answer."""
    action: dict[str, object] = {"type": "search", "query": outcome.query}
    if plan.sources:
        action["sources"] = [{"type": "url", "url": h.url} for h in outcome.hits]
    return {"id": ws_id(call), "type": "web_search_call",
            "status": "failed" if outcome.status == "failed" else "completed", "action": action}


def visible_output(turn_output: list, plan: Plan, outcomes: dict) -> list:
    """A search turn's items as the client sees them: each search call replaced by its
    web_search_call; the client's own calls of that turn were not run, so they go."""
    out = []
    for item in turn_output or []:
        if is_search_call(item, plan.name):
            out.append(web_search_item(item, outcomes[item.get("call_id")], plan))
        elif not is_client_call(item):
            out.append(item)
    return out


def call_outputs(turn_output: list, plan: Plan, outcomes: dict) -> list:
    """One output item per call of the turn, in order: results, or the not-executed stub."""
    out = []
    for item in turn_output or []:
        if is_search_call(item, plan.name):
            out.append({"type": "function_call_output", "call_id": item.get("call_id"),
                        "output": format_for_model(outcomes[item.get("call_id")])})
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


def next_request(request: dict, turn_output: list, plan: Plan, outcomes: dict) -> dict:
    """The following turn: the turn's items and their outputs appended to `input`."""
    out = {**request, "input": as_items(request["input"]) + list(turn_output) + call_outputs(turn_output, plan, outcomes)}
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
    out["usage"] = usage
    return out


def failed_response(base: dict, output: list, usage, plan: Plan, code: str, message: str) -> dict:
    out = client_view(base, plan)
    out.update(status="failed", output=output, usage=usage, error={"code": code, "message": message})
    return out


# ---- the handler --------------------------------------------------------------------------

def handle(ex: Exchange) -> Response:
    try:
        body = json.loads(ex.body)
    except (ValueError, UnicodeDecodeError):
        return ex.relay()  # not ours to judge: vLLM answers it in its own words
    if not isinstance(body, dict) or not needs_rewrite(body):
        return ex.relay()
    problem = validate(body) or refusal(body)
    if problem:
        return error_response(400, problem[0], param=problem[1])
    plan = make_plan(body, ex.cfg.searxng_results)
    request = first_request(body, plan)
    if not plan.hosted:
        # History only: the model has no search tool this time, so vLLM's answer is final.
        return ex.relay(encode_json(request))
    dialect = StreamedResponses if body.get("stream") else PlainResponses
    return loop.run(ex, dialect(ex, request, plan))


def compact(obj) -> bytes:
    """JSON as vLLM writes it: no spaces, UTF-8 (see jsonio.dumps for the corner cases)."""
    return jsonio.dumps(obj)


def vllm_error(status: int, raw: bytes) -> str:
    try:
        message = json.loads(raw)["error"]["message"]
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
        return search_calls(turn.output, self.plan.name)

    def queries(self, calls: list) -> list:
        return [parse_arguments(c.get("arguments")) for c in calls]

    def search(self, calls: list) -> list:
        return run_searches(self.session, calls, self.plan)

    def follow(self, turn, calls: list, outcomes: list) -> dict:
        """The next request: the turn's items and their outputs appended; the outcomes by call_id."""
        by_call = dict(zip([c.get("call_id") for c in calls], outcomes, strict=True))
        self.request = next_request(self.request, turn.output, self.plan, by_call)
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
        result = final_response(turn.data, self.first or turn.data, self.output + list(turn.output), self.usage, self.plan)
        yield Response(compact(result), status=200, mimetype="application/json")

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
        final = final_response(response, self.out.first or response, list(self.out.items), self.usage, self.plan)
        yield self.out.emit({"type": "response.completed", "response": final, "sequence_number": 0})

    def announce(self, calls):
        """Each search shown starting: its web_search_call item, in progress and searching."""
        self.placed, shown = [], []
        for call in calls:
            query = parse_arguments(call.get("arguments"))[0] or ""
            item = {"id": ws_id(call), "type": "web_search_call", "status": "in_progress",
                    "action": {"type": "search", "query": query}}
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
        resp = failed_response((self.turn and self.turn.response) or first, list(self.out.items), self.usage,
                               self.plan, code, message)
        resp["id"], resp["created_at"] = first.get("id"), first.get("created_at")
        return self.out.emit({"type": "response.failed", "response": resp, "sequence_number": 0})

    def refused(self, status, raw) -> bytes:
        return self.error(status, vllm_error(status, raw))
