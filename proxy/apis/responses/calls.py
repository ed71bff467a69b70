"""The pure rules of the proxy's own calls in a /v1/responses turn (search, open a page, find in a
page): recognising them, the request each runs as, what the model reads back and the next turn's request, tested without a network by tests/test_responses.py and
tests/test_responses_fetch.py."""
from __future__ import annotations

from proxy.apis.responses.request import ResponsesPlan
from proxy.tools import registry
from proxy.tools.base import NOT_EXECUTED, Limits, Outcome, Request
from proxy.tools.sources import Sources, numbered


def is_call_of(item, name: str) -> bool:
    return (isinstance(item, dict) and item.get("type") == "function_call"
            and item.get("name") == name and not item.get("namespace"))


def is_internal_call(item, plan: ResponsesPlan) -> bool:
    """A call of one of the proxy's functions (search, open a page, find in a page): the proxy runs it."""
    return any(is_call_of(item, n) for n in plan.internal)


def internal_calls(output, plan: ResponsesPlan) -> list[dict]:
    return [i for i in output or [] if is_internal_call(i, plan)]


def tool_name(call: dict, plan: ResponsesPlan) -> str:
    """The proxy tool a call of the model's runs: its vLLM-side names are the plan's."""
    return plan.functions[str(call.get("name"))]


def tool_request(call: dict, plan: ResponsesPlan) -> Request:
    """A call of the proxy's as ToolSession.run takes it, limited to the hosted tool's allowed_domains (which
    OpenAI's tool applies to opened pages too) and, for a search, its result count: the session searches for
    more (plan.search_limit), so the domain filter still leaves enough."""
    limits = Limits(allowed_domains=tuple(plan.allowed), results=plan.results)
    return registry.parse(tool_name(call, plan), call.get("arguments"), limits)


def numbered_output(outcome: Outcome, sources: Sources | None) -> str:
    """The text the model reads for one internal call, its sources numbered for citing."""
    return numbered(sources, outcome, registry.text(outcome))


def call_outputs(turn_output: list, plan: ResponsesPlan, outcomes: dict, sources: Sources | None = None) -> list:
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


def input_items(input_) -> list:
    return [{"role": "user", "content": input_}] if isinstance(input_, str) else list(input_)


def forces_a_call(choice, name: str) -> bool:
    """The choice makes the model call a tool this turn: after a search, that is satisfied."""
    if choice == "required":
        return True
    if isinstance(choice, dict):
        if choice.get("type") == "function" and choice.get("name") == name:
            return True
        return choice.get("type") == "allowed_tools" and choice.get("mode") == "required"
    return False


def next_request(request: dict, turn_output: list, plan: ResponsesPlan, outcomes: dict,
                 sources: Sources | None = None) -> dict:
    """The following turn: the turn's items and their outputs appended to `input`."""
    out = {**request, "input": input_items(request["input"]) + list(turn_output) + call_outputs(turn_output, plan, outcomes, sources)}
    if forces_a_call(request.get("tool_choice"), plan.name):
        out["tool_choice"] = "auto"
    return out
