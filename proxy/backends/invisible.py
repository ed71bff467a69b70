"""What a person never sees on a page, taken out before the model reads it, pure: invisible code points (Unicode tag
characters, bidi controls, zero-width carriers and the other default-ignorable code points) in text, and elements a
browser hides, in an lxml tree. Used by proxy/backends/fetcher.py and extract.py; tested by tests/test_invisible.py.

Hidden instructions are the cheapest prompt injection: a reviewer reading the page sees nothing, the model reads
everything. Both passes count what they drop, so the page's head line can tell the user the page tried something.
"""
from __future__ import annotations

import re
import unicodedata

# Default_Ignorable_Code_Point (Unicode 15.1 DerivedCoreProperties.txt), the C0 and C1 controls other than tab and
# the line ends, and U+E0000-E0FFF whole (the tag characters and the unassigned rest of the block).
_IGNORABLE = (
    "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    "\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
# A run of them, or a flag's tag sequence (kept whole when it is one of the three flags Unicode recommends).
_INVISIBLE = re.compile(f"\U0001f3f4[\U000e0020-\U000e007e]{{1,7}}\U000e007f|[{_IGNORABLE}]+")
KEPT_FLAGS = frozenset("\U0001f3f4" + "".join(chr(0xE0000 + ord(c)) for c in name) + "\U000e007f"
                       for name in ("gbeng", "gbsct", "gbwls"))
ZWNJ, ZWJ, VS15, VS16 = "\u200c", "\u200d", "\ufe0e", "\ufe0f"


def _emoji(c: str) -> bool:
    """A code point that takes part in emoji sequences (pictographs, skin tones, symbols, regional indicators)."""
    o = ord(c)
    return (0x1F000 <= o <= 0x1FAFF or 0x2600 <= o <= 0x27BF or 0x2300 <= o <= 0x23FF or 0x2B00 <= o <= 0x2BFF
            or o in (0x00A9, 0x00AE, 0x203C, 0x2049, 0x2122, 0x2139, 0x3030, 0x303D, 0x20E3))


def _needs_joiner(before: str, after: str) -> bool:
    """ZWNJ and ZWJ change how Persian, Arabic and the Indic scripts are written: between two letters of a script
    other than Latin they are spelling, not a carrier (one per gap at most, so they carry almost nothing)."""
    return all(unicodedata.category(c)[0] in "LM" and ord(c) >= 0x0370 for c in (before, after))  # a virama is a mark


def strip_invisible(text: str) -> tuple[str, int]:
    """(text without invisible code points, how many were removed). Pure.

    Kept: one ZWJ between two emoji (👩‍💻), one ZWJ or ZWNJ between two letters of a non-Latin script (Persian
    می‌خواهم, Devanagari), one VS15/VS16 after a symbol or emoji (❤️), and the England, Scotland and Wales flags.
    Everything else of the list above goes, including soft hyphens, CJK ideographic variation selectors and
    Mongolian free variation selectors (a reader sees no difference; README, Security)."""
    removed = 0

    def one(m: re.Match) -> str:
        nonlocal removed
        run = m.group(0)
        if run in KEPT_FLAGS:
            return run
        start, end = m.span()
        before = text[start - 1] if start else ""
        after = text[end] if end < len(text) else ""
        keep = run[0] if run[0] == "\U0001f3f4" else ""  # the black flag itself is visible
        if run in (ZWJ, ZWNJ) and before and after and (_needs_joiner(before, after)
                                                        or (run == ZWJ and _emoji(before) and _emoji(after))):
            keep = run
        elif run in (VS15, VS16) and before and (_emoji(before) or not before.isascii()) and not before.isalpha():
            keep = run
        elif run in (VS16 + ZWJ, VS15 + ZWJ) and _emoji(before) and after and _emoji(after):
            keep = run  # ❤️‍🔥: a presentation selector, then the joiner
        removed += len(run) - len(keep)
        return keep

    out = _INVISIBLE.sub(one, text)
    return out, removed


# -- elements a browser does not show ------------------------------------------------------------------------------

# Inline styles that hide an element: display:none, visibility:hidden/collapse, zero-size text, zero opacity, and
# positions far off the screen (a negative offset of three digits or more) or clipped away.
_HIDDEN_STYLE = re.compile(
    r"(?:^|;)\s*(?:"
    r"display\s*:\s*none|visibility\s*:\s*(?:hidden|collapse)|opacity\s*:\s*0*(?:\.0+)?\s*(?:;|$|!)"
    r"|font-size\s*:\s*0*(?:\.0+)?(?:px|pt|em|rem|%)?\s*(?:;|$|!)"
    r"|(?:left|top|right|bottom|text-indent|margin-left|margin-top)\s*:\s*-\s*\d{3,}"
    r"|clip\s*:\s*rect\(\s*0(?:px)?[\s,]+0(?:px)?[\s,]+0(?:px)?[\s,]+0(?:px)?\s*\)"
    r"|clip-path\s*:\s*inset\(\s*(?:50|100)%"
    r")", re.IGNORECASE)
# aria-hidden hides decorative icons from screen readers all the time; it is dropped only on elements that hold
# text a reader would otherwise read as the page's content.
_TEXT_BLOCKS = frozenset("p div span section article aside blockquote pre code li ul ol table td th tr h1 h2 h3 h4 "
                         "h5 h6 a em strong small label font".split())


def hidden(el) -> bool:
    """True for an element a browser hides: the `hidden` attribute, an inline style that hides it, or
    aria-hidden="true" on a text block."""
    if el.get("hidden") is not None:
        return True
    style = el.get("style")
    if style and _HIDDEN_STYLE.search(style.replace("\n", " ")):
        return True
    return el.get("aria-hidden", "").strip().lower() == "true" and str(el.tag).lower() in _TEXT_BLOCKS


def drop_hidden(root) -> int:
    """Remove the hidden elements under an lxml tree `root` (not looking inside one already found); how many. The
    text after a dropped element (its tail) stays: it is visible."""
    found, stack = [], list(root)
    while stack:
        el = stack.pop()
        if not isinstance(el.tag, str):  # comments and processing instructions
            continue
        if hidden(el):
            found.append(el)
        else:
            stack.extend(el)
    for el in found:
        el.drop_tree()  # keeps the tail, unlike remove()
    return len(found)


# Every rule above needs one of these words, or a negative offset, in the page, so a page with none of them is not
# parsed for nothing. Substring tests on the lower-cased page, not one regex: 8 ms for 2 MiB instead of 95.
_HIDDEN_WORDS = ("hidden", "display", "font-size", "opacity", "clip")
_NEGATIVE_OFFSET = re.compile(r":\s*-\s*\d{3}")


def _maybe_hidden(html: str) -> bool:
    low = html.lower()
    return any(w in low for w in _HIDDEN_WORDS) or _NEGATIVE_OFFSET.search(low) is not None


def visible_html(html: str) -> tuple[str, int]:
    """(the page without its hidden elements, how many were dropped): the pre-pass extract.py's child runs before
    extraction, so no path of the extractor writes them (it drops the `hidden` attribute and display:none itself,
    not zero-size, transparent or off-screen text) and the page's head line can count them. The page comes back
    unchanged, not re-serialised, when nothing is hidden or it does not parse."""
    import lxml.etree
    import lxml.html
    if not html.strip() or not _maybe_hidden(html):
        return html, 0  # most pages: a scan of a few ms instead of a parse of a tenth of a second a MB
    try:
        root = lxml.html.document_fromstring(html)
    except (ValueError, lxml.etree.ParserError):
        return html, 0
    dropped = drop_hidden(root)
    return (lxml.html.tostring(root, encoding="unicode") if dropped else html), dropped
