"""How OpenAI's Responses API shows each proxy tool: one row per tool, keyed by its registry name, saying which
action of the hosted tool it is, the item and stream events that show its calls, the action a call shows before
and after it runs, and how an earlier call the client replays reads to the model. The handler, the plan and the
replay read these rows and never a tool's name, so a tool the Responses API offers is one row here
(docs/architecture.md, "How to add a tool"). Pure; tests/test_responses.py, tests/test_responses_fetch.py and
tests/test_new_tool.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.core import codec
from proxy.core.codec import as_dict, as_list
from proxy.tools import registry
from proxy.tools.registry import FIND_IN_PAGE, WEB_FETCH, WEB_SEARCH
from proxy.tools.web_search import parse_arguments

# The hosted tool whose actions the rows are, in each of its type names: the proxy plays it.
HOSTED_TYPES = frozenset({"web_search", "web_search_2025_08_26", "web_search_preview",
                          "web_search_preview_2025_03_11"})
WEB_SEARCH_EVENTS = ("response.web_search_call.in_progress", "response.web_search_call.searching")


def arguments_of(arguments) -> dict:
    """A call's arguments as an object; {} when they are not one (the parsers say why)."""
    try:
        return as_dict(codec.tool_arguments(arguments))
    except ValueError:
        return {}


def _text(args: dict, key: str) -> str:
    value = args.get(key)
    return value.strip() if isinstance(value, str) else ""


@dataclass(frozen=True)
class HostedAction:
    """One proxy tool as an action of a hosted tool on /v1/responses."""
    tool: str                      # the registry name: the function's name on the vLLM side unless a client's took it
    action: str                    # the action's `type` in the client's item ("search", "open_page", ...)
    shown: Callable[[Any], dict]   # the call's arguments -> the action it shows (a stream shows it before it runs)
    # The call's outcome -> the action once run (None: as shown); `sources`: the client asked for them.
    done: Callable[[Any, bool], dict] | None
    # An earlier call the client replays (its action, and whether it failed) -> (arguments, the text the model
    # reads), or None when the item lacks what this tool needs (it is then told as the first row's).
    replayed: Callable[[dict, bool], tuple[dict, str] | None]
    fallback: str | None = None    # the function's name when the client has one of the tool's; None: then left out
    item_type: str = "web_search_call"          # the client's item for a call
    id_prefix: str = "ws_"                      # its id: this, then the suffix of vLLM's fc_ id
    events: tuple[str, ...] = WEB_SEARCH_EVENTS  # sent after output_item.added, while it runs
    completed: str = "response.web_search_call.completed"  # sent when it worked, before output_item.done
    label: str | None = None    # its calls' `tool` label in the metrics (None: the tool's name), as docs/operations.md lists


def _search_done(outcome, sources: bool) -> dict:
    # What was searched, as the session cleaned it; and what was found, which the hosted tool calls sources.
    action: dict[str, object] = {"type": "search", "query": outcome.query}
    if sources:
        action["sources"] = [{"type": "url", "url": c.url} for c in registry.sources(outcome)]
    return action


def replayed_query(action: dict) -> str:
    if action.get("type") == "find_in_page":
        return f"{action.get('pattern') or ''} {action.get('url') or ''}".strip()
    queries = as_list(action.get("queries"))
    return str(action.get("query") or (queries[0] if queries else "") or action.get("url") or "")


def _search_replayed(action: dict, failed: bool) -> tuple[dict, str]:
    """What the model reads for an earlier search: only what the client kept of it."""
    query = replayed_query(action)
    if failed:
        return {"query": query}, f'Search failed for "{query}" (in an earlier turn).'
    urls = [s.get("url") for s in action.get("sources") or [] if isinstance(s, dict) and s.get("url")]
    if urls:
        return {"query": query}, "\n".join(
            [f'Search results for "{query}" (an earlier turn; only the URLs were kept):']
            + [f"[{i}] {u}" for i, u in enumerate(urls, 1)])
    return {"query": query}, (f'Searched for "{query}" in an earlier turn; the results are not kept in the '
                              "conversation. Search again if you need them.")


def _open_replayed(action: dict, failed: bool) -> tuple[dict, str] | None:
    url = str(action.get("url") or "")
    if not url:
        return None
    return {"url": url}, (f"Opening {url} failed (in an earlier turn)." if failed else
                          f"Opened {url} in an earlier turn; its text is not kept in the conversation. "
                          "Open it again if you need it.")


def _find_replayed(action: dict, failed: bool) -> tuple[dict, str] | None:
    url, pattern = str(action.get("url") or ""), str(action.get("pattern") or "")
    if not url:
        return None
    return {"url": url, "pattern": pattern}, (
        f'Finding "{pattern}" in {url} failed (in an earlier turn).' if failed else
        f'Looked for "{pattern}" in {url} in an earlier turn; what was found is not kept in the '
        "conversation. Look again if you need it.")


def _open_shown(arguments) -> dict:
    url = _text(arguments_of(arguments), "url")
    return {"type": "open_page", "url": url} if url else {"type": "open_page"}


# The hosted web_search tool's actions, the search first: a forced hosted tool forces it, and an earlier call no
# row can replay is told as a search. The page tools are offered only with INJECT_WEB_FETCH (they read pages).
HOSTED_ACTIONS: dict[str, HostedAction] = {a.tool: a for a in (
    HostedAction(WEB_SEARCH, "search", lambda arguments: {"type": "search", "query": parse_arguments(arguments)[0] or ""},
                 _search_done, _search_replayed, fallback="web_search_hosted"),
    HostedAction(WEB_FETCH, "open_page", _open_shown, None, _open_replayed, label="open"),
    HostedAction(FIND_IN_PAGE, "find_in_page",
                 lambda arguments: {"type": "find_in_page", **{k: _text(arguments_of(arguments), k) for k in ("url", "pattern")}},
                 None, _find_replayed, label="find"),
)}


def metric_labels() -> dict[str, str]:
    """Each tool's `tool` label in the metrics on this API, where it is not the tool's name."""
    return {row.tool: row.label for row in HOSTED_ACTIONS.values() if row.label}


def first_row() -> HostedAction:
    return next(iter(HOSTED_ACTIONS.values()))


def row_for_action(action_type) -> HostedAction | None:
    return next((a for a in HOSTED_ACTIONS.values() if a.action == action_type), None)
