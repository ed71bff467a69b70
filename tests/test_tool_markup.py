"""vllm-plugin/qwen3_markup.py, the pure half of the stack's tool-call parser: which parts of an answer are calls,
text or a cut, whole and streamed a character at a time (docs/apis.md, "Tool calls the model writes")."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "vllm-plugin"))
import qwen3_markup as m  # noqa: E402

DATA = json.loads((REPO / "tests" / "data" / "qwen3-tool-markup.json").read_text())
NAMES = frozenset(DATA["tools"])
CALL = "<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"


def kinds(pieces):
    return [(type(p).__name__, p.text if isinstance(p, m.Text) else p.name if isinstance(p, m.Call) else p.raw)
            for p in pieces]


def streamed(text: str) -> list:
    """The pieces a stream gets when the text arrives one character at a time, then ends."""
    st, decided = m.ScanState(), 0
    for i in range(1, len(text) + 1):
        decided = m.scan(text[:i], decided, st, NAMES, final=False)
        assert i - decided <= max(m.HOLD_BOUND, _open_markup(text[:i], decided)), (text[:i], decided)
    m.scan(text, decided, st, NAMES, final=True)
    return _merge(st.pieces)


def _open_markup(text: str, decided: int) -> int:
    """How much an undecided opener holds: from a complete opener on, everything (it is a call or text yet)."""
    held = text[decided:]
    return len(held) if any(held.startswith(o) for o in m.OPENERS) else 0


def _merge(pieces):
    out = []
    for p in pieces:
        if out and isinstance(p, m.Text) and isinstance(out[-1], m.Text):
            out[-1] = m.Text(out[-1].text + p.text)
        else:
            out.append(p)
    return out


@pytest.mark.parametrize("text,expected", [
    (CALL, [("Call", "Bash")]),
    ("Sure.\n" + CALL, [("Text", "Sure.\n"), ("Call", "Bash")]),
    (CALL + "\n" + CALL, [("Call", "Bash"), ("Text", "\n"), ("Call", "Bash")]),
    ("<tool_call>\n<function=Bash>\n<parameter=command>\nls -la /very/lo",
     [("Cut", "<tool_call>\n<function=Bash>\n<parameter=command>\nls -la /very/lo")]),
    ("ok " + CALL + "\n<tool_call>\n<function=Ba", [("Text", "ok "), ("Call", "Bash"), ("Text", "\n"),
                                                     ("Cut", "<tool_call>\n<function=Ba")]),
    ("text then <tool_call>", [("Text", "text then "), ("Cut", "<tool_call>")]),
    ("text then <funct", [("Text", "text then "), ("Cut", "<funct")]),
    ("a <tool_call> tag in prose", [("Text", "a <tool_call> tag in prose")]),
    ("`<function=Bash>` in code", [("Text", "`<function=Bash>` in code")]),
    ("<function=Bash> runs it", [("Text", "<function=Bash> runs it")]),
    ("```\n" + CALL + "\n```\nafter", [("Text", "```\n" + CALL + "\n```\nafter")]),
    ("```\nx\n```\n" + CALL, [("Text", "```\nx\n```\n"), ("Call", "Bash")]),
    ("<function=Bash>\n<parameter=command>\nls\n</parameter>\n</function>", [("Call", "Bash")]),
    ("<tool_call>\n<function=Other>\n</function>\n</tool_call>",
     [("Text", "<tool_call>\n<function=Other>\n</function>\n</tool_call>")]),
    ("a < b and <div>", [("Text", "a < b and <div>")]),
])
def test_split(text, expected):
    pieces, _ = m.split(text, NAMES)
    assert kinds(_merge(pieces)) == expected
    assert kinds(streamed(text)) == expected


@pytest.mark.parametrize("text,params,repaired", [
    (CALL, (("command", "\nls\n"),), False),
    ("<tool_call>\n<function=Bash>\n<parameter=command>\nls\n<parameter=cwd>\n/tmp\n</parameter>\n</function>",
     (("command", "\nls\n"), ("cwd", "\n/tmp\n")), True),
    ("<tool_call>\n<function=Bash>\n<parameter=command>\nls\n</function>\n</tool_call>",
     (("command", "\nls\n"),), True),
    ("<tool_call>\n<function=Bash>\n<parameter=command>\na <b> c\n</parameter>\n</function>",
     (("command", "\na <b> c\n"),), False),
])
def test_parameters(text, params, repaired):
    (call,), awkward = m.split(text, NAMES)
    assert (call.params, call.repaired, awkward) == (params, repaired, repaired)


def test_plain_answers_are_not_awkward():
    """What vLLM's own qwen3_coder reads right is left to it, so its bytes are unchanged."""
    for text in (CALL, "Sure.\n" + CALL, "no markup at all", CALL + "\n" + CALL):
        assert m.split(text, NAMES)[1] is False, text


