"""Which parts of a Qwen3 answer are tool calls, which are text, and where a call was cut by the token limit.

The model writes calls as `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`.
vLLM's own qwen3_coder grammar takes every `<tool_call>` or `<function=` as the start of a call, so a sentence about
the markup, a fenced example or a call cut by max_tokens all come out as calls. This module decides with the whole
text in view (or, streaming, the text so far), and is shared by the vLLM plugin (qwen3_stack_parser.py) and its
tests. Pure: no vLLM import.

A call is a call only when it is complete (`</function>` written), its name is an offered tool, it stands outside a
fenced code block and is not quoted inline (a backtick right before it), and only whitespace separates the opener,
the function and its parameters. An opener the text ends inside is a cut. Anything else is text, kept whole.

A value the schema says is not a string, which vLLM's own conversion would still deliver as a string, is read here
only where one reading exists (read_literal): a Python literal (`['a', 'b']`, `True`, `None`) or a scalar in JSON
quotes (`"5"`). Anything else stays as written.
"""
from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
FUNC_OPEN = "<function="
FUNC_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
OPENERS = (TOOL_OPEN, FUNC_OPEN)
# Streaming holds back at most this many characters of ordinary text: the longest opener, while the text so far
# could still become one. Once an opener is complete, what follows is held until it is a call or text.
HOLD_BOUND = max(len(o) for o in OPENERS)
# A function or parameter name longer than this, or holding a newline or '<', is prose, not markup.
NAME_MAX = 128
_NAME = re.compile(r"[^<>\n]{1,%d}>" % NAME_MAX)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.M)
_WS = re.compile(r"\s*")
# A value longer than this is not read as a literal: ast's parser is linear but not cheap, and arrays an agent writes
# by hand are short.
LITERAL_MAX = 100_000


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Call:
    """One complete call: its name, its parameters as (name, raw value) in order, and whether the model's markup
    needed mending (a parameter closed only by the next one, stray text between parameters)."""
    name: str
    params: tuple[tuple[str, str], ...]
    repaired: bool = False

    def markup(self) -> str:
        """The call in the canonical form vLLM's qwen3_coder parser reads exactly (values as written)."""
        body = "".join(f"<parameter={p}>{v}</parameter>\n" for p, v in self.params)
        return f"{TOOL_OPEN}\n<function={self.name}>\n{body}</function>\n{TOOL_CLOSE}"


@dataclass(frozen=True)
class Cut:
    """The text ends inside a call (or an opener): the token limit (or a stop) came first."""
    raw: str


Piece = Text | Call | Cut


@dataclass
class ScanState:
    """What a streaming scan carries between deltas: the fence it is in and how far fences were counted."""
    fence: str = ""
    fence_pos: int = 0
    awkward: bool = False  # anything decided differently from a plain run of well-formed calls
    pieces: list[Piece] = field(default_factory=list)


class _Pending(Exception):
    """The text so far ends before the markup at hand is decided."""


class _NotMarkup(Exception):
    """The opener at hand is prose (or a call to a tool nobody offered): it stays text."""


def _in_fence(text: str, k: int, st: ScanState) -> bool:
    line_start = text.rfind("\n", 0, k) + 1
    for m in _FENCE.finditer(text, st.fence_pos, line_start):
        ch = m.group(1)[0]
        st.fence = "" if st.fence == ch else (st.fence or ch)
    st.fence_pos = max(st.fence_pos, line_start)
    m = _FENCE.match(text, line_start)
    return bool(st.fence) or bool(m and m.end() <= k)


def _expect(text: str, i: int, token: str) -> bool:
    """True when `token` starts at i; _Pending when the text ends inside it; False otherwise."""
    rest = text[i:i + len(token)]
    if rest == token:
        return True
    if token.startswith(rest):
        raise _Pending
    return False


def _skip_ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


def _name(text: str, i: int) -> tuple[str, int]:
    m = _NAME.match(text, i)
    if m:
        return m.group(0)[:-1].strip(), m.end()
    rest = text[i:]
    if len(rest) <= NAME_MAX and not re.search(r"[<>\n]", rest):
        raise _Pending
    raise _NotMarkup


def _value(text: str, i: int) -> tuple[str, int, bool]:
    """A parameter's raw value from i: (value, index after it and its closer, closed explicitly)."""
    ends = [(text.find(t, i), t) for t in (PARAM_CLOSE, PARAM_OPEN, FUNC_CLOSE)]
    found = [(pos, t) for pos, t in ends if pos >= 0]
    if not found:
        raise _Pending
    pos, token = min(found)
    if token == PARAM_CLOSE:
        return text[i:pos], pos + len(PARAM_CLOSE), True
    return text[i:pos], pos, False


def _function(text: str, i: int, names: frozenset[str] | None) -> tuple[Call, int]:
    """One `<function=NAME>...</function>` from i (just after `<function=`)."""
    name, i = _name(text, i)
    if names is not None and name not in names:
        raise _NotMarkup
    params: list[tuple[str, str]] = []
    repaired = False
    j = _skip_ws(text, i)
    if not (_expect(text, j, PARAM_OPEN) or _expect(text, j, FUNC_CLOSE)):
        raise _NotMarkup  # prose such as "<function=Bash> runs a command"
    while True:
        j = _skip_ws(text, i)
        if _expect(text, j, FUNC_CLOSE):
            return Call(name, tuple(params), repaired), j + len(FUNC_CLOSE)
        if _expect(text, j, PARAM_OPEN):
            pname, k = _name(text, j + len(PARAM_OPEN))
            value, i, closed = _value(text, k)
            params.append((pname, value))
            repaired = repaired or not closed
            continue
        # Stray text between parameters: skipped up to the next parameter or the end of the function.
        nxt = [p for p in (text.find(PARAM_OPEN, j), text.find(FUNC_CLOSE, j)) if p >= 0]
        if not nxt:
            raise _Pending
        i, repaired = min(nxt), True


