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
