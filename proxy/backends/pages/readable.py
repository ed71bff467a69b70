"""A page's main content, picked by readability's scoring on one lxml parse (trafilatura asked as a second opinion when
that pick keeps little of the page, the page's visible text as the floor), and written as Markdown
(proxy/backends/pages/markdown.py): extract_page, pure, run inside the extraction pool's children (proxy/backends/pages/extract.py)
and tested in-process by tests/test_extract.py and tests/test_fetch.py; scripts/bench_articles.py measures it on
held-out public sets (docs/performance.md).
"""
from __future__ import annotations

import functools
import logging
import re
from collections import Counter
from typing import NamedTuple

from proxy.backends.pages.invisible import drop_hidden
from proxy.backends.pages.markdown import BLOCKS, HEADINGS, MarkdownWriter, normal, tidy

log = logging.getLogger("proxy.fetch")

# -- the extraction itself (runs in a child) -----------------------------------------------------
#
# One lxml parse; what is never text a reader sees is dropped; the main content is picked by readability's scoring
# (Arc90's rules as readability-lxml and Mozilla's Readability.js apply them) in one pass over the paragraphs, without
# readability-lxml's second parse, retries and HTML round trip; then a Markdown writer of our own turns it into what
# the model reads, stopping at the budget. scripts/bench_articles.py measures it against the libraries.

def _one_line(text: str | None) -> str | None:
    return (" ".join(text.split()) or None) if text else None


# Above this much text (judged after scripts, styles and comments are gone: a news page's raw HTML is mostly those),
# scoring is skipped for a cheap rule: keep <main> or <article> if there is one, without navigation.
FAST_PATH_CHARS = 512 * 1024
# What holds no text a reader sees, in every path (a comment is not an element: text_content() refuses it).
NO_TEXT = ("//script|//style|//template|//comment()|//processing-instruction()|//svg|//math|//iframe"
           "|//object|//embed|//canvas|//input|//select|//textarea|//dialog")
# Usually no text a reader sees either, but judged by what they hold: Discourse serves a thread's posts inside
# <noscript> to readers without JavaScript, and a menu <button> holding unclosed <div>s takes the rest of the page into
# itself when libxml2 parses it. With enough text they are unwrapped, their words kept; else dropped.
MAYBE_TEXT = "//noscript|//button"
UNWRAP_CHARS = 200
# `<?xml version="1.0" encoding="..."?>` (XHTML): lxml refuses a str that declares an encoding; the str is decoded.
XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*>")
# Enough words, few of them links: content, whatever its class or id says ("elementor-widget-container",
# "field--label-hidden", "MtnComment", "zen-one-sidebar-second": the class-name rules judged by content).
PROSE_CHARS = 500
PROSE_LINKS = 0.25
LEAD_CHARS = 100
LINK_PARAGRAPH_CHARS = 250
LINK_PARAGRAPH_SHARE = 0.6
# Below this share of the page's visible text, our pick is doubted and trafilatura asked (_with_floor); tuned on
# WCXB's dev split: 0.3 took trafilatura's pick on about one page in six.
SECOND_OPINION_SHARE = 0.3
# Readers' comments are prose too, but not the article (every benchmark's bodies leave them out, and scoring would
# pick a long thread over a short article): they are not kept for their prose.
COMMENTS = re.compile(r"comment|disqus|respond|replies")
CARDS = 4
WORD = re.compile(r"\w")
NO_TEXT_NOTE = "(The page has no readable text: {why}.)"
NO_WORDS = ("its HTML holds no text a reader sees (a page built by JavaScript, which is not run here, or one whose "
            "text the page itself hides)")
# Photo captions and credits: the benchmark's human-made bodies leave them out, and galleries repeat them; a short
# figure or box named for its image (a picture and a line under it) is one too, unless it holds code, a table or a quote.
CAPTIONS = ("//figcaption|//*[contains(@class,'caption') or contains(@class,'credit')][string-length() < 300]"
            "|//figure[(.//img or .//picture or .//video) and not(.//pre or .//table or .//blockquote)]"
            "[string-length() < 300]"
            "|//*[contains(@class,'img') or contains(@class,'image') or contains(@class,'photo')]"
            "[.//img and not(.//pre or .//table or .//blockquote)][string-length() < 300]")
