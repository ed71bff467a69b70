"""The Markdown the model reads, written from an lxml element by a writer of our own: headings, lists, fenced code
with the language the page names, pipe tables, quotes, links as short numbered references with the URLs once at the
end, stopping at a budget. Pure; used by proxy/backends/pages/readable.py, tested by tests/test_extract.py.
"""
from __future__ import annotations

import re
import urllib.parse

# Elements that start a block of their own: a paragraph's text never runs across one.
BLOCKS = frozenset({"address", "article", "aside", "blockquote", "center", "dd", "details", "dialog", "dir", "div",
                    "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5",
                    "h6", "header", "hgroup", "hr", "li", "main", "menu", "nav", "ol", "p", "pre", "section",
                    "summary", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul", "caption", "br"})


def normal(text: str) -> str:
    """White space squeezed to single spaces."""
    return " ".join(text.split())


def tidy(text: str) -> str:
    """Trailing spaces off every line, at most one blank line in a row."""
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


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
# rt and rp: a ruby annotation (the reading of Japanese kanji in kana, shown above the line) written inline splits
# every annotated word in two ("子こども"); the base text is the sentence.
SKIP = frozenset({"img", "picture", "video", "audio", "source", "track", "map", "area", "head", "title", "meta",
                  "link", "base", "rt", "rp"})


class MarkdownWriter:
    """Writes an lxml element's content as Markdown: ATX headings, "-" and "1." lists, fenced code with the language
    the page names, pipe tables, quotes; links as [text][n] with one list of URLs at the end. Stops at `limit`
    characters (then `cut` is true). Repeated paragraphs stay (deduplicating them cost the benchmark 0.002 F1: its
    bodies repeat text too); captions, which galleries repeat, were dropped with the boilerplate."""

    def __init__(self, base_url: str, limit: int | None = None, links: str = "refs", title: str | None = None):
        self.base = base_url
        self.limit = limit
        self.links_mode = links
        self.title = normal(title or "").lower()
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
        text = normal(text) if BREAK not in text else "\n".join(
            line for line in (normal(x) for x in text.split(BREAK)) if line)
        if text:
            self.emit(text)

    def block(self, el) -> None:
        tag = el.tag
        if tag in HEADINGS:
            text = normal(self.inline_children(el))
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
            self.emit("**" + normal(self.inline_children(el)) + "**" if normal(el.text_content()) else "")
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
        if caption is not None and normal(caption.text_content()):
            self.emit(normal(self.inline_children(caption)))
        lines = []
        used = self.size
        for i, r in enumerate(cells):
            texts = []
            for c in r:
                texts.append(normal(self.inline_children(c)).replace("|", "\\|"))
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
        label = normal(text)
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