def test_canonical_markup_reads_back_the_same():
    call = m.Call("Bash", (("command", "\nls\n"), ("cwd", "/tmp")))
    assert m.split(call.markup(), NAMES)[0] == [call]


@pytest.mark.parametrize("case", DATA["cases"], ids=[c["name"] for c in DATA["cases"]])
def test_public_cases_whole_and_streamed_agree(case):
    text = case["text"]
    whole = _merge(m.split(text, NAMES)[0])
    assert kinds(streamed(text)) == kinds(whole)
    calls = [p.name for p in whole if isinstance(p, m.Call)]
    if "max_tokens" not in case:
        assert calls == [name for name, _ in case["calls"]]


def _reasoning(text: str) -> str:
    """The part of a whole output the reasoning parser hands over: between <think> and </think> (or the end)."""
    return text.removeprefix("<think>").split("</think>")[0]


@pytest.mark.parametrize("case", [c for c in DATA["reasoning_cases"] if "max_tokens" not in c],
                         ids=[c["name"] for c in DATA["reasoning_cases"] if "max_tokens" not in c])
def test_reasoning_cases_split(case):
    """Inside the reasoning the same rule decides: its calls are the case's calls, and what stays reasoning holds
    the markup exactly when the case says it does."""
    reasoning = _reasoning(case["text"])
    for pieces in (_merge(m.split(reasoning, NAMES)[0]), streamed(reasoning)):
        assert [p.name for p in pieces if isinstance(p, m.Call)] == [name for name, _ in case["calls"]]
        kept = "".join(p.text if isinstance(p, m.Text) else p.raw for p in pieces if not isinstance(p, m.Call))
        assert ("<function=" in kept) == case["reasoning_markup"], kept


ARRAY, INTEGER, BOOLEAN, OBJECT = (frozenset([t]) for t in ("array", "integer", "boolean", "object"))


@pytest.mark.parametrize("value,types,read", [
    ("['a', 'b']", ARRAY, '["a", "b"]'),
    ("  ['src/a.py', \"b\"]  ", ARRAY, '["src/a.py", "b"]'),
    ('"5"', INTEGER, "5"),
    ('"5"', frozenset(["number"]), "5"),
    ("5", frozenset(["number"]), "5"),
    ('"false"', BOOLEAN, "false"),
    ("True", BOOLEAN, "true"),
    ("{'deep': True, 'limit': None}", OBJECT, '{"deep": true, "limit": null}'),
    ('"[1, 2]"', ARRAY, "[1, 2]"),
    ("None", frozenset(["integer", "null"]), "null"),
    ("['é']", ARRAY, '["é"]'),
    # No one reading: stays as written.
    ("a.py, b.py", ARRAY, None),
    ("five", INTEGER, None),
    ("['a', 'b']", frozenset(["array", "string"]), None),  # a string is allowed: the text may be meant
    ("['a']", frozenset(["string"]), None),
    ("('a', 'b')", ARRAY, None),  # a tuple is Python's, not JSON's
    ("{'a', 'b'}", ARRAY, None),  # a set
    ("{1: 'a'}", OBJECT, None),  # a key JSON cannot hold
    ("[1e999]", ARRAY, None),  # infinity
    ("['a']", INTEGER, None),  # the wrong type
    ("__import__('os')", ARRAY, None),  # not a literal: never run
    ("[" * 5000 + "]" * 5000, ARRAY, None),  # nested past both readers' limits: no reading, no error
    ("['" + "a" * m.LITERAL_MAX + "']", ARRAY, None),  # too long to read
])
def test_read_literal(value, types, read):
    assert m.read_literal(value, types) == read
