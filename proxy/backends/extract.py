"""Page extraction (HTML to a title and Markdown; PDFs to text by proxy/backends/pdftext.py) in child processes of the proxy's
worker, each page under a CPU-time and a memory limit, so no page can block the event loop, gevent's DNS threads or
another request, nor take the worker's memory.

proxy/backends/fetcher.py uses ExtractPool; a child is this module run by the pool as
`python -m proxy.backends.extract CPU_SECONDS MEMORY_BYTES` (never by hand): it reads framed jobs on stdin and
writes framed answers on stdout until stdin closes, which is also how it learns that its worker died.
extract_page is the extraction itself, pure, and tested in-process by tests/test_extract.py and tests/test_fetch.py.
"""
from __future__ import annotations

import atexit
import base64
import logging
import math
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from proxy.backends import pdftext
from proxy.core import codec
from proxy.runtime.cancel import Cancel

log = logging.getLogger("proxy.fetch")

FRAME_HEADER = 4  # bytes of big-endian length before each JSON frame on the pipes
PIPE_CHUNK = 64 * 1024


class ExtractError(Exception):
    """A page the pool could not extract; `code` is Anthropic's web_fetch error code, `message` the model's sentence."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# -- the extraction itself (runs in a child) -----------------------------------------------------
#
# One lxml parse; what is never text a reader sees is dropped; the main content is picked by readability's scoring
# (Arc90's rules as readability-lxml and Mozilla's Readability.js apply them) in one pass over the paragraphs, without
# readability-lxml's second parse, retries and HTML round trip; then a Markdown writer of our own turns it into what
# the model reads, stopping at the budget. scripts/bench_articles.py measures it against the libraries.

def tidy(text: str) -> str:
    """Trailing spaces off every line, at most one blank line in a row."""
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _one_line(text: str | None) -> str | None:
    return (" ".join(text.split()) or None) if text else None


# Above this much text (judged after scripts, styles and comments are gone: a news page's raw HTML is mostly those),
# scoring is skipped for a cheap rule: keep <main> or <article> if there is one, without navigation.
FAST_PATH_CHARS = 512 * 1024
# What holds no text a reader sees, in every path (a comment is not an element: text_content() refuses it).
NO_TEXT = ("//script|//style|//noscript|//template|//comment()|//processing-instruction()|//svg|//math|//iframe"
           "|//object|//embed|//canvas|//button|//input|//select|//textarea|//dialog")
# Photo captions and credits: the benchmark's human-made bodies leave them out, and galleries repeat them.
CAPTIONS = "//figcaption|//*[contains(@class,'caption') or contains(@class,'credit')][string-length() < 300]"
NOT_CONTENT = "//nav|//header|//footer|//aside|//menu|//form[not(.//p)]"
# Hidden by the page itself; a reader never sees it, and a page can hide instructions for the model there.
HIDDEN = ("//*[@hidden or @aria-hidden='true' or contains(translate(@style,'DISPLAYNOE: ','displaynoe'),"
          "'displaynone') or contains(translate(@style,'VISBLTYHDEN: ','visbltyhden'),'visibilityhidden')]")
# Class and id words of what is not the article (readability's unlikely candidates, with what the benchmark and the
# issue's pages showed leaking: WordPress's "Like this: Loading..." widgets, share bars, related posts, tables of
# contents), and those that may still hold it.
UNLIKELY = re.compile(
    r"-ad-|ad-break|agegate|banner|breadcrumb|combx|comment|communit|cookie|disqus|extra|foot|gdpr|header|legends|"
    r"menu|modal|nav|newsletter|outbrain|pager|paginat|popup|promo|related|remark|replies|rss|share|sharing|"
    r"shoutbox|sidebar|skyscraper|social|sponsor|subscri|taboola|tweet|twitter|sd-like|likes-widget|jp-relatedposts|"
    r"sharedaddy|\btoc\b|gtoc|signup|recommend|most-popular|trending|byline|author-bio|\btags?\b|skip-link|masthead|"
    r"print-only|visually-hidden|sr-only|screen-reader", re.I)
NOT_CONTENT_ROLES = frozenset({"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar",
                               "dialog", "alert", "alertdialog", "tooltip"})
# Unlikely even when a word of MAYBE is in the name too ("jp-relatedposts", "share-post", "newsletter-content").
BOILERPLATE = re.compile(r"sharedaddy|jp-relatedposts|likes-widget|sd-like|sd-sharing|share|sharing|social|"
                         r"newsletter|cookie|related|recommend|promo|subscri|outbrain|taboola", re.I)
MAYBE = re.compile(r"and|article|body|column|main|shadow|content|entry|post|story|text", re.I)
POSITIVE = re.compile(r"article|body|content|entry|hentry|h-entry|main|page|pagination|post|text|blog|story|"
                      r"markdown|prose|docs?\b|documentation|readme", re.I)
NEGATIVE = re.compile(r"-ad-|hidden|^hid$| hid$| hid |^hid |banner|combx|comment|com-|contact|foot|footer|footnote|"
                      r"gdpr|masthead|media|meta|outbrain|promo|related|scroll|share|shoutbox|sidebar|skyscraper|"
                      r"sponsor|shopping|tags|tool|widget|caption|credit", re.I)
# Containers the page says are its article; one with enough text wins over scoring (trafilatura's BODY_XPATH idea).
ARTICLE_HINT = re.compile(r"articlebody|article-body|article__body|article-content|article__content|articletext|"
                          r"article-text|post-content|post-body|post_content|entry-content|story-body|storybody|"
                          r"story-content|body-text|rich-text|markdown-body|js-post-body|content-body", re.I)
KEEP_XPATH = "boolean(self::table|.//h1|.//h2|.//h3|.//h4|.//h5|.//h6|.//table)"
PARAGRAPHS = frozenset({"p", "pre", "td", "blockquote"})
BLOCKS = frozenset({"address", "article", "aside", "blockquote", "center", "dd", "details", "dialog", "dir", "div",
                    "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5",
                    "h6", "header", "hgroup", "hr", "li", "main", "menu", "nav", "ol", "p", "pre", "section",
                    "summary", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul", "caption", "br"})
TAG_WEIGHT = {"div": 5, "article": 10, "main": 5, "section": 3, "pre": 3, "td": 3, "blockquote": 3, "address": -3,
              "ol": -3, "ul": -3, "dl": -3, "dd": -3, "dt": -3, "li": -3, "form": -3, "h1": -5, "h2": -5, "h3": -5,
              "h4": -5, "h5": -5, "h6": -5, "th": -5}


def extract_page(html: str, url: str, max_chars: int | None = None, links: str = "refs",
                 ) -> tuple[str | None, str, bool]:
    """(title, Markdown, cut): the main content of a page, about `max_chars` of it written (Markdown is written up to
    the budget and no further: the fetcher cuts the text to its token budget anyway). `links`: "refs" writes a link as
    [text][n] with the URLs listed once at the end, "inline" as [text](url), "text" as its words only."""
    if not html.strip():
        return None, "", False
    import lxml.etree
    import lxml.html
    try:
        root = _parse(html)
    except (ValueError, lxml.etree.ParserError):
        return None, "", False
    title = _one_line(root.findtext(".//title"))
    try:
        for el in root.xpath(NO_TEXT + "|" + HIDDEN):
            _drop(el)
        body = root.find("body")
        body = body if body is not None else root
        if len(body.text_content()) > FAST_PATH_CHARS:
            for el in body.xpath(NOT_CONTENT):
                _drop(el)
            content = (body.xpath("//main|//article") or [body])[0]
        else:
            content = main_content(body)
        writer = MarkdownWriter(url, max_chars + max_chars // 4 if max_chars is not None else None, links, title)
        text = writer.write(content)
        return title, text, writer.cut
    except MemoryError:
        raise
    except Exception as e:  # lxml's own errors on a broken tree, RecursionError on deep nesting
        if _out_of_memory(e):
            raise MemoryError from None
        log.debug("extraction failed on %s: %s; reading all the page's text", url, e)
    try:
        root = _parse(html)
        for el in root.xpath(NO_TEXT):  # the page's words, not its script source
            el.drop_tree()
        return title, tidy(root.text_content()), False
    except (ValueError, lxml.etree.ParserError):
        return title, "", False


def _parse(html: str):
    import lxml.etree
    import lxml.html
    try:
        return lxml.html.fromstring(html)
    except lxml.etree.XMLSyntaxError as e:
        if _out_of_memory(e):
            raise MemoryError from None
        raise lxml.etree.ParserError(str(e)) from None


def _out_of_memory(e: Exception) -> bool:
    """Whether libxml2 failed for want of memory (the child's RLIMIT_AS): lxml raises that as a syntax or XPath error
    ("unknown error"), with ERR_NO_MEMORY in the error's log."""
    import lxml.etree
    log_ = getattr(e, "error_log", None) or ()
    return any(entry.type == lxml.etree.ErrorTypes.ERR_NO_MEMORY for entry in log_)


def _drop(el) -> None:
    if el.getparent() is not None:
        el.drop_tree()  # keeps the tail: the text after a dropped element is still the page's


def _weight(el) -> int:
    """readability's class weight: class and id words that say article (+25) or not (-25)."""
    w = 0
    for name in (el.get("class"), el.get("id")):
        if name:
            if NEGATIVE.search(name):
                w -= 25
            if POSITIVE.search(name):
                w += 25
    return w


def _normal(text: str) -> str:
    return " ".join(text.split())


def main_content(body):
    """The element (a new <div> holding the picked elements when siblings join it) that is the page's main content."""
    # What the page marks as boilerplate goes first: readability's unlikely candidates, by class and id, and the
    # elements and roles that are navigation; but never one holding most of the page's text, which is a wrapper
    # whose class happens to say "header-style" or "sidebar-enabled" (readability retries without the rule instead).
    most = 0.4 * len(body.text_content())
    # Not inside code: a highlighter's <span class="hljs-comment"> is the code's own text.
    for el in body.xpath("//*[(@class or @id or @role) and not(ancestor::pre or ancestor::code)]"):
        if el.tag in ("body", "html", "a", "article", "main", "blockquote") or el.getparent() is None:
            continue  # a blockquote is quoted text even when its class says twitter (an embedded tweet)
        names = f"{el.get('class') or ''} {el.get('id') or ''}"
        if el.get("role") in NOT_CONTENT_ROLES or BOILERPLATE.search(names):
            pass
        elif not UNLIKELY.search(names) or MAYBE.search(names) or el.tag == "section" or (
                len(el) and el[0].tag in HEADINGS):
            continue  # a document's section named for its subject (Sphinx's id="menus", id="comments") is content
        if len(el.text_content()) < most:
            _drop(el)
    for el in body.xpath(NOT_CONTENT + "|" + CAPTIONS):
        if len(el.text_content()) < most:
            _drop(el)
    hinted = [el for el in body.xpath("//*[@itemprop='articleBody' or @class or @id]")
              if el.get("itemprop") == "articleBody" or ARTICLE_HINT.search(f"{el.get('class') or ''} {el.get('id') or ''}")]
    scores: dict = {}
    for p in body.iter("p", "pre", "td", "blockquote", "div", "section", "article", "font", "span"):
        if p.tag in ("span", "font") and (p.getparent() is None or p.getparent().tag in ("p", "span", "font", "a")):
            continue
        if p.tag in ("div", "section", "article", "span", "font") and any(
                isinstance(c.tag, str) and c.tag in BLOCKS and c.tag != "br" for c in p):
            # A box of blocks: its loose text (text between <br>s, beside the blocks) is a paragraph of its own,
            # as readability-lxml makes <p>s of it; the box is that paragraph's parent.
            text = (p.text or "") + "".join(c.tail or "" for c in p if c.tag == "br" or not isinstance(c.tag, str)
                                            or c.tag not in BLOCKS)
            parent = p
        else:
            # A <div> holding only text and inline elements is a paragraph, as readability treats it.
            text = p.text_content()
            parent = p.getparent()
        n = len(text.strip())
        if n < 25 or parent is None:
            continue
        score = 1 + text.count(",") + min(n // 100, 3)
        for ancestor, share in ((parent, 1.0), (parent.getparent(), 0.5)):
            if ancestor is None or not isinstance(ancestor.tag, str):
                continue
            if ancestor not in scores:
                scores[ancestor] = TAG_WEIGHT.get(ancestor.tag, 0) + _weight(ancestor)
            scores[ancestor] += score * share
    if not scores:
        return body
    best, best_score = None, -1e9
    densities: dict = {}
    for el, score in scores.items():
        density = _link_density(el)
        densities[el] = density
        final = score * (1 - density)
        scores[el] = final
        if final > best_score:
            best, best_score = el, final
    assert best is not None
    # Readability.js's rule for an article split into boxes of equal standing (one per section or card): when three
    # of the top five score near the best, their nearest common box is the content.
    near = [el for el, sc in sorted(scores.items(), key=lambda kv: -kv[1])[:5] if el is not best and sc >= 0.75 * best_score]
    if len(near) >= 2:
        for anc in best.iterancestors():
            if sum(1 for el in near if anc in el.iterancestors()) >= 2:
                if anc.tag not in ("html",):
                    best = anc
                    scores[best] = max(scores.get(best, 0), best_score)
                break
    # An element the page names as its article wins when it holds most of what scoring found (a paywall teaser or a
    # related-articles rail can also carry such a class, hence the share).
    best_len = len(best.text_content())
    named = [el for el in hinted if len(el.text_content()) >= 0.2 * best_len and _link_density(el) < 0.3]
    named = [el for el in named if not any(other in el.iterancestors() for other in named)]  # outermost only
    first = next((el for el in named if len(el.text_content()) >= 0.5 * best_len), None)
    if first is not None:
        if best in first.iterancestors() or first in best.iterancestors() or first is best:
            best = first if len(first.text_content()) <= 2 * best_len else best
        else:
            best = first
    if len(named) >= 2 and first is not None:
        # Several bodies the page names (a question and its answers, an article split around ads): their nearest
        # common box holds them all.
        common = set(named[0].iterancestors())
        for el in named[1:]:
            common &= set(el.iterancestors())
        box = next((anc for anc in named[0].iterancestors() if anc in common), None)
        if box is not None and box.tag not in ("html",):
            best = box
            scores[best] = max(scores.get(best, 0), best_score)
    # The page's own main element, when the pick lies inside it and it is prose, not a list of links: documentation
    # generators mark it reliably (Sphinx's role="main", rustdoc's #main-content, <main>).
    for anc in best.iterancestors():
        if anc.tag == "main" or anc.get("role") == "main" or anc.get("id") == "main-content":
            if _link_density(anc) < 0.25 and len(best.text_content()) < 0.5 * len(anc.text_content()):
                best = anc
            break
    parent = best.getparent()
    if parent is None or best.tag in ("body", "article", "main"):
        return _clean(best, scores)
    # Siblings that belong with it: readability's rule (a score near the best's, or a paragraph of prose).
    threshold = max(10.0, scores.get(best, best_score) * 0.2)
    picked = []
    for sib in parent:
        if not isinstance(sib.tag, str):
            continue
        if sib is best:
            picked.append(sib)
            continue
        bonus = 0.2 * scores.get(best, best_score) if sib.get("class") and sib.get("class") == best.get("class") else 0
        if sib in scores and scores[sib] + bonus >= threshold:
            picked.append(sib)
        elif sib.tag == "p":
            text = _normal(sib.text_content())
            density = densities[sib] if sib in densities else _link_density(sib)
            if (len(text) > 80 and density < 0.25) or (0 < len(text) <= 80 and density == 0 and re.search(r"\.( |$)", text)):
                picked.append(sib)
    if len(picked) == 1:
        return _clean(best, scores)
    import lxml.html
    holder = lxml.html.Element("div")
    for el in picked:
        el.tail = None
        holder.append(el)
    return _clean(holder, scores)


def _link_density(el) -> float:
    total = len(el.text_content())
    if not total:
        return 0.0
    linked = sum(len(a.text_content()) for a in el.iter("a"))
    return linked / total


def _clean(content, scores: dict):
    """readability's conditional clean: lists, tables and boxes inside the content that look like navigation,
    forms or image strips go, unless they carry prose (ten commas or more)."""
    for el in reversed(list(content.iter("table", "ul", "ol", "div", "section", "figure", "dl"))):
        if el is content or el.getparent() is None:
            continue
        weight = _weight(el)
        if weight + scores.get(el, 0) < 0:
            _drop(el)
            continue
        text = el.text_content()
        if text.count(",") >= 10:
            continue
        length = len(text.strip())
        density = _link_density(el)
        if length >= 500 and density < 0.25:
            continue  # prose, in a script that uses few commas or in boxes without <p>
        if el.tag in ("table", "dl") and len(text.strip()) >= 25:
            continue  # data: a table's cells and a definition list are rarely prose with commas
        if el.find(".//pre") is not None or el.find(".//code") is not None:
            continue  # code is what a coding agent reads a page for
        if el.tag in ("ul", "ol") and density <= 0.5:
            items = sum(1 for child in el if child.tag == "li")
            if length * (1 - density) >= 30 * max(items, 1):
                continue  # items that say something beside their links: a parameter list (name <type> what it is)
        ps = sum(1 for _ in el.iter("p"))
        imgs = sum(1 for _ in el.iter("img"))
        lis = sum(1 for _ in el.iter("li")) - 100
        if ((imgs > 1 and ps / imgs < 0.5) or (el.tag not in ("ul", "ol") and lis > ps)
                or (length < 25 and (imgs == 0 or imgs > 2) and el.tag not in ("ul", "ol"))
                or (weight < 25 and density > 0.2) or (weight >= 25 and density > 0.5)):
            if density < 0.5 and el.xpath(KEEP_XPATH):
                continue  # a box around a heading or a table (GitHub's markdown-heading) is structure, not clutter
            _drop(el)
    return content


# -- Markdown ------------------------------------------------------------------------------------

class _Full(Exception):
    """The writer reached its budget."""


CODE_LANG = re.compile(r"(?:^|\s)(?:language-|lang-|highlight-source-|highlight-text-|highlight-|brush:\s*)([\w+#.-]+)",
                       re.I)
MAX_COLUMNS = 32
BREAK = "\x00"  # a <br> inside a paragraph, until the paragraph's spaces are squeezed (page text holds no NUL: lxml drops it)
HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
INLINE = frozenset({"a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "del", "dfn", "em", "font", "i", "ins", "kbd",
                    "label", "mark", "q", "s", "samp", "small", "span", "strike", "strong", "sub", "sup", "time", "tt",
                    "u", "var", "wbr", "nobr", "img", "picture", "acronym", "big", "output", "ruby", "rt", "rp"})
INLINE_CODE = frozenset({"code", "kbd", "samp", "tt", "var"})
SKIP = frozenset({"img", "picture", "video", "audio", "source", "track", "map", "area", "head", "title", "meta",
                  "link", "base"})


class MarkdownWriter:
    """Writes an lxml element's content as Markdown: ATX headings, "-" and "1." lists, fenced code with the language
    the page names, pipe tables, quotes; links as [text][n] with one list of URLs at the end. Stops at `limit`
    characters (then `cut` is true). Repeated paragraphs stay (deduplicating them cost the benchmark 0.002 F1: its
    bodies repeat text too); captions, which galleries repeat, were dropped with the boilerplate."""

    def __init__(self, base_url: str, limit: int | None = None, links: str = "refs", title: str | None = None):
        self.base = base_url
        self.limit = limit
        self.links_mode = links
        self.title = _normal(title or "").lower()
        self.blocks: list[str] = []  # each a finished block, prefixes applied; "" separates by a blank line
        self.size = 0
        self.cut = False
        self.urls: dict[str, int] = {}
        self.prefix: list[str] = []
        self.marker: str | None = None  # a list item's "- " or "1. ", put on its first line only
        self.tight = 0  # inside a list: blocks are lines, not paragraphs

    def write(self, el) -> str:
        try:
            self.flow(el)
        except _Full:
            self.cut = True
        out = []
        for block in self.blocks:
            out.append(block)
        text = tidy("\n".join(out))
        if self.urls and self.links_mode == "refs":
            text += "\n\n" + "\n".join(f"[{n}]: {u}" for u, n in self.urls.items())
        return text

    # blocks

    def emit(self, text: str) -> None:
        text = text.strip("\n")
        if not text.strip():
            return
        if self.limit is not None and self.size >= self.limit:
            raise _Full
        lines = text.split("\n")
        rest = "".join(self.prefix)
        if self.marker is not None:
            first = "".join(self.prefix[:-1]) + self.marker
            self.marker = None
        else:
            first = rest
        block = "\n".join([first + lines[0]] + [(rest + line) if line else rest.rstrip() for line in lines[1:]])
        if not self.tight:
            self.blocks.append("")
        self.blocks.append(block)
        self.size += len(block) + 1

    def flow(self, el) -> None:
        """An element's children as blocks: runs of text and inline elements become paragraphs."""
        run: list[str] = [el.text or ""]
        for child in el:
            tag = child.tag
            if not isinstance(tag, str) or tag in SKIP:
                pass
            elif tag in BLOCKS or (tag not in INLINE and len(child)):
                # A custom element (GitHub's <markdown-accessiblity-table>) is a box when it holds elements.
                self.paragraph(run)
                run = []
                self.block(child)
            else:
                run.append(self.inline(child))
            run.append(child.tail or "")
        self.paragraph(run)

    def paragraph(self, parts: list[str]) -> None:
        text = "".join(parts)
        text = _normal(text) if BREAK not in text else "\n".join(
            line for line in (_normal(x) for x in text.split(BREAK)) if line)
        if text:
            self.emit(text)

    def block(self, el) -> None:
        tag = el.tag
        if tag in HEADINGS:
            text = _normal(self.inline_children(el))
            if text and text.lower() != self.title and text.lower() not in self.title.split(" | ")[0:1]:
                self.emit("#" * HEADINGS[tag] + " " + text)
        elif tag == "pre":
            self.code_block(el)
        elif tag in ("ul", "ol", "menu", "dir"):
            self.list_items(el, ordered=tag == "ol")
        elif tag == "li":
            self.list_items_of([el], ordered=False)
        elif tag == "blockquote":
            self.prefix.append("> ")
            try:
                self.flow(el)
            finally:
                self.prefix.pop()
        elif tag == "table":
            self.table(el)
        elif tag == "hr":
            self.emit("---")
        elif tag == "br":
            pass
        elif tag == "dt":
            self.emit("**" + _normal(self.inline_children(el)) + "**" if _normal(el.text_content()) else "")
        elif tag == "dd":
            self.prefix.append(": ")
            try:
                self.flow(el)
            finally:
                self.prefix.pop()
        else:
            self.flow(el)

    def list_items(self, el, ordered: bool) -> None:
        self.list_items_of([li for li in el if isinstance(li.tag, str)], ordered)

    def list_items_of(self, items, ordered: bool) -> None:
        start = 1
        if ordered:
            try:
                start = int(items[0].getparent().get("start", "1")) if items else 1
            except (ValueError, TypeError, AttributeError):
                start = 1
        if not self.tight:
            self.blocks.append("")
        self.tight += 1
        try:
            n = start
            for li in items:
                if li.tag != "li":
                    self.flow(li) if li.tag in BLOCKS else self.paragraph([self.inline(li)])
                    continue
                marker = f"{n}. " if ordered else "- "
                n += 1
                self.prefix.append(" " * len(marker))
                self.marker = marker
                try:
                    self.flow(li)
                finally:
                    self.prefix.pop()
                    self.marker = None
        finally:
            self.tight -= 1

    def code_block(self, el) -> None:
        code = el.text_content().strip("\n")
        if not code.strip():
            return
        lang = ""
        for node in [*el.iter("code"), el, *list(el.iterancestors())[:2]]:
            m = CODE_LANG.search(node.get("class") or "")
            lang = (m.group(1) if m else "") or node.get("data-lang") or ""
            if lang:
                break
        lang = lang.lower() if re.fullmatch(r"[\w+#.-]{1,20}", lang) else ""
        fence = "```"
        while fence in code:
            fence += "`"
        self.emit(f"{fence}{lang}\n{code}\n{fence}")

    def table(self, el) -> None:
        rows = [tr for tr in el.iter("tr") if _own_table(tr, el)]
        cells = [[c for c in tr if c.tag in ("td", "th")] for tr in rows]
        width = max((len(r) for r in cells), default=0)
        # A layout table (one column, more columns than a reader can follow, or cells holding blocks or tables) is
        # read as the blocks it holds.
        if width < 2 or width > MAX_COLUMNS or el.find(".//table") is not None or any(
                c.find(".//p") is not None or c.find(".//pre") is not None for r in cells for c in r):
            for tr in rows:
                for c in tr:
                    if isinstance(c.tag, str):
                        self.flow(c)
            return
        caption = el.find("caption")
        if caption is not None and _normal(caption.text_content()):
            self.emit(_normal(self.inline_children(caption)))
        lines = []
        used = self.size
        for i, r in enumerate(cells):
            texts = []
            for c in r:
                texts.append(_normal(self.inline_children(c)).replace("|", "\\|"))
                used += len(texts[-1]) + 3
                if self.limit is not None and used >= self.limit:
                    break  # a row of 100,000 cells stops at the budget too
            texts += [""] * (width - len(texts))
            lines.append("| " + " | ".join(texts) + " |")
            if i == 0:
                lines.append("|" + "---|" * width)
                used += 4 * width
            if self.limit is not None and used >= self.limit:
                self.emit("\n".join(lines))
                raise _Full
        self.emit("\n".join(lines))

    # inline

    def inline_children(self, el) -> str:
        parts = [el.text or ""]
        for child in el:
            parts.append(self.inline(child))
            parts.append(child.tail or "")
        return "".join(parts)

    def inline(self, el) -> str:
        tag = el.tag
        if not isinstance(tag, str) or tag in SKIP:
            return ""
        if tag == "br":
            return BREAK
        if tag in INLINE_CODE:
            text = el.text_content()
            if not text.strip():
                return text
            tick = "``" if "`" in text else "`"
            return f"{tick}{text.strip()}{tick}"
        if tag == "a":
            return self.link(el)
        if tag in BLOCKS or tag == "pre":
            return " " + self.inline_children(el) + " "
        return self.inline_children(el)

    def link(self, el) -> str:
        text = self.inline_children(el)
        label = _normal(text)
        href = (el.get("href") or "").strip()
        if not label or self.links_mode == "text" or not href or href.startswith(("#", "javascript:")):
            return text
        try:
            target = urllib.parse.urljoin(self.base, href)
        except ValueError:
            return text
        if not target.startswith(("http://", "https://", "mailto:", "ftp://")) or label in (target, href):
            return text
        lead, trail = text[:len(text) - len(text.lstrip())], text[len(text.rstrip()):]
        if self.links_mode == "inline":
            return f"{lead}[{label}]({target}){trail}"
        n = self.urls.setdefault(target, len(self.urls) + 1)
        return f"{lead}[{label}][{n}]{trail}"


def _own_table(tr, table) -> bool:
    for anc in tr.iterancestors("table"):
        return anc is table
    return False




# -- the child -----------------------------------------------------------------------------------

def _read_exact(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def _child_main(cpu_seconds: int, memory_bytes: int) -> None:
    # Ctrl-C reaches the whole process group; the worker decides when its children end (it closes stdin).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The child has no log of its own, and page text stays out of the proxy's.
    logging.disable(logging.CRITICAL)
    import resource

    import lxml.html  # noqa: F401  - imported before the memory limit, so the limit is the pages'
    # pdfminer is not: it brings cryptography, whose library maps tens of MiB that an HTML-only child never uses
    # (the first PDF imports it, within the limit).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU's default action dumps core
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    while True:
        head = _read_exact(inp, FRAME_HEADER)
        if head is None:
            return  # the worker closed stdin, or died
        try:
            frame = _read_exact(inp, int.from_bytes(head, "big"))
        except MemoryError:  # a page bigger than the room the limit leaves: said like any other memory failure
            frame = codec.dumps({"memory": True})
        if frame is None:
            return
        # RLIMIT_CPU counts the process's whole life, so each page gets `cpu_seconds` more than used so far;
        # past it the kernel sends SIGXCPU, which ends the child (the pool names the limit and starts another).
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime) + cpu_seconds
        if cpu_hard != resource.RLIM_INFINITY:
            soft = min(soft, cpu_hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
        try:
            job = codec.loads(frame)
            if job.get("memory"):
                raise MemoryError
            if "pdf" in job:
                # Half the CPU limit for reading pages: what was read by then is served, cut short, before the
                # kernel's SIGXCPU would lose it all.
                title, text, cut, _ = pdftext.pdf_to_text(base64.b64decode(job["pdf"]), job.get("max_chars"),
                                                          cpu_budget=cpu_seconds / 2)
            else:
                title, text, cut = extract_page(job["html"], job["url"], job.get("max_chars"))
            answer: dict = {"title": title, "text": text, "cut": cut}
        except pdftext.PdfRefused as e:
            answer = {"refused": e.code, "message": e.message}
        except MemoryError:
            answer = {"error": "memory"}
        data = codec.dumps(answer)
        out.write(len(data).to_bytes(FRAME_HEADER, "big") + data)
        out.flush()
        if "error" in answer:
            return  # after a MemoryError the heap is in no state to trust: the pool starts a fresh child


# -- the pool (runs in the proxy's worker) --------------------------------------------------------

class _Child:
    """One extraction process, started on first use and again after it died; used by one page at a time."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.proc: subprocess.Popen | None = None
        self.killed = False

    def ensure(self) -> subprocess.Popen:
        if self.proc is not None and self.proc.poll() is not None:
            self.stop()
        if self.proc is None:
            # Same process group as the worker (gunicorn's and the tests' group signals reach it); its own
            # stdin and stdout only (close_fds), so a dead worker's pipes close and the child ends.
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                         close_fds=True, cwd=str(Path(__file__).resolve().parents[2]))
            assert self.proc.stdin is not None and self.proc.stdout is not None
            os.set_blocking(self.proc.stdin.fileno(), False)
            os.set_blocking(self.proc.stdout.fileno(), False)
            self.killed = False
        return self.proc

    def kill(self) -> None:
        """SIGKILL now; safe from any greenlet, thread or loop callback (a signal, no wait)."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            self.killed = True
            try:
                proc.kill()
            except OSError:
                pass  # it exited already

    def stop(self, grace: float = 0.0) -> int | None:
        """End the child (stdin closed; killed if still there after `grace` s) and reap it; its exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        for pipe in (proc.stdin, proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass  # a pipe the child's death already broke
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
        return proc.wait()


class ExtractPool:
    """Up to `processes` children extracting pages, at most `queue` pages waiting for one; each page
    under `cpu_seconds` of CPU (and three times that of wall clock) and `memory_bytes` of address space.

    Waiting never blocks the event loop: the pipes are non-blocking and waited on with select(),
    which gevent makes cooperative; in a plain thread it is an ordinary wait.
    """

    _shared: dict[tuple, ExtractPool] = {}
    _shared_lock = threading.Lock()

    def __init__(self, processes: int, cpu_seconds: float, memory_bytes: int, queue_size: int):
        self.cpu_seconds = max(1, math.ceil(cpu_seconds))
        self.wall_seconds = 3 * self.cpu_seconds + 1  # a busy machine shares its CPUs: wall time runs ahead of CPU time
        self.memory_bytes = memory_bytes
        self.queue_size = queue_size
        argv = [sys.executable, "-m", "proxy.backends.extract", str(self.cpu_seconds), str(memory_bytes)]
        self._children = [_Child(argv) for _ in range(max(1, processes))]
        self._idle: queue.LifoQueue[_Child] = queue.LifoQueue()  # the warmest child first
        for child in self._children:
            self._idle.put(child)
        self._waiting = 0
        self._lock = threading.Lock()
        atexit.register(self.close)

    @classmethod
    def from_config(cls, cfg) -> ExtractPool:
        """The one pool of this process for these settings (every Fetcher of a worker shares it)."""
        key = (cfg.web_fetch_extract_processes, cfg.web_fetch_extract_cpu_seconds,
               cfg.web_fetch_extract_memory_mb, cfg.web_fetch_extract_queue)
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None:
                pool = cls._shared[key] = cls(key[0], key[1], key[2] * 1024 * 1024, key[3])
            return pool

    def extract(self, html: str, url: str, cancel: Cancel | None = None,
                max_chars: int | None = None) -> tuple[str | None, str, bool]:
        """(title, Markdown, cut) of a page, about max_chars of it; raises ExtractError naming the limit a page went over."""
        return self._submit({"url": url, "html": html, "max_chars": max_chars}, cancel)

    def extract_pdf(self, data: bytes, url: str, cancel: Cancel | None = None,
                    max_chars: int | None = None) -> tuple[str | None, str, bool]:
        """(title, text, cut) of a PDF, under the same limits as a page; raises ExtractError for a limit it went over
        and for a PDF that cannot be read (encrypted, only images: proxy/backends/pdftext.py)."""
        return self._submit({"url": url, "pdf": base64.b64encode(data).decode("ascii"), "max_chars": max_chars}, cancel)

    def _submit(self, job: dict, cancel: Cancel | None) -> tuple[str | None, str, bool]:
        with self._lock:
            if self._waiting >= self.queue_size:
                raise ExtractError("unavailable", f"the proxy is extracting {len(self._children)} pages and has "
                                   f"{self._waiting} more waiting (WEB_FETCH_EXTRACT_QUEUE); try again later.")
            self._waiting += 1
        try:
            child = self._idle.get(timeout=self.wall_seconds)
        except queue.Empty:
            raise ExtractError("unavailable", f"no extraction process came free within {self.wall_seconds} s; "
                               "try again later.") from None
        finally:
            with self._lock:
                self._waiting -= 1
        undo = cancel.on_abort(child.kill) if cancel is not None else None
        try:
            return self._run(child, job)
        finally:
            if undo is not None:
                undo()
            self._idle.put(child)

    def _run(self, child: _Child, job_fields: dict) -> tuple[str | None, str, bool]:
        deadline = time.monotonic() + self.wall_seconds
        try:
            proc = child.ensure()
        except OSError as e:
            raise ExtractError("unavailable", f"the extraction process cannot start ({e}).") from None
        assert proc.stdin is not None and proc.stdout is not None
        job = codec.dumps(job_fields)
        sent = _send(proc.stdin.fileno(), len(job).to_bytes(FRAME_HEADER, "big") + job, deadline)
        answer = _receive(proc.stdout.fileno(), deadline) if sent else None
        if answer is None:
            return self._failed(child, timed_out=time.monotonic() >= deadline)
        try:
            reply = codec.loads(answer)
        except ValueError:
            reply = {"error": "protocol"}
        if isinstance(reply, dict) and isinstance(reply.get("refused"), str):
            # A document the child read and cannot give text of (a PDF with a password): the child is fine.
            raise ExtractError(reply["refused"], str(reply.get("message") or "the document cannot be read."))
        if not isinstance(reply, dict) or "error" in reply or not isinstance(reply.get("text"), str):
            return self._failed(child, timed_out=False, reported=str(reply.get("error")) if isinstance(reply, dict) else "")
        title = reply.get("title")
        return (title if isinstance(title, str) else None), reply["text"], reply.get("cut") is True

    def _failed(self, child: _Child, timed_out: bool, reported: str = ""):
        """The child did not answer: stop it (the next page starts a fresh one) and say which limit was hit."""
        if timed_out:
            child.kill()
        killed = child.killed
        status = child.stop(grace=0.5)
        if timed_out:
            why = f"extracting its text took longer than {self.wall_seconds} s"
        elif status == -signal.SIGXCPU:
            why = f"extracting its text took more than {self.cpu_seconds} s of CPU (WEB_FETCH_EXTRACT_CPU_SECONDS)"
        elif reported == "memory" or (status == -signal.SIGKILL and not killed) or status == -signal.SIGSEGV:
            why = (f"extracting its text needed more than {self.memory_bytes // (1024 * 1024)} MiB of memory "
                   "(WEB_FETCH_EXTRACT_MEMORY_MB)")
        elif killed:
            why = "the extraction was stopped"
        else:
            why = f"the extraction process failed (exit status {status})"
        log.warning("extract: %s", why)
        raise ExtractError("url_not_accessible", f"the page is too costly to read: {why}.")

    def close(self) -> None:
        """Stop every child (the worker is exiting): idle ones end at once on their closed stdin."""
        for child in self._children:
            try:
                child.stop(grace=1.0)
            except Exception as e:  # at exit, one child's trouble must not keep the others running
                log.debug("extract: stopping a child: %s", e)


def _send(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of `data` to a non-blocking pipe by `deadline`; False when the child is gone or too slow."""
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        _, writable, _ = select.select([], [fd], [], left)
        if not writable:
            continue
        try:
            n = os.write(fd, view[:PIPE_CHUNK])
        except BlockingIOError:
            continue
        except OSError:
            return False  # the child died (EPIPE)
        view = view[n:]
    return True


def _receive(fd: int, deadline: float) -> bytes | None:
    """One frame from a non-blocking pipe by `deadline`; None at an end of stream or the deadline."""
    buf = bytearray()
    need = FRAME_HEADER
    while len(buf) < need:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            continue
        try:
            data = os.read(fd, max(PIPE_CHUNK, need - len(buf)))
        except BlockingIOError:
            continue
        except OSError:
            return None
        if not data:
            return None
        buf += data
        if need == FRAME_HEADER and len(buf) >= FRAME_HEADER:
            need = FRAME_HEADER + int.from_bytes(buf[:FRAME_HEADER], "big")
    return bytes(buf[FRAME_HEADER:need])


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
