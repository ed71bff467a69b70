"""The stack's tool-call parser, `--tool-call-parser qwen3_stack` (loaded with `--tool-parser-plugin`; docs/apis.md,
"Tool calls the model writes").

vLLM 0.32's qwen3_coder with one change: what is a call and what is text is decided by qwen3_markup.py with the
whole answer (or the stream so far) in view. An answer made only of well-formed calls to offered tools and plain
text is left to qwen3_coder untouched, so its calls are byte-equal to vLLM's own. Otherwise:

- a call the answer ends inside (max_tokens, a stop string) is dropped with everything after it; non-streaming,
  the calls before it are dropped too, so vLLM reports the engine's own finish_reason ("length"), not "tool_calls";
- markup quoted as text (a fenced example, a sentence naming `<tool_call>` or `<function=...>` in backticks or as
  prose), and calls to tools the request did not offer, stay text, whole;
- a parameter closed only by the next `<parameter=` keeps its value; each call goes through qwen3_coder's own
  argument conversion (schema types), in the canonical markup it reads exactly.

Streaming, ordinary text flows at once except a `<` that could still become an opener (at most
qwen3_markup.HOLD_BOUND characters, then, once an opener is complete, until it is decided as a call or text); the
calls are sent whole (id, name, all arguments in one delta) when the answer ends, and not at all when it was cut,
so a stream and a whole answer always tell the same thing and a cut never leaves a call, whole or partial, behind.

Values: a value the tool's schema says is not a string, which qwen3_coder's conversion would still deliver as a
string, is read by qwen3_markup.read_literal where it has one reading (`['a', 'b']` for an array, `"5"` for an
integer); anything else stays as written.

The reasoning, `--reasoning-parser qwen3_stack` (this file is also the `--reasoning-parser-plugin`): vLLM's qwen3
reasoning parser, which ends the reasoning at `<tool_call>` only, with one change: a complete call to an offered tool
written bare inside the reasoning (`<function=NAME>...</function>`) is taken out of it and becomes a call, held with
the answer's own (so a cut drops it too, and `tool_choice: none` drops it, as it drops every call).
Markup quoted or fenced in the reasoning, an unfinished call, and a call to a tool nobody offered stay reasoning.
Streaming, the reasoning holds back what could still be such a call, as the answer does.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Sequence

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    ToolCall,
)
from vllm.parser.qwen3 import _trim_wrapping_newlines
from vllm.reasoning import ReasoningParserManager
from vllm.reasoning.qwen3_engine_reasoning_parser import Qwen3ParserReasoningAdapter
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.qwen3_engine_tool_parser import Qwen3EngineToolParser
from vllm.tool_parsers.utils import (
    _TYPE_ALIASES,
    coerce_to_schema_type,
    extract_types_from_schema,
    find_tool_properties,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_markup as markup  # noqa: E402  (beside this file; vLLM loads the plugin by path)

NAME = "qwen3_stack"


# vLLM makes a request's reasoning parser, then its tool parser (vllm/parser/abstract_parser.py, Parser.__init__),
# and gives the request's tools to the tool parser only: the reasoning parser made last on this thread is the one of
# the request the next tool parser is made for, and the pair is linked there.
_made = threading.local()


def offered_names(tools) -> frozenset[str] | None:
    """The function names among `tools` (a request's); None when it offers none (nothing to check against)."""
    names = set()
    for tool in tools or []:
        function = getattr(tool, "function", None)
        name = getattr(function, "name", None) or getattr(tool, "name", None)
        if name:
            names.add(name)
    return frozenset(names) or None


def takes_calls(request) -> bool:
    """Whether the parser's calls reach the client: not under `tool_choice: none`. (`required` and a named tool
    constrain what the model writes with vLLM's grammar; the text is still read here, since this parser, like
    qwen3_coder, says it does not support them, and vLLM falls back to `auto`'s reading.)"""
    return getattr(request, "tool_choice", None) != "none"


def _schema_types(schema) -> frozenset[str]:
    if not isinstance(schema, dict):
        return frozenset()
    return frozenset(_TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in extract_types_from_schema(schema))


def coerced(call: markup.Call, tools) -> markup.Call:
    """The call with each value its schema wants as no string, but qwen3_coder would still deliver as one, read by
    markup.read_literal where that has one reading; the call itself when nothing changed."""
    properties = find_tool_properties(tools, call.name) if tools else {}
    params, changed = [], False
    for name, raw in call.params:
        types = _schema_types(properties.get(name))
        value = _trim_wrapping_newlines(raw)
        if types and "string" not in types and isinstance(coerce_to_schema_type(value, sorted(types)), str):
            read = markup.read_literal(value, types)
            if read is not None:
                raw, changed = read, True
        params.append((name, raw))
    return dataclasses.replace(call, params=tuple(params), repaired=True) if changed else call


@ToolParserManager.register_module(NAME)
class Qwen3StackToolParser(Qwen3EngineToolParser):  # type: ignore[valid-type, misc]
    def __init__(self, tokenizer, tools=None, **kwargs) -> None:
        super().__init__(tokenizer, tools, **kwargs)
        self._text = ""
        self._decided = 0
        self._scan = markup.ScanState()
        self._held_calls: list[markup.Call] = []
        self._cut = False
        self._pending_ws = ""
        self._text_sent = False
        self._request = None
        self.names = offered_names(tools)
        self.reasoning_calls: list[markup.Call] = []  # non-streaming: the calls the reasoning parser took out
        reasoning, _made.reasoning = getattr(_made, "reasoning", None), None
        if reasoning is not None:
            reasoning.tool_parser = self

    def take_reasoning_call(self, call: markup.Call) -> None:
        """A call the reasoning held: sent with the answer's own, in order, at the end."""
        self._held_calls.append(call)

    def answer_ended_in_reasoning(self, request, cut: bool) -> None:
        """The answer ended before its reasoning did (so the tool phase, which learns the request, never ran);
        `cut`: inside a call, which drops every call, as a cut in the answer does."""
        self._request = self._request or request
        self._cut = self._cut or cut

    # -- non-streaming ---------------------------------------------------------------------------------------
    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        pieces, awkward = markup.split(model_output, offered_names(request.tools))
        mended = [coerced(p, request.tools) if isinstance(p, markup.Call) else p
                  for p in [*self.reasoning_calls, *pieces]]
        self.reasoning_calls = []
        if not awkward and mended == pieces:
            return super().extract_tool_calls(model_output, request)
        pieces = mended
        if any(isinstance(p, markup.Cut) for p in pieces):
            text = "".join(p.text for p in pieces if isinstance(p, markup.Text))
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=text or None)
        calls = self._convert([p for p in pieces if isinstance(p, markup.Call)], request)
        text = "".join(p.text for p in pieces if isinstance(p, markup.Text))
        content = self._parser_engine._strip_content_whitespace(text, bool(calls))
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls, content=content or None)

    def _convert(self, calls: list[markup.Call], request) -> list[ToolCall]:
        """Each call through qwen3_coder's own reading of its canonical markup (ids, schema types)."""
        if not calls:
            return []
        info = super().extract_tool_calls("\n".join(c.markup() for c in calls), request)
        return list(info.tool_calls)

    # -- streaming -------------------------------------------------------------------------------------------
    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request,
    ) -> DeltaMessage | None:
        self._request = request
        self._text += delta_text
        self._decided = markup.scan(self._text, self._decided, self._scan, offered_names(request.tools), final=False)
        return self._delta(request)

    def finish_streaming(self) -> DeltaMessage | None:
        request = self._request
        if request is None:
            return None
        self._decided = markup.scan(self._text, self._decided, self._scan, offered_names(request.tools), final=True)
        return self._delta(request, final=True)

    def _delta(self, request, final: bool = False) -> DeltaMessage | None:
        """Text as soon as it is decided (whitespace alone waits for more, as qwen3_coder's does); calls only at
        the end, and none when the answer was cut, so a stream tells what a whole answer tells."""
        new, self._scan.pieces = self._scan.pieces, []  # taken, not kept: a long answer makes thousands
        self._held_calls += [p for p in new if isinstance(p, markup.Call)]
        self._cut = self._cut or any(isinstance(p, markup.Cut) for p in new)
        text = self._pending_ws + "".join(p.text for p in new if isinstance(p, markup.Text))
        self._pending_ws = ""
        if not self._text_sent and not text.strip() and not final:
            self._pending_ws, text = text, ""
        if not final or self._cut or not takes_calls(request):
            calls = []
        else:
            calls = self._convert([coerced(c, request.tools) for c in self._held_calls], request)
        if calls and not self._text_sent and not text.strip():
            text = ""
        self._text_sent = self._text_sent or bool(text.strip())
        deltas = []
        for call in calls:
            index = len(self.prev_tool_call_arr)
            self.prev_tool_call_arr.append({"name": call.function.name, "arguments": call.function.arguments})
            self.streamed_args_for_tool.append(call.function.arguments)
            deltas.append(DeltaToolCall(index=index, id=call.id, type="function", function=DeltaFunctionCall(
                name=call.function.name, arguments=call.function.arguments)))
        if not text and not deltas:
            return None
        return DeltaMessage(content=text or None, tool_calls=deltas)