def _block(text: str, k: int, names: frozenset[str] | None, final: bool) -> tuple[list[Call], int]:
    """The calls of the markup opening at k and the index after it."""
    wrapped = text.startswith(TOOL_OPEN, k)
    i = k + len(TOOL_OPEN) if wrapped else k
    calls: list[Call] = []
    while True:
        j = _skip_ws(text, i) if wrapped or calls else i
        if not _expect(text, j, FUNC_OPEN):
            if not calls:
                raise _NotMarkup  # "<tool_call>" named in a sentence
            return calls, _after_calls(text, i, final)
        call, i = _function(text, j + len(FUNC_OPEN), names)
        calls.append(call)
        j = _skip_ws(text, i)
        if j == len(text) and not final:
            raise _Pending  # a closing </tool_call> or the next call may follow
        if not text.startswith(FUNC_OPEN, j):
            return calls, _after_calls(text, i, final)


def _after_calls(text: str, i: int, final: bool) -> int:
    j = _skip_ws(text, i)
    try:
        if _expect(text, j, TOOL_CLOSE):
            return j + len(TOOL_CLOSE)
    except _Pending:
        if not final:
            raise
    return i


def _candidates(text: str, i: int):
    while (k := text.find("<", i)) >= 0:
        yield k
        i = k + 1


def _opener_at(text: str, k: int) -> str:
    """"open" for a complete opener at k, "prefix" when the text ends inside one, "" for any other '<'."""
    rest = text[k:k + HOLD_BOUND]
    if any(rest.startswith(o) for o in OPENERS):
        return "open"
    if any(o.startswith(rest) for o in OPENERS):
        return "prefix"
    return ""


def scan(text: str, pos: int, st: ScanState, names: frozenset[str] | None, final: bool) -> int:
    """Decides text[pos:] as far as it can, appending the pieces to st.pieces; returns the index decided up to.

    `final`: the text is whole (non-streaming, or the stream's end), so what is still open is a cut."""
    for k in _candidates(text, pos):
        if k < pos:
            continue
        kind = _opener_at(text, k)
        if not kind or (k and text[k - 1] == "`") or _in_fence(text, k, st):
            if kind:
                st.awkward = True
            continue
        try:
            if kind == "prefix":
                raise _Pending
            calls, end = _block(text, k, names, final)
        except _NotMarkup:
            st.awkward = True
            continue
        except _Pending:
            if final:
                _emit_text(st, text[pos:k])
                st.pieces.append(Cut(text[k:]))
                st.awkward = True
                return len(text)
            _emit_text(st, text[pos:k])
            return k
        _emit_text(st, text[pos:k])
        st.pieces.extend(calls)
        st.awkward = st.awkward or any(c.repaired for c in calls)
        pos = st.fence_pos = end
    _emit_text(st, text[pos:])
    return len(text)


def _emit_text(st: ScanState, text: str) -> None:
    if text:
        st.pieces.append(Text(text))


def split(text: str, names: frozenset[str] | None) -> tuple[list[Piece], bool]:
    """The whole answer's pieces, and whether anything in it was awkward (a plain answer is left to vLLM)."""
    st = ScanState()
    scan(text, 0, st, names, final=True)
    return st.pieces, st.awkward


_KINDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (type(None), "null"), (list, "array"),
          (dict, "object"))


def _kind(value: object) -> str:
    """The JSON Schema type of a value ast read: "" for what JSON cannot hold (tuples, sets, bytes, complex)."""
    for cls, name in _KINDS:
        if type(value) is cls:  # exact: a bool is no integer here, a tuple no array
            return name
    return ""


def _json_safe(value: object) -> bool:
    kind = _kind(value)
    if kind == "array":
        return all(_json_safe(v) for v in value)  # type: ignore[attr-defined]
    if kind == "object":
        return all(isinstance(k, str) and _json_safe(v) for k, v in value.items())  # type: ignore[attr-defined]
    if kind == "number":
        return math.isfinite(value)  # type: ignore[arg-type]
    return bool(kind) or isinstance(value, str)


def read_literal(value: str, types: frozenset[str]) -> str | None:
    """The JSON text of `value` read as a Python literal, or as the scalar one pair of JSON quotes holds, when that
    reading is a value of one of the schema's `types` (JSON Schema names); None when it is not (ambiguous, not a
    literal, or a string the schema would take): the value then stays as written.

    Only for a value vLLM's own conversion left a string where the schema wants no string."""
    if "string" in types or len(value) > LITERAL_MAX:
        return None
    quoted = _read(value.strip(), json.loads)
    text = quoted.strip() if isinstance(quoted, str) else value.strip()
    read = _read(text, json.loads)
    if read is _UNREAD:
        read = _read(text, ast.literal_eval)
    kinds = {_kind(read)} | ({"number"} if _kind(read) == "integer" else set())
    if read is _UNREAD or not (kinds & types) or not _json_safe(read):
        return None
    return json.dumps(read, ensure_ascii=False)


_UNREAD = object()


def _read(text: str, reader) -> object:
    """What `reader` (json.loads or ast.literal_eval, which runs nothing) makes of the text, or _UNREAD."""
    try:
        return reader(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNREAD
