"""The find_in_page tool (a plug-in, proxy/tools/base.py's Tool): the places a piece of text occurs in a page,
with the words around them, the page read as web_fetch reads it (the same fetcher, cache and limits). The
Responses API offers it as the hosted tool's find_in_page action. Not run on its own; tests/test_responses_fetch.py
checks it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import ClassVar

from proxy.core import codec
from proxy.core.codec import as_dict
from proxy.tools.base import NO_LIMITS, PAGE, Cited, Limits, RunContext
from proxy.tools.web_fetch import TOOL as WEB_FETCH
from proxy.tools.web_fetch import FetchOutcome, FetchRequest

FIND_MATCHES = 10       # places shown per find_in_page call
FIND_CONTEXT = 200      # characters shown on each side of a match
FIND_IN_PAGE = "find_in_page"
FIND_TOOL_DESCRIPTION = (
    "Find a piece of text in a web page: gives each place the text occurs on the page at that URL, "
    "with the words around it. Cheaper than reading the whole page when you only need one fact from it.")
FIND_SCHEMA = {"type": "object",
               "properties": {"url": {"type": "string", "description": "The full http:// or https:// URL of the page."},
                              "pattern": {"type": "string", "description": "The text to look for (not case-sensitive)."}},
               "required": ["url", "pattern"]}
FIND_USAGE = f'Call {FIND_IN_PAGE} with {{"url": "https://...", "pattern": "text"}}.'


@dataclass(frozen=True)
class FindResult:
    """What one find_in_page call produced: the pattern, and the page fetch it looked in."""
    pattern: str
    fetched: FetchOutcome
    tool: ClassVar[str] = FIND_IN_PAGE
    repeated: ClassVar[bool] = False

    @property
    def status(self) -> str:
        return self.fetched.status

    @property
    def error_code(self) -> str | None:
        return self.fetched.error_code

    @property
    def message(self) -> str:
        return self.fetched.message

    @property
    def timed_out(self) -> bool:
        return self.fetched.timed_out

    @property
    def truncated(self) -> bool:
        return self.fetched.truncated

    @property
    def page(self):
        """The page looked in, None when it could not be read."""
        return self.fetched.page


@dataclass(frozen=True)
class FindRequest:
    """One find_in_page call: the page's fetch (with the client's limits) and the text to look for."""
    fetch: FetchRequest
    pattern: str
    tool: ClassVar[str] = FIND_IN_PAGE

    @property
    def early(self) -> FindResult | None:
        return None if self.fetch.early is None else FindResult(self.pattern, self.fetch.early)

    @property
    def shown(self) -> str:
        return self.fetch.url


def find_request(arguments, limits: Limits = NO_LIMITS) -> FindRequest:
    """A find_in_page call as the fetch it needs and its pattern, refused early when either is missing. Pure."""
    fetch = WEB_FETCH.parse(arguments, limits)
    try:
        pattern = as_dict(codec.tool_arguments(arguments)).get("pattern")
    except ValueError:
        pattern = None
    pattern = pattern.strip() if isinstance(pattern, str) else ""
    if fetch.early is not None:
        # The fetch core's refusal tells how to call web_fetch; this call was find_in_page.
        said = fetch.early.message.replace('Call web_fetch with {"url": "https://..."}.', FIND_USAGE)
        return FindRequest(replace(fetch, early=replace(fetch.early, message=said)), pattern)
    if not pattern:
        return FindRequest(replace(fetch, early=FetchOutcome(fetch.url, error_code="invalid_tool_input",
                                                            message=f'Find failed: missing "pattern". {FIND_USAGE}')), "")
    return FindRequest(fetch, pattern)


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


class FindInPage:
    """The find_in_page tool: a web_fetch whose result the model reads as excerpts around the pattern."""

    name = FIND_IN_PAGE
    description = FIND_TOOL_DESCRIPTION
    schema = FIND_SCHEMA
    kind = PAGE
    broken = WEB_FETCH.broken

    def parse(self, arguments, limits: Limits = NO_LIMITS) -> FindRequest:
        return find_request(arguments, limits)

    def run(self, request: FindRequest, ctx: RunContext) -> FindResult:
        return FindResult(request.pattern, WEB_FETCH.run(request.fetch, ctx))

    def reads(self, request: FindRequest) -> str:
        return request.fetch.url

    def failure(self, request: FindRequest, code: str, message: str) -> FindResult:
        return FindResult(request.pattern, WEB_FETCH.failure(request.fetch, code, message))

    def text(self, outcome: FindResult) -> str:
        return format_find_result(outcome)

    def sources(self, outcome: FindResult) -> list[Cited]:
        return []  # excerpts of a page are not a source of their own


TOOL = FindInPage()