NOT_CONTENT = "//nav|//header|//footer|//aside|//menu|//form[not(.//p)]"
# What the page tells screen readers to skip: icons, duplicated labels, decoration (what a browser hides went before,
# in proxy/backends/pages/invisible.py's drop_hidden, which counts it; this only leaves out what is not the content).
HIDDEN = "//*[@aria-hidden='true']"
# Class and id words of what is not the article (readability's unlikely candidates, with what the benchmark and the
# issue's pages showed leaking: WordPress's "Like this: Loading..." widgets, share bars, related posts, tables of
# contents), and those that may still hold it.
UNLIKELY = re.compile(
    r"-ad-|ad-break|agegate|banner|breadcrumb|combx|comment|communit|cookie|disqus|extra|foot|gdpr|header|legends|"
    r"menu|modal|nav|newsletter|outbrain|pager|paginat|popup|promo|related|remark|replies|rss|share|sharing|"
    r"shoutbox|sidebar|skyscraper|social|sponsor|subscri|taboola|tweet|twitter|sd-like|likes-widget|jp-relatedposts|"
    r"sharedaddy|\btoc\b|gtoc|signup|recommend|most-popular|trending|byline|author-bio|\btags?\b|skip-link|masthead|"
    r"print-only|visually-hidden|sr-only|screen-reader")
NOT_CONTENT_ROLES = frozenset({"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar",
                               "dialog", "alert", "alertdialog", "tooltip"})
# Unlikely even when a word of MAYBE is in the name too ("jp-relatedposts", "share-post", "newsletter-content"), and
# boxes set in an article beside its text: info and fact boxes, image legends, disclaimers.
BOILERPLATE = re.compile(r"sharedaddy|jp-relatedposts|likes-widget|sd-like|sd-sharing|share|sharing|social|"
                         r"newsletter|cookie|related|recommend|promo|subscri|outbrain|taboola|infobox|factbox|"
                         r"disclaimer|disclosure|legend")
# A teaser box links to the story it teases (a news site's "teaser" rail inside an article); a paragraph named
# "teaser" without a link is the article's own lead, and stays.
TEASER = re.compile(r"teaser")
# What sites call a story's lead paragraph (Le Monde's "chapo", the Guardian's "standfirst", "Einleitung", "dek");
# not "summary" or "excerpt", which name the entries of a listing as often.
LEAD = re.compile(r"intro|lead|abstract|subtitle|chapo|standfirst|einleitung|\bdek\b|teaser")
LEAD_LEVELS = 3
MAYBE = re.compile(r"and|article|body|column|main|shadow|content|entry|post|story|text")
POSITIVE = re.compile(r"article|body|content|entry|hentry|h-entry|main|page|pagination|post|text|blog|story|"
                      r"markdown|prose|docs?\b|documentation|readme")
NEGATIVE = re.compile(r"-ad-|hidden|^hid$| hid$| hid |^hid |banner|combx|comment|com-|contact|foot|footer|footnote|"
                      r"gdpr|masthead|media|meta|outbrain|promo|related|scroll|share|shoutbox|sidebar|skyscraper|"
                      r"sponsor|shopping|tags|tool|widget|caption|credit")
# Containers the page says are its article; one with enough text wins over scoring (trafilatura's BODY_XPATH idea).
ARTICLE_HINT = re.compile(r"articlebody|article-body|article__body|article-content|article__content|articletext|"
                          r"article-text|post-content|post-body|post_content|entry-content|story-body|storybody|"
                          r"story-content|body-text|rich-text|markdown-body|js-post-body|content-body")
KEEP_XPATH = "boolean(self::table|.//h1|.//h2|.//h3|.//h4|.//h5|.//h6|.//table)"
TAG_WEIGHT = {"div": 5, "article": 10, "main": 5, "section": 3, "pre": 3, "td": 3, "blockquote": 3, "address": -3,
              "ol": -3, "ul": -3, "dl": -3, "dd": -3, "dt": -3, "li": -3, "form": -3, "h1": -5, "h2": -5, "h3": -5,
              "h4": -5, "h5": -5, "h6": -5, "th": -5}


