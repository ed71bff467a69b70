"""A server-side tool made up for the tests, `lookup_word` (a word's meaning from a small glossary, no network), and
the proxy app that serves it: the walk through docs/architecture.md's "How to add a tool" checklist, done in a
test run. `install()` is the whole of it: the tool's module (this file's LookupWord), its registry entry, and one
row in each API's presentation table; nothing else in proxy/ learns of it. tests/test_new_tool.py starts the real
proxy with `standins.new_tool:app` and calls the tool through all three APIs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from proxy.apis.chat.presentation import CHAT_TOOLS, ChatTool
from proxy.apis.messages.presentation import SERVER_TOOLS, ServerTool
from proxy.apis.responses.presentation import HOSTED_ACTIONS, HostedAction, arguments_of
from proxy.core.codec import as_dict
from proxy.tools import registry
from proxy.tools.base import NO_LIMITS, OTHER, Cited, Limits, RunContext

NAME = "lookup_word"
GLOSSARY = {"proxy": "a server that stands between a client and the server it talks to",
            "greenlet": "a lightweight coroutine of gevent, one per open request in the proxy"}


@dataclass(frozen=True)
class Meaning:
    """What one lookup_word call produced: the word and its meaning, or why not."""
    word: str
    meaning: str | None = None
    error_code: str | None = None
    message: str = ""
    tool: ClassVar[str] = NAME
    repeated: ClassVar[bool] = False
    timed_out: ClassVar[bool] = False
    truncated: ClassVar[bool] = False

    @property
    def status(self) -> str:
        return "ok" if self.meaning is not None else "failed"


@dataclass(frozen=True)
class LookupRequest:
    word: str
    early: Meaning | None = None
    tool: ClassVar[str] = NAME

    @property
    def shown(self) -> str:
        return self.word


def text_of(outcome: Meaning) -> str:
    return f'"{outcome.word}" means: {outcome.meaning}.' if outcome.meaning is not None else outcome.message


class LookupWord:
    """The tool's module: base.Tool kept in full."""

    name = NAME
    description = "Look up what a word means in the proxy's glossary."
    schema = {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}
    kind = OTHER  # neither a search nor a page read: counted as neither
    broken = "Lookup failed: the proxy could not look this word up (an internal error)."

    def parse(self, arguments, limits: Limits = NO_LIMITS) -> LookupRequest:
        word = arguments_of(arguments).get("word")
        if not isinstance(word, str) or not word.strip():
            return LookupRequest("", Meaning("", error_code="invalid_tool_input", message='Lookup failed: missing "word".'))
        return LookupRequest(word.strip().casefold())

    def run(self, request: LookupRequest, ctx: RunContext) -> Meaning:
        if request.early is not None:
            return request.early
        meaning = GLOSSARY.get(request.word)
        if meaning is None:
            return Meaning(request.word, error_code="not_found", message=f'Lookup failed: "{request.word}" is not in the glossary.')
        return Meaning(request.word, meaning)

    def reads(self, request: LookupRequest) -> None:
        return None

    def failure(self, request: LookupRequest, code: str, message: str) -> Meaning:
        return Meaning(request.word, error_code=code, message=message)

    def text(self, outcome: Meaning) -> str:
        return text_of(outcome)

    def sources(self, outcome: Meaning) -> list[Cited]:
        return []


TOOL = LookupWord()


def _block(use_id: str, outcome: Meaning, cite) -> dict:
    content = ({"type": "lookup_word_result", "word": outcome.word, "meaning": outcome.meaning} if outcome.meaning
               else {"type": "lookup_word_tool_result_error", "error_code": outcome.error_code or "unavailable"})
    return {"type": "lookup_word_tool_result", "tool_use_id": use_id, "content": content}


def _replayed(content, call_input: dict, sources) -> str:
    content = as_dict(content)
    if content.get("meaning"):
        return text_of(Meaning(str(content.get("word")), str(content["meaning"])))
    return f"Lookup failed ({content.get('error_code')})."


def install() -> None:
    """The tool's registry entry and its three rows."""
    registry.TOOLS[NAME] = TOOL
    CHAT_TOOLS[NAME] = ChatTool(NAME, lambda cfg: True)
    SERVER_TOOLS[NAME] = ServerTool(
        tool=NAME, type_prefix="lookup_word_", result_type="lookup_word_tool_result", result_list=False,
        usage_key=None, counts=("max_uses",), cites=False,
        used_up="Not looked up: this request allows at most {limit} lookups (max_uses).",
        scope=("", ""), result_block=_block, model_text=lambda outcome, call_input: text_of(outcome),
        replayed=_replayed, counted=lambda block: False)
    HOSTED_ACTIONS[NAME] = HostedAction(
        NAME, "lookup", lambda arguments: {"type": "lookup", "word": str(arguments_of(arguments).get("word") or "")},
        None, lambda action, failed: ({"word": str(action.get("word") or "")}, "Looked up in an earlier turn."),
        item_type="lookup_call", id_prefix="lk_", events=("response.lookup_call.in_progress",),
        completed="response.lookup_call.completed")


install()

# The app is built after the tool is in: the same create_app as proxy-passthrough.py's, from the environment.
from proxy.core.config import Config  # noqa: E402
from proxy.http.app import create_app  # noqa: E402

app = create_app(Config.from_env(os.environ))
