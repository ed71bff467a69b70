"""Citations: the sources of one request numbered for the model ([1], [2], ... over every search and
fetch of the request), the [n] markers it writes found in its answer (whole, or across a stream's deltas), and
each API's citation structure made from them. Pure functions and small value objects; used by proxy.apis.chat.handler,
proxy.apis.messages.handler and proxy.apis.responses.handler (tests: tests/run.sh tests/test_citations.py).

Markers stay in the text in every API. OpenAI's url_citation (Responses and chat) points at a range of the
answer, and its own answers put the citation itself there (a Markdown link) with the annotation covering it: the
marker is that range. Anthropic's citations hang on a whole text block and carry no position in it, so the marker
is the only thing that says which sentence a citation backs; cutting vLLM's block into one block per sentence would
also mean rewriting the live stream, which the proxy relays byte for byte. A marker that names no source is left
as plain text and cites nothing.

Positions are Python str indices: Unicode code points. That is what the openai Python SDK's ints mean when you
slice `output_text` or `message.content` with them, and what Anthropic's char_location indices count in the
document's text. (JavaScript strings count UTF-16 units: past the Basic Multilingual Plane, an emoji, the two
differ.)
"""
from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from proxy.core import codec
from proxy.tools.sources import Source, Sources

# [3], [3, 4], [3][4] (two markers). Three digits at most: a request never has a thousand sources, and "[2026]"
# in a sentence is a year, not a citation.
MARKER = re.compile(r"\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]")
# What may still grow into a marker at the end of a stream's text so far: "[", "[1", "[1, 2". Bounded, so the
# scanner never holds more than a few characters.
PARTIAL = re.compile(r"\[[\d,\s]{0,15}\Z")
CITED_CHARS = 150   # Anthropic's cited_text of a search result is at most 150 characters
SENTENCE_CHARS = 500  # the longest char_location range cut from a page
WORD = re.compile(r"\w{3,}")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")  # "0.32" is no sentence end; ". " and a new line are


# ---- finding markers ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Marker:
    start: int            # in the answer's text, code points
    end: int
    numbers: tuple[int, ...]


def find_markers(text: str, offset: int = 0) -> list[Marker]:
    return [Marker(offset + m.start(), offset + m.end(), tuple(int(x) for x in m.group(1).split(",")))
            for m in MARKER.finditer(text)]


class MarkerScanner:
    """Finds the markers of a text that arrives in pieces (a stream's deltas), with positions in the whole text.
    Holds back only what may still become a marker ("[1" at a piece's end), never more than a few characters."""

    def __init__(self):
        self.seen = 0     # characters of the whole text before `held`
        self.held = ""

    def feed(self, piece: str) -> list[Marker]:
        buf = self.held + piece
        found = find_markers(buf, self.seen)
        tail_from = found[-1].end - self.seen if found else 0
        partial = PARTIAL.search(buf, tail_from)
        keep = len(buf) - partial.start() if partial else 0
        self.held = buf[len(buf) - keep:] if keep else ""
        self.seen += len(buf) - keep
        return found


def cited(markers: list[Marker], sources: Sources | None) -> list[tuple[Marker, Source]]:
    """(marker, source) for every number that names a source; the others cite nothing."""
    if sources is None:
        return []
    return [(m, s) for m in markers for s in (sources.get(n) for n in m.numbers) if s is not None]


# ---- OpenAI: url_citation annotations ---------------------------------------------------------------

def url_citation(marker: Marker, src: Source, text: str = "") -> dict:
    """A Responses output_text annotation: the marker's range in the text, the source's URL and title."""
    return {"type": "url_citation", "url": src.url, "title": src.title or src.url,
            "start_index": marker.start, "end_index": marker.end}


def chat_citation(marker: Marker, src: Source, text: str = "") -> dict:
    """A chat completion's message annotation (the search-preview models' shape)."""
    return {"type": "url_citation", "url_citation": {"url": src.url, "title": src.title or src.url,
                                                     "start_index": marker.start, "end_index": marker.end}}


def cite_text(text: str, sources: Sources | None, shape) -> list[dict]:
    """The citations of a whole text: shape(marker, source, text) for each marker naming a source (None: skip)."""
    return [c for m, s in cited(find_markers(text), sources) if (c := shape(m, s, text)) is not None]


class Citer:
    """The citations of texts that arrive in pieces (a stream's deltas), one scanner per text, keyed by the API's
    own coordinates (a block index, an item and content index); `found` keeps each text's citations."""

    def __init__(self, sources: Sources, shape):
        self.sources, self.shape = sources, shape
        self._scanners: dict = {}
        self._texts: dict = {}
        self.found: dict = {}

    def feed(self, key, piece: str) -> list[dict]:
        """The citations the piece completes (usually none)."""
        parts = self._texts.setdefault(key, [])
        parts.append(piece)
        markers = self._scanners.setdefault(key, MarkerScanner()).feed(piece)
        if not markers:
            return []
        text = "".join(parts)
        self._texts[key] = [text]
        new = [c for m, s in cited(markers, self.sources) if (c := self.shape(m, s, text)) is not None]
        self.found.setdefault(key, []).extend(new)
        return new

    def of(self, key) -> list[dict]:
        return self.found.get(key, [])