class Extracted(NamedTuple):
    title: str | None
    text: str  # Markdown, or NO_TEXT_NOTE saying why there is none
    cut: bool  # stopped at the budget
    hidden: int  # hidden elements dropped (proxy/backends/pages/invisible.py), for the page's head line


def extract_page(html: str, url: str, max_chars: int | None = None, links: str = "refs") -> Extracted:
    """The main content of a page as Markdown, about `max_chars` of it written (Markdown is written up to the budget
    and no further: the fetcher cuts the text to its token budget anyway). `links`: "refs" writes a link as [text][n]
    with the URLs listed once at the end, "inline" as [text](url), "text" as its words only.
    What a browser hides goes first (proxy/backends/pages/invisible.py), so no path below, the floors included, writes it.
    Never empty while the page has text a reader sees (the floor in _with_floor); a page without any comes back as
    one sentence saying why (NO_TEXT_NOTE), so the model is not left to guess."""
    if not html.strip():
        return Extracted(None, NO_TEXT_NOTE.format(why="the server sent an empty page"), False, 0)
    import lxml.etree
    try:
        root = _parse(html)
    except (ValueError, lxml.etree.ParserError):
        return Extracted(None, NO_TEXT_NOTE.format(why="its HTML could not be parsed"), False, 0)
    title = _one_line(root.findtext(".//title"))
    limit = max_chars + max_chars // 4 if max_chars is not None else None
    hidden = 0
    try:
        hidden = drop_hidden(root)
        for el in root.xpath(NO_TEXT + "|" + HIDDEN):
            _drop(el)
        _unwrap_or_drop(root.xpath(MAYBE_TEXT))
        body = root.find("body")
        body = body if body is not None else root
        page_chars = len(normal(body.text_content()))
        if page_chars > FAST_PATH_CHARS:
            for el in body.xpath(NOT_CONTENT):
                _drop(el)
            content = (body.xpath("//main|//article") or [body])[0]
        else:
            content = _with_floor(main_content(body), page_chars, html, url)
        writer = MarkdownWriter(url, limit, links, title)
        text = writer.write(content)
        if not WORD.search(text):
            # The last floor: every word of the page a reader sees, when picking its content left none.
            writer = MarkdownWriter(url, limit, links, title)
            text = writer.write(_visible_body(html))
        if not WORD.search(text):
            return Extracted(title, NO_TEXT_NOTE.format(why=NO_WORDS), False, hidden)
        return Extracted(title, text, writer.cut, hidden)
    except MemoryError:
        raise
    except Exception as e:  # lxml's own errors on a broken tree, RecursionError on deep nesting
        if _out_of_memory(e):
            raise MemoryError from None
        log.debug("extraction failed on %s: %s; reading all the page's text", url, e)
    try:
        text = tidy(_visible_body(html).text_content())
        return Extracted(title, text if WORD.search(text) else NO_TEXT_NOTE.format(why=NO_WORDS), False, hidden)
    except (ValueError, lxml.etree.ParserError):
        return Extracted(title, NO_TEXT_NOTE.format(why="its HTML could not be parsed"), False, hidden)


def _visible_root(html: str):
    """A fresh parse of the page without what a browser hides: the floors start again from the page, since the
    extraction took its own tree apart."""
    root = _parse(html)
    drop_hidden(root)
    return root


def _visible_body(html: str):
    """The page's body with only what holds no visible text taken out: the floor under every extraction."""
    root = _visible_root(html)
    for el in root.xpath(NO_TEXT + "|" + HIDDEN):  # the page's words, not its script source nor what it hides
        _drop(el)
    _unwrap_or_drop(root.xpath(MAYBE_TEXT))
    body = root.find("body")
    return body if body is not None else root


def _with_floor(content, page_chars: int, html: str, url: str):
    """The content, or a second engine's pick when ours kept little of a page that has much more text: trafilatura's
    rules find the content of shop, listing and service pages where readability's scoring settles on one box of a
    grid (measured on WCXB's dev split: docs/performance.md). The longer of the two is kept."""
    kept = len(normal(content.text_content()))
    if kept >= SECOND_OPINION_SHARE * page_chars:
        return content
    other = second_opinion(_visible_root(html), url)
    if other is not None and len(normal(other.text_content())) > kept:
        return other
    return content


