"""The contract every server-side tool keeps (Tool), what its calls and results look like to the rest of the
proxy (Request, Outcome, Cited), and what a tool runs with (Backends, RunContext). Not run on its own; a tool
is one module beside this one (web_search.py, web_fetch.py, find_in_page.py), listed in registry.py.

The APIs, the metrics and the citations read outcomes only through these fields and the registry's functions,
never by a tool's own types: a new tool is its module, its registry entry, and one row in each API's presentation
table (proxy/apis/*/presentation.py) that offers it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.backends.pages.fetcher import PageFetcher
from proxy.backends.search.search import CachedSearch, SearchBackend
from proxy.runtime.cancel import Cancel

# The answer to a client's own tool call made in the same turn as one of the proxy's (the proxy runs only its
# own), so the model asks again in a turn of its own instead of losing the call.
# What a tool is, for everything that counts calls (the request's round cap, the access log, the team's usage, the
# page caps): a search, a page read, or neither. Counted by kind, never by a tool's name, so a new tool of either
# kind is counted the same way without a line outside its module.
SEARCH, PAGE, OTHER = "search", "page", "other"
KINDS = (SEARCH, PAGE, OTHER)

NOT_EXECUTED = ("Not executed: this call was made in the same turn as a call of the proxy's own tools, and the "
                "proxy only runs those. If it is still needed, call it again in a turn of its own.")


class Request(Protocol):
    """One call of a tool as the session runs it, parsed from the model's arguments."""

    @property
    def tool(self) -> str: ...           # the registry name of the tool that runs it

    @property
    def early(self) -> Any: ...          # the outcome that refuses it before it runs (bad arguments), or None

    @property
    def shown(self) -> str: ...          # what a stream's keep-alive says is being looked up (a query, a URL)


class Outcome(Protocol):
    """What one call produced, in the fields every API, the metrics and the citations read."""

    @property
    def tool(self) -> str: ...           # the registry name of the tool that produced it

    @property
    def status(self) -> str: ...         # "ok", "empty" (ran, found nothing) or "failed"

    @property
    def error_code(self) -> str | None: ...  # why it failed, in Anthropic's vocabulary (every API's reason)

    @property
    def message(self) -> str: ...        # the sentence the model reads when it failed

    @property
    def timed_out(self) -> bool: ...     # failed because its server did not answer in time

    @property
    def repeated(self) -> bool: ...      # answered from this request's memory, not run again

    @property
    def truncated(self) -> bool: ...     # what it read was cut short by a size limit


@dataclass(frozen=True)
class Limits:
    """What a client's own tool options bound a call by: its domain filters (on results, and on pages read),
    a page's token budget, a search's result count after filtering, how recent its results must be (SearXNG's
    time_range: day, week, month, year). Each tool reads the ones that apply to it."""
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()
    max_tokens: int | None = None
    results: int | None = None
    time_range: str | None = None


NO_LIMITS = Limits()


@dataclass(frozen=True)
class Cited:
    """One source an outcome offers for citing: a search hit (its snippet) or a page read (its text)."""
    url: str
    title: str | None
    text: str
    page: bool


@dataclass(frozen=True)
class Backends:
    """What the worker's tools run on: the search backend (the cache and meters around SearXNG) and the page
    fetcher. A tool needing another backend adds it here, in engine/services.py and in http/wiring.py."""
    search: SearchBackend
    fetcher: PageFetcher

    def scoped(self, scope: str) -> Backends:
        """The backends with caches of `scope`'s own (a person's key name, with a keys file), or these ("")."""
        if not scope:
            return self
        search = self.search.scoped(scope) if isinstance(self.search, CachedSearch) else self.search
        return Backends(search, self.fetcher.scoped(scope))


@dataclass
class RunContext:
    """One call's surroundings: the backends, its Cancel (the client's watch and the call's deadline), the
    client's result limit and language, and the request's memory, which a tool keeps per name (web_search's
    answers to repeated queries) under `lock`, since a round's calls run side by side."""
    backends: Backends
    cancel: Cancel
    limit: int | None = None
    language: str | None = None
    memory: dict[str, dict] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def remembered(self, tool: str) -> dict:
        with self.lock:
            return self.memory.setdefault(tool, {})


class Tool(Protocol):
    """A server-side tool: one module owns its name, its definition, its calls and their results."""

    name: str            # the registry name, and the name the model calls unless a client tool took it
    description: str     # what the model is told the tool does
    schema: dict         # the JSON schema of its arguments
    kind: str            # SEARCH, PAGE or OTHER (above); a PAGE tool's calls count against WEB_FETCH_MAX_PER_TURN
                         # and _PER_REQUEST and as page reads, a SEARCH tool's as searches
    broken: str          # the sentence the model reads when a call failed unexpectedly (a bug, a library's surprise)

    def parse(self, arguments: Any, limits: Limits = NO_LIMITS) -> Request:
        """The model's arguments (a JSON string or an object) as a request within the client's `limits`, refused
        early when unusable. Pure."""

    def run(self, request: Any, ctx: RunContext) -> Outcome:
        """Run one call on ctx's backends within ctx.cancel; never raises: every failure is an outcome."""

    def reads(self, request: Any) -> str | None:
        """The URL a call will read, which URL provenance (proxy/tools/provenance.py) checks before the call runs;
        None for a call that reads no page. A tool that reads pages must name every URL it will read here. Pure."""

    def failure(self, request: Any, code: str, message: str) -> Outcome:
        """The outcome refusing or failing `request` with `code` and the sentence the model reads. Pure."""

    def text(self, outcome: Any) -> str:
        """What the model reads for one outcome. Pure."""

    def sources(self, outcome: Any) -> list[Cited]:
        """What the outcome offers for citing, in the order the model reads it (none for a failure). Pure."""
