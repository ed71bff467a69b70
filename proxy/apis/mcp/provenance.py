"""What URL provenance means over MCP (docs/web-tools.md, "Web tools over MCP"): an MCP server never sees the
conversation, so "the conversation gave this URL" cannot be read from it. What holds instead, per client (its key,
or its address without one), in the same per-client memory the other APIs keep their link reads in
(proxy/tools/client_reads.py: this worker's, or the shared store's with STATE_URL):

- a URL one of this client's MCP searches returned within the hour is given, as a search result is elsewhere (one
  that echoes the query is the model's words and is not);
- a link of a page this client read over MCP is a link, as elsewhere: WEB_FETCH_LINK_DEPTH deep, charged to the
  page's root against WEB_FETCH_LINK_BUDGET and WEB_FETCH_LINKS_PER_HOUR;
- any other URL (a person typed it, or the model wrote it: the server cannot tell which) is read as a new root, but
  only MCP_UNSOURCED_PER_HOUR times per client and hour; past that it is refused before any name is looked up.

The Ledger (proxy/tools/provenance.py) still makes the check, so the refusal, its counting and the link budget are
the other APIs'. Used by proxy/apis/mcp/server.py; tested through the real proxy by tests/test_mcp.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from proxy.tools.base import Cited
from proxy.tools.client_reads import DOWN, Reads
from proxy.tools.provenance import Ledger, Refusal, Rules, echoes_query, key, links_in_page

UNSOURCED = "unsourced"        # the root every unsourced read is charged to, in a budget of its own
LINKS_KEPT = 300               # links of one page remembered: a page showing more gives only its first ones


@dataclass(frozen=True)
class McpReads:
    """One worker's MCP provenance: the rules (WEB_FETCH_URLS and the link limits), the per-client memory, and the
    hourly budget for unsourced URLs."""
    rules: Rules
    reads: Reads
    unsourced_per_hour: int

    @property
    def checking(self) -> bool:
        return self.rules.mode != "any"

    def ledger(self, client: str, url: str) -> Ledger | Refusal:
        """The ledger one web_fetch call runs on, holding `url` as this client's memory knows it, or the refusal of
        an unknown URL past the hourly budget (nothing is charged or looked up then)."""
        ledger = Ledger(self.rules, (), self.reads, client)
        k = key(url)
        if not self.checking or k is None:  # a URL the fetcher does not take it refuses with its own sentence
            return ledger
        if self.reads.recall(client, k) is not None:
            # A search result (depth 0) or a link (its depth and root): given as the memory has it, and the ledger
            # charges a link fetch as it always does.
            ledger.allow([k], "search")
            return ledger
        over = self.reads.charge(client + "\n" + UNSOURCED, UNSOURCED, self.unsourced_per_hour,
                                 self.unsourced_per_hour)
        if over is not None:
            return Refusal("not_given", unsourced_message(k, over, self.unsourced_per_hour))
        ledger.allow([k], "user")  # a root of its own, whatever the memory says, as a person's words are
        return ledger

    def searched(self, client: str, query: str, hits: list[Cited]) -> None:
        """A search's results become this client's given URLs (a result once read as a link keeps its depth)."""
        if not self.checking:
            return
        for hit in hits:
            k = key(hit.url)
            if k is not None and not echoes_query(k, query) and self.reads.recall(client, k) is None:
                self.reads.remember(client, k, 0, k)

    def read(self, client: str, ledger: Ledger, requested: str, page: Cited) -> None:
        """A page was read: its links are one page further from its root, for this client's next calls."""
        if not self.checking:
            return
        entry = ledger.entry(requested) or ledger.entry(page.url)
        if entry is None or entry.depth + 1 > self.rules.link_depth:
            return  # links past the depth limit would be refused anyway: nothing to remember
        seen: set[str] = set()
        for k in filter(None, map(key, links_in_page(page.text, page.url))):
            if k in seen:
                continue
            seen.add(k)
            self.reads.remember(client, k, entry.depth + 1, entry.root)
            if len(seen) >= LINKS_KEPT:
                return


def unsourced_message(k: str, over: str, per_hour: int) -> str:
    """What the model reads when an unknown URL is refused. Pure."""
    if over == DOWN:
        return (f"not fetched: {k} came from no search or page of this client, and such reads are counted in the "
                "proxy's shared store (STATE_URL), which is not answering. Search for it, or try again later.")
    return (f"not fetched: {k} came from no web_search result or page read of this client within the hour, and "
            f"this client already read {per_hour} such URLs within the hour, the most allowed "
            "(MCP_UNSOURCED_PER_HOUR). Search for the page, or read URLs its results show.")