@ReasoningParserManager.register_module(NAME)
class Qwen3StackReasoningParser(Qwen3ParserReasoningAdapter):  # type: ignore[valid-type, misc]
    """vLLM's qwen3 reasoning parser, but a complete call to an offered tool inside the reasoning is a call."""

    def __init__(self, tokenizer, *args, **kwargs) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self.tool_parser: Qwen3StackToolParser | None = None  # the same request's, which knows the tools
        self._text = ""
        self._decided = 0
        self._scan = markup.ScanState()
        _made.reasoning = self

    def _names(self) -> frozenset[str] | None:
        return self.tool_parser.names if self.tool_parser is not None else None

    # -- non-streaming ---------------------------------------------------------------------------------------
    def extract_reasoning(self, model_output: str, request) -> tuple[str | None, str | None]:
        """The calls found in the reasoning are handed to the tool parser, which reads them before the answer's own
        (vLLM's Parser.parse calls it next, on the answer)."""
        reasoning, content = super().extract_reasoning(model_output, request)
        names = self._names()
        if not reasoning or names is None or markup.FUNC_OPEN not in reasoning:
            return reasoning, content
        pieces, _ = markup.split(reasoning, names)
        calls = [p for p in pieces if isinstance(p, markup.Call)]
        if not calls:
            return reasoning, content
        text = "".join(p.raw if isinstance(p, markup.Cut) else p.text for p in pieces if not isinstance(p, markup.Call))
        cut = isinstance(pieces[-1], markup.Cut) and model_output.endswith(pieces[-1].raw)  # the answer's end
        self.tool_parser.reasoning_calls = [] if cut else calls  # type: ignore[union-attr]
        return text or None, content

    # -- streaming -------------------------------------------------------------------------------------------
    def extract_reasoning_streaming(self, *args) -> DeltaMessage | None:
        delta = super().extract_reasoning_streaming(*args)
        if self._names() is None:
            return delta
        return self._split(delta, final=self.has_engine_confirmed_reasoning_end())

    def get_streaming_fallback_content(self, text: str, request) -> str | None:
        """Called at the end of a stream whose reasoning never ended: the one place the request reaches here."""
        if self.tool_parser is not None:
            self.tool_parser.answer_ended_in_reasoning(request, cut=False)
        return super().get_streaming_fallback_content(text, request)

    def finish_streaming(self) -> DeltaMessage | None:
        ended = self.has_engine_confirmed_reasoning_end()  # before the engine's own finish, which ends it
        delta = super().finish_streaming()
        if self._names() is None or ended:
            return delta  # the reasoning's end was decided at its marker (extract_reasoning_streaming)
        return self._split(delta, final=True, answer_end=True)

    def _split(self, delta: DeltaMessage | None, final: bool, answer_end: bool = False) -> DeltaMessage | None:
        """The reasoning decided so far, without its calls (handed to the tool parser); `final`: the reasoning is
        whole, so what is still open is text (or, at the answer's end, a cut)."""
        self._text += (delta.reasoning or "") if delta is not None else ""
        self._decided = markup.scan(self._text, self._decided, self._scan, self._names(), final=final)
        new, self._scan.pieces = self._scan.pieces, []  # taken, not kept: a long answer makes thousands
        out = []
        for piece in new:
            if isinstance(piece, markup.Call):
                self.tool_parser.take_reasoning_call(piece)  # type: ignore[union-attr]
            elif isinstance(piece, markup.Cut):
                out.append(piece.raw)
                if answer_end:
                    self.tool_parser.answer_ended_in_reasoning(None, cut=True)  # type: ignore[union-attr]
            else:
                out.append(piece.text)
        reasoning = "".join(out) or None
        if delta is None:
            return DeltaMessage(reasoning=reasoning) if reasoning else None
        if reasoning != delta.reasoning:  # the common case passes through without pydantic's validated assignment
            delta.reasoning = reasoning
        return delta if delta.reasoning is not None or delta.content is not None or delta.tool_calls else None
