"""The pure rules of the proxy's own calls in a /v1/responses turn (search, open a page, find in a
page): recognising them, the request each runs as, find_in_page's excerpts, what the model reads
back and the next turn's request, tested without a network by tests/test_responses.py and
tests/test_responses_fetch.py."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from proxy.apis import citations
from proxy.apis.responses.request import FIND_IN_PAGE, Plan
from proxy.backends.searxng import NOT_EXECUTED, SearchOutcome, filter_domains, format_for_model, parse_arguments
from proxy.core import codec
from proxy.core.codec import as_dict
from proxy.tools.web_fetch import FetchOutcome, FetchRequest, format_page_for_model, parse_fetch_arguments

FIND_MATCHES = 10       # places shown per find_in_page call
FIND_CONTEXT = 200      # characters shown on each side of a match


def is_call_of(item, name: str) -> bool:
    return (isinstance(item, dict) and item.get("type") == "function_call"
            and item.get("name") == name and not item.get("namespace"))


def is_internal_call(item, plan: Plan) -> bool:
    """A call of one of the proxy's functions (search, open a page, find in a page): the proxy runs it."""
    return any(is_call_of(item, n) for n in plan.internal)


def internal_calls(output, plan: Plan) -> list[dict]:
    return [i for i in output or [] if is_internal_call(i, plan)]


def apply_search_filters(outcome: SearchOutcome, plan: Plan) -> SearchOutcome:
    """The client's filters and result count applied to what SearXNG found. Pure."""
    outcome = filter_domains(outcome, plan.allowed or None)
    if len(outcome.hits) > plan.results:
        outcome = SearchOutcome(**{**outcome.__dict__, "hits": outcome.hits[:plan.results]})
    return outcome


@dataclass(frozen=True)
class FindResult:
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


def call_outcome(call: dict, outcome, plan: Plan):
    """One call's outcome as the client and the model get it: searches cut to the client's filters and count, finds paired with their pattern."""
    if isinstance(outcome, SearchOutcome):
        return apply_search_filters(outcome, plan)
    if call.get("name") == plan.find_name:
        return FindResult(str(arguments_of(call).get("pattern") or "").strip(), outcome)
    return outcome


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


def format_find_result(result: FindResult) -> str:
    """What the model reads for a find_in_page call. Pure."""
    page = result.fetched.page
    if page is None:
        return result.fetched.message
    excerpts, count = find_in_text(page.text, result.pattern)
    cut = " (only the beginning of the page was searched: the rest is past the proxy's limit)" if page.truncated else ""
    if not excerpts:
        return f'"{result.pattern}" does not occur in {page.url} ({len(page.text)} characters searched){cut}.'
    head = f'"{result.pattern}" occurs {count} {"time" if count == 1 else "times"} in {page.url}' + (
        f' "{page.title}"' if page.title else "") + cut + ":"
    more = [f"(showing the first {len(excerpts)})"] if len(excerpts) < count else []
    return "\n".join([head] + [f"[{i}] {e}" for i, e in enumerate(excerpts, 1)] + more)


def tool_output(outcome) -> str:
    """The text the model reads for one internal call. Pure."""
    if isinstance(outcome, FindResult):
        return format_find_result(outcome)
    if isinstance(outcome, FetchOutcome):
        return format_page_for_model(outcome)
    return format_for_model(outcome)


def numbered_output(outcome, sources: citations.Sources | None) -> str:
    """tool_output with its sources numbered for citing (a find_in_page result is not a source of its own)."""
    return tool_output(outcome) if isinstance(outcome, FindResult) else citations.numbered(sources, outcome, tool_output(outcome))


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


def next_request(request: dict, turn_output: list, plan: Plan, outcomes: dict,
                 sources: citations.Sources | None = None) -> dict:
    """The following turn: the turn's items and their outputs appended to `input`."""
    out = {**request, "input": input_items(request["input"]) + list(turn_output) + call_outputs(turn_output, plan, outcomes, sources)}
    if forces_a_call(request.get("tool_choice"), plan.name):
        out["tool_choice"] = "auto"
    return out