def second_opinion(root, url: str):
    """trafilatura's main content of a parsed page (which it takes apart) as an lxml element (its HTML output:
    paragraphs, headings, lists, tables, links), or None when it finds none."""
    import lxml.etree
    import trafilatura
    try:
        out = trafilatura.extract(root, url=url or None, output_format="html", include_links=True,
                                  include_formatting=True, include_tables=True, include_comments=True, fast=True,
                                  with_metadata=False)
    except (ValueError, lxml.etree.LxmlError) as e:
        log.debug("trafilatura failed on %s: %s", url, e)
        return None
    if not out:
        return None
    root = _parse(out)
    body = root.find("body")
    return body if body is not None else root


def _parse(html: str):
    import lxml.etree
    import lxml.html
    try:
        return lxml.html.fromstring(XML_DECLARATION.sub("", html, count=1))
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


@functools.lru_cache(maxsize=16384)
def _has(pattern: re.Pattern, names: str) -> bool:
    """pattern.search(names) in lower case, remembered: a page repeats the same class names on hundreds of elements,
    and these searches were a third of the extraction's time. The class-word patterns are written in lower case and
    compiled without re.I, which made these long alternations five to seven times slower."""
    return pattern.search(names.lower()) is not None


def _named(pattern: re.Pattern, names: tuple[str, str]) -> bool:
    """Whether an element's class or its id (from _names) says what the pattern says. Each is looked up on its own:
    a class attribute repeats all over a page and is remembered, an id is unique and would make every pair new."""
    return _has(pattern, names[0]) or (bool(names[1]) and _has(pattern, names[1]))


def _unwrap_or_drop(elements) -> None:
    for el in reversed(elements):  # inner ones first
        if el.getparent() is None:
            continue
        if len(el.text_content().strip()) >= UNWRAP_CHARS:
            el.drop_tag()
        else:
            el.drop_tree()


def _prose(el, text: str, linked: dict, chars: int = PROSE_CHARS) -> bool:
    """Whether an element reads as content, whatever its class says: enough text, few of its words links."""
    n = len(text.strip())
    return n >= chars and linked.get(el, 0) < PROSE_LINKS * len(text)


def _has_lead(header, linked: dict) -> bool:
    """Whether a <header> holds a paragraph of prose (an article's lead): a site's header holds links and a logo."""
    return any(_prose(p, p.text_content(), linked, LEAD_CHARS) for p in header.iter("p"))


def _card(el, length: int, linked: int, groups: dict) -> bool:
    """One card of a grid (a listing's, a shop's collection): a box with words of its own beside its links, among at
    least CARDS siblings of the same tag and class. Each card is mostly links, which readability's clean would drop:
    on a listing page the grid is the content."""
    cls = el.get("class")
    parent = el.getparent()
    if not cls or parent is None or length - linked < 15:
        return False
    if parent not in groups:  # counted once a parent: a grid of a thousand cards is not walked a thousand times
        groups[parent] = Counter((sib.tag, sib.get("class")) for sib in parent)
    return groups[parent][(el.tag, cls)] >= CARDS


def _linked_chars(root) -> dict:
    """Characters of link text under each element, from one pass over the links: a link density for every box
    without walking each box's links again (_drop_counted keeps it true as boxes go)."""
    linked: dict = {}
    for a in root.iter("a"):
        n = len(a.text_content())
        if n:
            linked[a] = linked.get(a, 0) + n
            for anc in a.iterancestors():
                linked[anc] = linked.get(anc, 0) + n
    return linked


def _drop_counted(el, linked: dict) -> None:
    n = linked.get(el, 0)
    if n:
        for anc in el.iterancestors():
            linked[anc] = linked.get(anc, 0) - n
    _drop(el)


# A page builder names every box by its place in the builder's grid, on every page it builds: Elementor's
# "elementor-widget-container" around each text block ("widget"), Drupal's "field--label-hidden" on a field whose
# label is hidden, not its text ("hidden"). Words of layout, not of what the box holds: the class rules read the
# names without them (Elementor's named kinds, "elementor-widget-nav-menu", "elementor-widget-social-icons", stay).
BUILDER_LAYOUT = re.compile(r"(?<!\S)(?:elementor-widget(?:-container|-wrap|-heading|-text-editor|-image|-button|-html|"
                            r"-theme-post-content|-theme-post-title|__width-\S+)?|field--label-\S+)(?!\S)")


