"""The web_search tool (a plug-in, proxy/tools/base.py's Tool): its definition, a model-written query cleaned or
refused, the search on the worker's search backend (a query the request already ran is answered from memory),
the client's domain filters, and the text the model reads. Not run on its own; tests/test_rules.py checks it
without a network.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

# A search's outcome is the search backend's answer: the APIs take Hit and SearchOutcome from here, never backends/.
from proxy.backends.search.search import Hit, SearchOutcome, filter_domains  # noqa: F401 (Hit: for the APIs)
from proxy.core import codec
from proxy.core.validate import is_encodable
from proxy.tools.base import NO_LIMITS, SEARCH, Cited, Limits, RunContext

# The web_search tool as every API describes it to the model; each API wraps these in its
# own tool shape (chat function, Messages tool, Responses function).
TOOL_DESCRIPTION = (
    "Search the web and get the top results (title, URL, snippet, date). Use it for anything "
    "that may have changed after your training or that you are not sure of: current events, "
    "versions and release notes, library APIs and error messages, documentation, prices, "
    "people. Write a short keyword query. Don't use it for things you already know well.")
QUERY_SCHEMA = {"type": "object",
                "properties": {"query": {"type": "string", "description": "The search query, a few keywords."}},
                "required": ["query"]}
MAX_QUERY_CHARS = 400


def clean_query(raw) -> tuple[str | None, SearchOutcome | None]:
    """Turn a model-written query into one safe to send, or a failed outcome saying why.

    A leading `!`/`!!` is a SearXNG bang (engine selection or a redirect away), never what
    the model meant, so it is stripped along with surrounding whitespace.
    """
    if not isinstance(raw, str):
        return None, SearchOutcome(str(raw), "failed", message="Search failed: the query must be a string.", error_code="invalid_tool_input")
    query = raw.strip()
    while query.startswith("!"):
        query = query.lstrip("!").lstrip()
    query = " ".join(query.split())
    if not query:
        return None, SearchOutcome(raw, "failed", message="Search failed: the query is empty. Call web_search with a non-empty \"query\".", error_code="invalid_tool_input")
    if not is_encodable(query):  # a lone surrogate: no URL can carry it, and the model can write it again without
        return None, SearchOutcome(query.encode("utf-8", "replace").decode()[:80], "failed", error_code="invalid_tool_input",
                                   message="Search failed: the query holds characters that cannot be encoded (a lone surrogate); write it again in plain text.")
    if len(query) > MAX_QUERY_CHARS:
        return None, SearchOutcome(query[:80] + "...", "failed", message=f"Search failed: the query is longer than {MAX_QUERY_CHARS} characters; use a few keywords.", error_code="query_too_long")
    return query, None


@dataclass(frozen=True)
class SearchRequest:
    """One web_search call: the cleaned query (or, refused, what the model wrote with the outcome saying why) and
    the client's domain filters, applied to the results (Anthropic's allowed_domains/blocked_domains, OpenAI's
    filters.allowed_domains)."""
    query: str
    early: SearchOutcome | None = None
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()
    results: int | None = None       # hits kept after the filters (the Responses tool's search_context_size)
    time_range: str | None = None    # SearXNG's time_range (Codex's recency)
    tool: ClassVar[str] = "web_search"

    @property
    def shown(self) -> str:
        return self.query if self.early is None else ""


def parse_arguments(arguments) -> tuple[str | None, SearchOutcome | None]:
    """Read the `query` out of a tool call's arguments (a JSON string or an object)."""
    try:
        arguments = codec.tool_arguments(arguments)
    except ValueError:
        return None, SearchOutcome(arguments[:80], "failed", message='Search failed: the arguments are not valid JSON. Call web_search with {"query": "..."}.', error_code="invalid_tool_input")
    if not isinstance(arguments, dict) or "query" not in arguments:
        return None, SearchOutcome(str(arguments)[:80], "failed", message='Search failed: missing "query". Call web_search with {"query": "..."}.', error_code="invalid_tool_input")
    return clean_query(arguments["query"])


def format_for_model(outcome: SearchOutcome) -> str:
    """The compact text a model reads as the tool result. Pure."""
    if outcome.status != "ok":
        text = outcome.message
    else:
        lines = [f'Search results for "{outcome.query}"{outcome.cached_note}:']
        lines += [f"Note: {note}" for note in outcome.notes]
        for a in outcome.answers:
            lines.append(f"Answer: {a}")
        for box in outcome.infoboxes:
            lines.append(f"Infobox: {box}")
        for i, h in enumerate(outcome.hits, 1):
            lines.append("")
            lines.append(f"[{i}] {h.title}")
            lines.append(f"URL: {h.url}")
            if h.date:
                lines.append(f"Date: {h.date}")
            if h.snippet:
                lines.append(f"Snippet: {h.snippet}")
        text = "\n".join(lines)
    if outcome.repeated:
        text = ("You already searched for exactly this; it was not searched again. "
                "Use these results or answer now.\n\n" + text)
    return text


def shaped(outcome: SearchOutcome, request: SearchRequest) -> SearchOutcome:
    """What the search found, as the client's options shape it: its domain filters, then its result count. Pure."""
    outcome = filter_domains(outcome, request.allowed_domains or None, request.blocked_domains or None)
    if request.results is not None and len(outcome.hits) > request.results:
        outcome = replace(outcome, hits=outcome.hits[:request.results])
    return outcome


class WebSearch:
    """The web_search tool. Repeating an identical query is the usual loop of local models, so a repeat within
    one request is answered from memory with a note instead of searching again."""

    name = "web_search"
    description = TOOL_DESCRIPTION
    schema = QUERY_SCHEMA
    kind = SEARCH
    broken = "Search failed: the proxy could not run this search (an internal error)."

    def parse(self, arguments, limits: Limits = NO_LIMITS) -> SearchRequest:
        query, early = parse_arguments(arguments)
        return SearchRequest(query or (early.query if early else ""), early, tuple(limits.allowed_domains),
                             tuple(limits.blocked_domains), limits.results, limits.time_range)

    def run(self, request: SearchRequest, ctx: RunContext) -> SearchOutcome:
        if request.early is not None:
            return request.early
        key = (request.query.casefold(), request.time_range)
        memory = ctx.remembered(self.name)
        with ctx.lock:
            prev = memory.get(key)
        if prev is not None:
            outcome = replace(prev, repeated=True)
        else:
            outcome = ctx.backends.search.search(request.query, language=ctx.language, limit=ctx.limit,
                                                 time_range=request.time_range, cancel=ctx.cancel)
            with ctx.lock:
                memory[key] = outcome
        return shaped(outcome, request)

    def reads(self, request: SearchRequest) -> None:
        return None  # a search reads SearXNG, not a page the model names

    def failure(self, request: SearchRequest, code: str, message: str) -> SearchOutcome:
        return SearchOutcome(request.query, "failed", error_code=code, message=message)

    def text(self, outcome: SearchOutcome) -> str:
        return format_for_model(outcome)

    def sources(self, outcome: SearchOutcome) -> list[Cited]:
        return [Cited(h.url, h.title, h.snippet, page=False) for h in outcome.hits] if outcome.status == "ok" else []


TOOL = WebSearch()
