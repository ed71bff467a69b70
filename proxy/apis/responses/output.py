"""The pure rules of what the client sees of a /v1/responses search: each of the proxy's calls as a
web_search_call item, a turn's visible output, usage summed over the turns and the one response it
receives, tested without a network by tests/test_responses.py and tests/test_responses_fetch.py."""
from __future__ import annotations

import copy
import uuid

from proxy.apis.responses.calls import is_internal_call, tool_name
from proxy.apis.responses.presentation import HOSTED_ACTIONS, HostedAction
from proxy.apis.responses.request import ResponsesPlan
from proxy.apis.responses.stream import is_client_call
from proxy.core.codec import as_dict


def row_of(call: dict, plan: ResponsesPlan) -> HostedAction:
    """How the call's tool shows on this API (presentation.HOSTED_ACTIONS)."""
    return HOSTED_ACTIONS[tool_name(call, plan)]


def ws_id(call: dict, prefix: str = "ws_") -> str:
    """The client's item id for an internal call: the same suffix as vLLM's fc_ id."""
    ident = call.get("id") or ""
    return prefix + (ident[3:] if ident.startswith("fc_") else uuid.uuid4().hex[:16])


def call_action(call: dict, plan: ResponsesPlan) -> dict:
    """The action a call shows as, from its arguments alone (a stream shows it before it runs): `search` with its
    query, `open_page` with its URL, `find_in_page` with URL and pattern, as its row says. Pure."""
    return row_of(call, plan).shown(call.get("arguments"))


def web_search_item(call: dict, outcome, plan: ResponsesPlan) -> dict:
    """The client's record of one call (a web_search_call for the hosted web_search tool's actions): failed only
    when SearXNG gave no usable answer, or the page could not be read."""
    row = HOSTED_ACTIONS[outcome.tool]
    action = row.done(outcome, plan.sources) if row.done is not None else row.shown(call.get("arguments"))
    failed = outcome.status == "failed"
    return {"id": ws_id(call, row.id_prefix), "type": row.item_type, "status": "failed" if failed else "completed",
            "action": action}


def kept_records(calls: list, request_input: list) -> dict[str, dict[str, str]]:
    """What the model read for each of a round's calls (its function, arguments and output, as the next request
    holds them), by the web_search_call id the client will replay it under (request.replay). Pure."""
    outputs = {i.get("call_id"): i.get("output") for i in request_input
               if isinstance(i, dict) and i.get("type") == "function_call_output"}
    out = {}
    for call in calls:
        output, arguments = outputs.get(call.get("call_id")), call.get("arguments")
        if call.get("id") and isinstance(output, str) and isinstance(arguments, str):
            out[ws_id(call)] = {"name": str(call.get("name")), "arguments": arguments, "output": output}
    return out


def pending_item(call: dict, plan: ResponsesPlan) -> dict:
    """A call's item as a stream announces it, before it has run. Pure."""
    row = row_of(call, plan)
    return {"id": ws_id(call, row.id_prefix), "type": row.item_type, "status": "in_progress",
            "action": row.shown(call.get("arguments"))}


def visible_output(turn_output: list, plan: ResponsesPlan, outcomes: dict) -> list:
    """A search turn's items as the client sees them: each internal call replaced by its
    web_search_call; the client's own calls of that turn were not run, so they go."""
    out = []
    for item in turn_output or []:
        if is_internal_call(item, plan):
            out.append(web_search_item(item, outcomes[item.get("call_id")], plan))
        elif not is_client_call(item):
            out.append(item)
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


def client_view(response: dict, plan: ResponsesPlan) -> dict:
    """A response object as the client should see it: its own tools echoed, not the function."""
    out = dict(response)
    if plan.hosted:
        out["tools"] = plan.client_tools
        if plan.client_tool_choice is not None:
            out["tool_choice"] = plan.client_tool_choice
    return out


def final_response(last: dict, first: dict, output: list, usage, plan: ResponsesPlan) -> dict:
    """The one response the client receives: the first turn's id and created_at, the last
    turn's status, every visible item, usage summed over the turns."""
    out = client_view(last, plan)
    out["id"], out["created_at"] = first.get("id"), first.get("created_at")
    out["output"] = output
    out["usage"] = complete_usage(usage)
    return out


def failed_response(base: dict, output: list, usage, plan: ResponsesPlan, code: str, message: str) -> dict:
    out = client_view(base, plan)
    out.update(status="failed", output=output, usage=complete_usage(usage), error={"code": code, "message": message})
    return out

