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
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    ToolCall,
)
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.qwen3_engine_tool_parser import Qwen3EngineToolParser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_markup as markup  # noqa: E402  (beside this file; vLLM loads the plugin by path)

NAME = "qwen3_stack"


def offered_names(request) -> frozenset[str] | None:
    """The function names the request offers; None when it offers none (nothing to check against)."""
    names = set()
    for tool in getattr(request, "tools", None) or []:
        function = getattr(tool, "function", None)
        name = getattr(function, "name", None) or getattr(tool, "name", None)
        if name:
            names.add(name)
    return frozenset(names) or None


@ToolParserManager.register_module(NAME)
class Qwen3StackToolParser(Qwen3EngineToolParser):  # type: ignore[valid-type, misc]
    def __init__(self, tokenizer, tools=None, **kwargs) -> None:
        super().__init__(tokenizer, tools, **kwargs)
        self._text = ""
        self._decided = 0
        self._scan = markup.ScanState()
        self._sent_pieces = 0
        self._held_calls: list[markup.Call] = []
        self._cut = False
        self._pending_ws = ""
        self._text_sent = False

    # -- non-streaming ---------------------------------------------------------------------------------------
    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        pieces, awkward = markup.split(model_output, offered_names(request))
        if not awkward:
            return super().extract_tool_calls(model_output, request)
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
        self._decided = markup.scan(self._text, self._decided, self._scan, offered_names(request), final=False)
        return self._delta(request)

    def finish_streaming(self) -> DeltaMessage | None:
        request = getattr(self, "_request", None)
        if request is None:
            return None
        self._decided = markup.scan(self._text, self._decided, self._scan, offered_names(request), final=True)
        return self._delta(request, final=True)

    def _delta(self, request, final: bool = False) -> DeltaMessage | None:
        """Text as soon as it is decided (whitespace alone waits for more, as qwen3_coder's does); calls only at
        the end, and none when the answer was cut, so a stream tells what a whole answer tells."""
        new = self._scan.pieces[self._sent_pieces:]
        self._sent_pieces = len(self._scan.pieces)
        self._held_calls += [p for p in new if isinstance(p, markup.Call)]
        self._cut = self._cut or any(isinstance(p, markup.Cut) for p in new)
        text = self._pending_ws + "".join(p.text for p in new if isinstance(p, markup.Text))
        self._pending_ws = ""
        if not self._text_sent and not text.strip() and not final:
            self._pending_ws, text = text, ""
        calls = [] if not final or self._cut else self._convert(self._held_calls, request)
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
