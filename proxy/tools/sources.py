"""A request's sources, numbered for the model ([1], [2], ... over every tool result of the request, a URL read
again keeping its number): what each tool offers for citing (registry.sources) turned into numbered text. The
markers the model writes and each API's citation shapes are proxy/apis/citations.py's. Pure; tests/test_citations.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.tools import registry
from proxy.tools.base import Cited, Outcome

HIT_LINE = re.compile(r"^\[(\d+)\] ", re.MULTILINE)  # "[1] Title" in web_search's text
CITE_NOTE = "Cite what you use from these sources in your answer with their numbers in brackets, like [{n}]."


@dataclass(frozen=True)
class Source:
    """One numbered source: a search hit (its snippet) or a fetched page (its text, one document)."""
    n: int
    url: str
    title: str | None
    text: str                   # the snippet, or the page's text as the client's document holds it
    document: int | None = None  # a page's place among the request's fetched documents (0, 1, ...)


class Sources:
    """The sources of one request, numbered in the order the model read them; a URL read again keeps its number."""

    def __init__(self):
        self.by_n: dict[int, Source] = {}
        self._by_url: dict[str, Source] = {}
        self.documents = 0

    def get(self, n: int) -> Source | None:
        return self.by_n.get(n)

    def _add(self, url: str, title: str | None, text: str, page: bool) -> Source:
        known = self._by_url.get(url)
        if known is not None and (known.document is not None) == page:
            return known
        document = None
        if page:
            document, self.documents = self.documents, self.documents + 1
        src = Source(len(self.by_n) + 1, url, title, text, document)
        self.by_n[src.n] = src
        self._by_url.setdefault(url, src)
        return src

    def number_hits(self, hits: list[Cited], text: str) -> str:
        """A search result's text (search.format_for_model) with its hits numbered over the whole request, and the
        sentence asking the model to cite them. The local "[1] Title" lines are renumbered when they are all
        there, in order; otherwise the numbers are listed after the text."""
        numbered = [self._add(h.url, h.title, h.text, page=False) for h in hits]
        if not numbered:
            return text
        lines = list(HIT_LINE.finditer(text))
        if [int(m.group(1)) for m in lines] == list(range(1, len(numbered) + 1)):
            out, at = [], 0
            for m, src in zip(lines, numbered, strict=True):
                out += [text[at:m.start()], f"[{src.n}] "]
                at = m.end()
            text = "".join(out) + text[at:]
        else:
            text += "\n\n" + "\n".join(f"[{s.n}] {s.url}" for s in numbered)
        return text + "\n\n" + CITE_NOTE.format(n=numbered[0].n)

    def number_document(self, url: str, title: str | None, document: str, text: str) -> str:
        """number_page for a page known by its parts (a replayed document)."""
        src = self._add(url, title, document, page=True)
        return f"[{src.n}] {text}\n\n" + CITE_NOTE.format(n=src.n)


def numbered(sources: Sources | None, outcome: Outcome, text: str, pages: bool = True) -> str:
    """The tool result text the model reads, its sources (what the outcome's tool offers: search hits, or a page)
    numbered; as it was when citations are off (`sources` None). `pages`: whether pages are cited here
    (Anthropic's web_fetch only with citations enabled)."""
    if sources is None:
        return text
    cited = registry.sources(outcome)
    hits = [c for c in cited if not c.page]
    if hits:
        return sources.number_hits(hits, text)
    page = next((c for c in cited if c.page), None)
    if pages and page is not None:
        return sources.number_document(page.url, page.title, page.text, text)
    return text
