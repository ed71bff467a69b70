"""What a person never sees on a page, taken out before the model reads it, pure: invisible code points (Unicode tag
characters, bidi controls, zero-width carriers and the other default-ignorable code points) in text, and elements a
browser hides, in an lxml tree. Used by proxy/backends/pages/fetcher.py and extract.py; tested by tests/test_invisible.py.

Hidden instructions are the cheapest prompt injection: a reviewer reading the page sees nothing, the model reads
everything. Both passes count what they drop, so the page's head line can tell the user the page tried something.
"""
from __future__ import annotations

import functools
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
    Mongolian free variation selectors (a reader sees no difference; docs/web-tools.md, Security)."""
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

# -- inline styles that hide an element, read with a CSS tokenizer (issue 39) ---------------------------------------
# tinycss2 decodes what a string match misses: escapes (`\6e one`), comments (`display:/**/none`), numbers in any
# spelling (`-9e3px`, `.0`) and units (`0vw`, `0%`). Each rule below says when a declaration's value hides the text.

_FAR = {"px": 500.0, "pt": 375.0, "pc": 31.0, "cm": 13.0, "mm": 130.0, "in": 5.2, "q": 520.0,
        "em": 31.0, "rem": 31.0, "ex": 62.0, "ch": 62.0, "vw": 50.0, "vh": 50.0, "vmin": 50.0, "vmax": 50.0,
        "%": 50.0, "svw": 50.0, "svh": 50.0, "lvw": 50.0, "lvh": 50.0, "dvw": 50.0, "dvh": 50.0}
_TINY_FONT = {"px": 2.0, "pt": 1.5, "em": 0.125, "rem": 0.125, "ex": 0.25, "ch": 0.25, "%": 12.5, "vw": 0.1,
              "vh": 0.1, "vmin": 0.1, "vmax": 0.1, "mm": 0.5, "cm": 0.05, "q": 2.0, "in": 0.02}
_FAINT = 0.05  # an opacity at or under which text cannot be read


def _values(tokens) -> list:
    return [t for t in tokens if t.type not in ("whitespace", "comment") and not (t.type == "literal" and t.value == ",")]


def _number(token) -> tuple[float, str] | None:
    """(value, unit) of a number, percentage or dimension token; unit "" for a plain number."""
    if token.type == "number":
        return float(token.value), ""
    if token.type == "percentage":
        return float(token.value), "%"
    if token.type == "dimension":
        return float(token.value), token.lower_unit
    return None


def _ident(tokens) -> str:
    values = _values(tokens)
    return values[0].lower_value if len(values) == 1 and values[0].type == "ident" else ""


def _far_off(token) -> bool:
    """A negative offset that puts an element off any screen: -500px, -31em, -50vw or more."""
    n = _number(token)
    return n is not None and n[0] < 0 and n[1] in _FAR and -n[0] >= _FAR[n[1]]


def _alpha(token) -> float | None:
    """An opacity value, 0 to 1 (a percentage divided by 100)."""
    n = _number(token)
    return None if n is None else (n[0] / 100 if n[1] == "%" else n[0] if n[1] == "" else None)


def _faint(tokens) -> bool:
    values = _values(tokens)
    return len(values) == 1 and (a := _alpha(values[0])) is not None and a <= _FAINT


def _tiny_font(tokens) -> bool:
    values = _values(tokens)
    n = _number(values[0]) if len(values) == 1 else None
    return n is not None and (n[0] <= 0 or (n[1] in _TINY_FONT and n[0] < _TINY_FONT[n[1]]))


def _functions(tokens) -> list:
    return [t for t in _values(tokens) if t.type == "function"]


def _transform_hides(tokens) -> bool:
    """translate*() off the screen, or scale*() to nothing, in a transform list."""
    for f in _functions(tokens):
        args = [_number(a) for a in _values(f.arguments)]
        if f.lower_name.startswith("translate") and any(_far_off(a) for a in _values(f.arguments)):
            return True
        if f.lower_name.startswith("scale") and any(a is not None and a[0] == 0 for a in args):
            return True
        if f.lower_name == "matrix" and len(args) == 6 and all(a is not None for a in args) and \
                args[0][0] * args[3][0] - args[1][0] * args[2][0] == 0:  # type: ignore[index]
            return True  # a degenerate matrix draws nothing
    return False


def _filter_hides(tokens) -> bool:
    return any(f.lower_name == "opacity" and _faint(f.arguments) for f in _functions(tokens))


def _clip_hides(tokens) -> bool:
    """clip: rect() of no area (top >= bottom or left >= right: rect(0 0 0 0), the rect(1px,1px,1px,1px) idiom)."""
    for f in _functions(tokens):
        if f.lower_name == "rect":
            box = [_number(a) for a in _values(f.arguments)]
            if len(box) == 4 and all(b is not None for b in box):
                top, right, bottom, left = (b[0] for b in box)  # type: ignore[index]
                return bottom <= top or right <= left
    return False


def _clip_path_hides(tokens) -> bool:
    """clip-path: circle(0), ellipse(0 0), inset(50%) or more, a polygon of one point."""
    for f in _functions(tokens):
        args = [_number(a) for a in _values(f.arguments) if a.type != "ident"]
        if f.lower_name in ("circle", "ellipse") and args and all(a is not None and a[0] == 0 for a in args[:2]):
            return True
        if f.lower_name == "inset" and args and args[0] is not None and args[0][1] == "%" and args[0][0] >= 50:
            return True
        if f.lower_name == "polygon" and args and all(a is not None and a[0] == 0 for a in args):
            return True
    return False


def _transparent(tokens) -> bool:
    """A text colour of no alpha: transparent, rgba()/hsla() with alpha 0, #rrggbb00 or #rgb0."""
    values = _values(tokens)
    if len(values) != 1:
        return False
    v = values[0]
    if v.type == "ident":
        return v.lower_value == "transparent"
    if v.type == "hash":
        return len(v.value) in (4, 8) and v.value[-(len(v.value) // 4):].strip("0") == ""
    if v.type == "function" and v.lower_name in ("rgb", "rgba", "hsl", "hsla", "hwb", "lab", "lch", "oklab", "oklch"):
        args = [a for a in _values(v.arguments) if not (a.type == "literal" and a.value == "/")]
        return len(args) == 4 and (a := _alpha(args[3])) is not None and a <= _FAINT
    return False


# A far negative margin on the right or the bottom moves what follows, not the element's own text (the sticky-footer
# idiom, `margin-bottom: -554px` on a page's wrapper), so only the left and top margins count.
_POSITION = ("left", "top", "right", "bottom", "margin-left", "margin-top", "text-indent", "inset",
             "inset-inline-start", "inset-block-start")
_RULES = {
    "display": lambda t: _ident(t) == "none",
    "visibility": lambda t: _ident(t) in ("hidden", "collapse"),
    "content-visibility": lambda t: _ident(t) == "hidden",
    "opacity": _faint,
    "filter": _filter_hides,
    "font-size": _tiny_font,
    "transform": _transform_hides,
    "translate": lambda t: any(_far_off(v) for v in _values(t)),
    "scale": lambda t: any((n := _number(v)) is not None and n[0] == 0 for v in _values(t)),
    "clip": _clip_hides,
    "clip-path": _clip_path_hides,
    **{name: (lambda t: any(_far_off(v) for v in _values(t)[:1])) for name in _POSITION},
}
_COLOUR = ("color", "-webkit-text-fill-color")
_PAINTED_TEXT = ("background-clip", "-webkit-background-clip")  # gradient text: a transparent fill is painted over


def declarations(style: str) -> dict[str, list]:
    """An inline style's declarations, name to value tokens, as the cascade settles them within one attribute (a
    later declaration wins, unless an earlier one is !important). Pure."""
    import tinycss2
    out: dict[str, list] = {}
    important: set[str] = set()
    for d in tinycss2.parse_blocks_contents(style, skip_comments=True, skip_whitespace=True):
        if d.type != "declaration" or (d.lower_name in important and not d.important):
            continue
        out[d.lower_name] = d.value
        if d.important:
            important.add(d.lower_name)
    return out


# The properties a fade-in animation starts from (Webflow's interactions, AOS, `page-wrapper` themes write the start
# state inline and a script reveals it): an element hidden by these alone may be a reveal, judged in drop_hidden.
_ANIMATED = frozenset(("opacity", "transform", "translate", "scale"))


@functools.lru_cache(maxsize=4096)
def hiding(style: str) -> str:
    """How an inline style hides its element's text from a person viewing the page: "" (it does not), "fade" (only
    by opacity or a transform, the start state of a reveal animation) or "hard" (any other way). Pure."""
    found = declarations(style)
    fired = {name for name, rule in _RULES.items() if name in found and rule(found[name])}
    if fired - _ANIMATED:
        return "hard"
    if not any(_ident(found.get(n, [])) == "text" for n in _PAINTED_TEXT) and \
            any(_transparent(found[n]) for n in _COLOUR if n in found):
        return "hard"
    zero = any((v := _values(found.get(n, []))) and (x := _number(v[0])) is not None and x[0] == 0
               for n in ("width", "height", "max-width", "max-height"))
    if zero and _ident(found.get("overflow", [])) in ("hidden", "clip"):
        return "hard"
    return "fade" if fired else ""


# aria-hidden hides decorative icons from screen readers all the time; it is dropped only on elements that hold
# text a reader would otherwise read as the page's content.
_TEXT_BLOCKS = frozenset("p div span section article aside blockquote pre code li ul ol table td th tr h1 h2 h3 h4 "
                         "h5 h6 a em strong small label font".split())


def _how_hidden(el) -> str:
    """"hard", "fade" (hidden only by an animation's start state, see hiding()) or "" for an element."""
    if el.get("hidden") is not None:
        return "hard"
    style = el.get("style")
    how = hiding(style) if style else ""
    if how == "hard" or (el.get("aria-hidden", "").strip().lower() == "true" and str(el.tag).lower() in _TEXT_BLOCKS):
        return "hard"
    return how


# A fade-in holding at least this share of the page's text is the page being revealed, not text kept from a person.
REVEAL_SHARE = 2 / 3
_NO_TEXT = frozenset(("head", "script", "style", "template"))


def _chars(text: str | None) -> int:
    return len("".join(text.split())) if text else 0


# The elements that can be hidden by the rules above; what is inside head, script, style and template is not text a
# person sees, so it is not looked at (nor counted).
_CANDIDATES = (".//*[(@hidden or @style or @aria-hidden) and "
               "not(ancestor::head or ancestor::script or ancestor::style or ancestor::template)]")


def drop_hidden(root) -> int:
    """Remove the hidden elements under an lxml tree `root` (the outermost of them); how many. The text after a
    dropped element (its tail) stays: it is visible.

    Elements hidden only by a fade-in's start state (opacity 0, a transform) are a reveal when together they hold at
    least REVEAL_SHARE of the page's text outside hard-hidden elements: a page does not hide most of itself from its
    readers, a script shows it. Then they stay (what they hide the hard way still goes); otherwise they go too. A
    hidden instruction dressed the same way (`data-w-id`, `data-aos`, opacity 0) inside a normal page is a small share
    and goes; to pass, the faded text must outweigh the visible page twice, which only the page's author can do, and
    an author hides text with a stylesheet anyway (not caught, README "Invisible text")."""
    # Only the elements with an attribute a rule reads are judged (one XPath in C, not a Python walk over the
    # whole tree); the page's text is counted only when something fades.
    hard: list = []
    fades: list = []
    for el in root.xpath(_CANDIDATES):
        how = _how_hidden(el)
        if how:
            (hard if how == "hard" else fades).append(el)
    if fades and _is_reveal(root):
        fades = []
    chosen = set(hard) | set(fades)
    found = [el for el in hard + fades if not any(a in chosen for a in el.iterancestors())]
    for el in found:
        el.drop_tree()  # keeps the tail, unlike remove()
    return len(found)


def _is_reveal(root) -> bool:
    """Whether the text inside fade-ins is at least REVEAL_SHARE of the page's text outside hard-hidden elements."""
    chars = {False: 0, True: 0}  # outside / inside a fade
    stack: list = [(el, False) for el in reversed(root)]
    while stack:
        el, in_fade = stack.pop()
        if not isinstance(el.tag, str):  # comments and processing instructions
            continue
        how = _how_hidden(el)
        if how == "hard":
            continue
        in_fade = in_fade or how == "fade"
        if str(el.tag).lower() in _NO_TEXT:
            continue
        chars[in_fade] += _chars(el.text)
        for child in el:
            chars[in_fade] += _chars(child.tail)
        stack.extend((child, in_fade) for child in reversed(el))
    return chars[True] >= REVEAL_SHARE * (chars[True] + chars[False])