@functools.lru_cache(maxsize=16384)
def _layout_free(names: str) -> str:
    return BUILDER_LAYOUT.sub("", names) if "elementor-widget" in names or "field--label" in names else names


def _names(el) -> tuple[str, str]:
    """An element's class (without a page builder's layout words) and id, as the class rules read them."""
    return _layout_free(el.get("class") or ""), el.get("id") or ""


def _weight(el) -> int:
    """readability's class weight: class and id words that say article (+25) or not (-25)."""
    w = 0
    for name in _names(el):
        if name:
            if _has(NEGATIVE, name):
                w -= 25
            if _has(POSITIVE, name):
                w += 25
    return w


def main_content(body):
    """The element (a new <div> holding the picked elements when siblings join it) that is the page's main content:
    boilerplate dropped, paragraphs scored into their boxes as readability does, the best box widened by the page's
    own hints (boxes of equal standing, an element named as the article, the page's main element), then its
    siblings that belong with it."""
    _drop_boilerplate(body)
    hinted = [el for el in body.xpath("//*[@itemprop='articleBody' or @class or @id]")
              if el.get("itemprop") == "articleBody" or _named(ARTICLE_HINT, _names(el))]
    scores = _paragraph_scores(body)
    if not scores:
        return body
    best, best_score, densities = _best_scored(scores)
    best = _common_box_of_near(best, best_score, scores)
    best = _named_article(best, best_score, hinted, scores)
    best = _page_main(best)
    lead = _lead_before(best)
    content = _with_siblings(best, best_score, scores, densities)
    if lead is not None and content not in lead.iterancestors():
        # A story's lead (standfirst, intro, chapô) often sits in the article's header, outside the box of its
        # paragraphs; it is the story's first words.
        lead.tail = None
        content.insert(0, lead)
    return content


def _lead_before(best):
    """The element before the pick that the page names as the story's lead ("intro", "lead", "abstract", "chapo",
    "standfirst"...), half a paragraph's worth of words with few links, looked for among what precedes the pick and its
    nearest LEAD_LEVELS boxes; or None."""
    el = best
    for _ in range(LEAD_LEVELS):
        for sib in el.itersiblings(preceding=True):
            for cand in sib.iter():
                if not isinstance(cand.tag, str) or not (cand.get("class") or cand.get("id")):
                    continue
                if _named(LEAD, _names(cand)) and LEAD_CHARS // 2 <= len(normal(cand.text_content())) <= 1500 \
                        and _link_density(cand) < PROSE_LINKS:
                    return cand
        el = el.getparent()
        if el is None or el.tag in ("body", "html"):
            break
    return None


def _drop_boilerplate(body) -> None:
    """What the page marks as boilerplate, out of the tree."""
    # What the page marks as boilerplate goes first: readability's unlikely candidates, by class and id, and the
    # elements and roles that are navigation; but never one holding most of the page's text, which is a wrapper
    # whose class happens to say "header-style" or "sidebar-enabled" (readability retries without the rule instead).
    most = 0.4 * len(body.text_content())
    linked = _linked_chars(body)
    # Not inside code: a highlighter's <span class="hljs-comment"> is the code's own text.
    for el in body.xpath("//*[(@class or @id or @role) and not(ancestor::pre or ancestor::code)]"):
        if el.tag in ("body", "html", "a", "article", "main", "blockquote") or el.getparent() is None:
            continue  # a blockquote is quoted text even when its class says twitter (an embedded tweet)
        names = _names(el)
        if el.get("role") in NOT_CONTENT_ROLES or _named(BOILERPLATE, names) or (
                _named(TEASER, names) and el.find(".//a") is not None):
            pass
        elif not _named(UNLIKELY, names) or _named(MAYBE, names) or el.tag == "section" or (
                len(el) and el[0].tag in HEADINGS):
            continue  # a document's section named for its subject (Sphinx's id="menus", id="comments") is content
        text = el.text_content()
        if len(text) < most and (_named(COMMENTS, names) or not _prose(el, text, linked)):
            _drop_counted(el, linked)
    for el in body.xpath(NOT_CONTENT + "|" + CAPTIONS):
        text = el.text_content()
        if len(text) < most and not _wraps_content(el, text, linked):
            _drop_counted(el, linked)