def cited_items(items: list, sources: Sources | None, found: dict | None = None) -> list:
    """Responses output items with url_citation annotations on each output_text part for its markers (`found`: those a
    stream already announced, by (item id, content index)); items without a cited marker as they were. Pure."""
    if sources is None:
        return items
    out = []
    for item in items:
        parts = item.get("content") if isinstance(item, dict) and item.get("type") == "message" else None
        if isinstance(parts, list):
            new = [cited_part(p, sources, None if found is None else found.get((item.get("id"), j), []))
                   for j, p in enumerate(parts)]
            if any(a is not b for a, b in zip(new, parts, strict=True)):
                item = {**item, "content": new}
        out.append(item)
    return out


def cited_part(part, sources: Sources, found: list | None = None):
    """One content part with its citations added to its annotations (vLLM's own list, empty, kept in front)."""
    if not isinstance(part, dict) or part.get("type") != "output_text" or not isinstance(part.get("text"), str):
        return part
    cites = found if found is not None else cite_text(part["text"], sources, url_citation)
    have = list(part.get("annotations") or [])
    cites = [c for c in cites if c not in have]  # a part already cited (a done event's item kept) stays as it is
    return {**part, "annotations": have + cites} if cites else part


def cited_event(data: dict, citer: Citer) -> dict:
    """A response.content_part.done or response.output_item.done event with the annotations its stream announced
    (the same object when there are none)."""
    if data.get("type") == "response.content_part.done":
        part = cited_part(data.get("part"), citer.sources, citer.of((data.get("item_id"), data.get("content_index"))))
        return data if part is data.get("part") else {**data, "part": part}
    item = data.get("item")
    new = cited_items([item], citer.sources, citer.found)[0]
    return data if new is item else {**data, "item": new}


# ---- Anthropic: citations on text blocks --------------------------------------------------------------

def encrypted_index(src: Source) -> str:
    """`encrypted_index`: NOT encrypted (as the proxy's encrypted_content is not): base64 of the source's number
    and URL, an opaque string the SDK requires."""
    return base64.b64encode(codec.dumps({"n": src.n, "url": src.url})).decode()


def sentence_before(text: str, at: int) -> str:
    """The sentence of `text` that ends at the marker at `at` (what the citation backs)."""
    start = 0
    for m in SENTENCE_END.finditer(text, 0, at):
        start = m.end()
    return text[start:at]


def best_range(page: str, claim: str) -> tuple[int, int]:
    """The range of `page` a claim most likely came from: the sentence sharing the most words with it (the first
    sentence when none shares one), at most SENTENCE_CHARS long."""
    words = {w.casefold() for w in WORD.findall(claim)}
    spans, start = [], 0
    for m in SENTENCE_END.finditer(page):
        spans.append((start, m.start()))
        start = m.end()
    spans = [(a, b) for a, b in spans + [(start, len(page))] if b > a]
    if not spans:
        return 0, 0
    best = max(spans, key=lambda span: (len(words & {w.casefold() for w in WORD.findall(page[span[0]:span[1]])}),
                                        -span[0]))
    return best[0], min(best[1], best[0] + SENTENCE_CHARS)


def anthropic_citation(src: Source, claim: str, documents: bool) -> dict | None:
    """A search hit as web_search_result_location; a page as char_location when web_fetch citations are on
    (`documents`), else nothing, as Anthropic does."""
    if src.document is None:
        return {"type": "web_search_result_location", "url": src.url, "title": src.title,
                "cited_text": src.text[:CITED_CHARS], "encrypted_index": encrypted_index(src)}
    if not documents:
        return None
    start, end = best_range(src.text, claim)
    return {"type": "char_location", "document_index": src.document, "document_title": src.title,
            "start_char_index": start, "end_char_index": end, "cited_text": src.text[start:end]}


def anthropic_shape(documents: bool):
    """The shape(marker, source, text) of Anthropic's citations; `documents`: web_fetch has citations enabled."""
    def shape(marker: Marker, src: Source, text: str) -> dict | None:
        return anthropic_citation(src, sentence_before(text, marker.start), documents)
    return shape


# ---- replayed history: what vLLM gets back --------------------------------------------------------------

def without_citations(messages: list) -> list:
    """Anthropic messages with text blocks' `citations` taken off (an earlier answer sent back): vLLM's Messages
    route has no such field, and the model reads the markers still in the text."""
    out, changed = [], False
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and "citations" in b for b in content):
            msg, changed = {**msg, "content": [{k: v for k, v in b.items() if k != "citations"}
                                               if isinstance(b, dict) else b for b in content]}, True
        out.append(msg)
    return out if changed else messages  # the same list when nothing changed: codec.encoded_over reuses its bytes


def annotated(item) -> bool:
    """Whether a chat message or Responses input item carries annotations without_annotations takes off. Pure."""
    if not isinstance(item, dict):
        return False
    if item.get("annotations") is not None and item.get("role") == "assistant":
        return True
    content = item.get("content")
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("annotations") for p in content)


def without_annotations(items):
    """Responses input items with output_text annotations emptied (the list is required, its entries are not
    the model's business), or chat messages without `annotations`; anything else as sent."""
    if not isinstance(items, list):
        return items
    out, changed = [], False
    for item in items:
        if isinstance(item, dict) and item.get("annotations") is not None and item.get("role") == "assistant":
            item, changed = {k: v for k, v in item.items() if k != "annotations"}, True  # a chat message
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("annotations") for p in content):
            item, changed = {**item, "content": [{**p, "annotations": []}
                                                 if isinstance(p, dict) and p.get("annotations") else p
                                                 for p in content]}, True
        out.append(item)
    return out if changed else items  # the same list when nothing changed: codec.encoded_over reuses its bytes