# What a page marks as its article: microdata's body or an Article item, or the <article> element.
ARTICLE_MARK = (".//article|.//*[@itemprop='articleBody' or contains(@itemtype,'Article') or "
                "contains(@itemtype,'BlogPosting')]")


def _wraps_content(el, text: str, linked: dict) -> bool:
    """Whether a <nav>, <header> or <aside> holds the page's content rather than navigation. An unclosed one runs on
    over the article (libxml2 closes it only at the body's end), or a theme puts the article in one: with prose in
    it, or an article the page marks as such holding prose, it is the content's container. An article's own <header>
    holds its headline and its lead paragraph, which are the article's first words."""
    if el.tag not in ("nav", "header", "aside"):
        return False
    if el.tag != "aside" and _prose(el, text, linked):
        return True
    if el.tag == "header" and _has_lead(el, linked):
        return True
    return any(_prose(a, a.text_content(), linked) for a in el.xpath(ARTICLE_MARK))


def _paragraph_scores(body) -> dict:
    """Each box's score from the paragraphs in it (and half of its children boxes' paragraphs), readability's way."""
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
    return scores


def _best_scored(scores: dict):
    """(the best box, its score, each box's link density), scores turned final: discounted by link density."""
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
    return best, best_score, densities


def _common_box_of_near(best, best_score: float, scores: dict):
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
    return best


def _named_article(best, best_score: float, hinted: list, scores: dict):
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
    return best


def _page_main(best):
    # The page's own main element, when the pick lies inside it and it is prose, not a list of links: documentation
    # generators mark it reliably (Sphinx's role="main", rustdoc's #main-content, <main>).
    for anc in best.iterancestors():
        if anc.tag == "main" or anc.get("role") == "main" or anc.get("id") == "main-content":
            if _link_density(anc) < 0.25 and len(best.text_content()) < 0.5 * len(anc.text_content()):
                best = anc
            break
    return best


def _with_siblings(best, best_score: float, scores: dict, densities: dict):
    """The pick, or a <div> of it and the siblings that belong with it."""
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
            text = normal(sib.text_content())
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


def _drop_link_paragraphs(content, linked: dict) -> None:
    """A short paragraph that is mostly a link ("Read more: <a>another story</a>", "Back to the list") points
    elsewhere: it is not the article's text."""
    for p in list(content.iter("p")):
        text = p.text_content()
        if 0 < len(text.strip()) < LINK_PARAGRAPH_CHARS and linked.get(p, 0) >= LINK_PARAGRAPH_SHARE * len(text):
            _drop_counted(p, linked)


def _clean(content, scores: dict):
    """readability's conditional clean: lists, tables and boxes inside the content that look like navigation,
    forms or image strips go, unless they carry prose (ten commas or more)."""
    linked = _linked_chars(content)
    groups: dict = {}
    _drop_link_paragraphs(content, linked)
    for el in reversed(list(content.iter("table", "ul", "ol", "div", "section", "figure", "dl"))):
        if el is content or el.getparent() is None:
            continue
        text = el.text_content()
        length = len(text.strip())
        density = linked.get(el, 0) / len(text) if text else 0.0
        if length >= PROSE_CHARS and density < PROSE_LINKS:
            continue  # prose, whatever its class says, in a script that uses few commas or in boxes without <p>
        weight = _weight(el)
        if weight + scores.get(el, 0) < 0:
            _drop_counted(el, linked)
            continue
        if text.count(",") >= 10:
            continue
        if el.tag in ("table", "dl") and len(text.strip()) >= 25:
            continue  # data: a table's cells and a definition list are rarely prose with commas
        if el.find(".//pre") is not None or el.find(".//code") is not None:
            continue  # code is what a coding agent reads a page for
        if _card(el, length, linked.get(el, 0), groups):
            continue
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
            _drop_counted(el, linked)
    return content


