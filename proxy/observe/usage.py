"""What a request used, read from the answer its client got: the usage object every API writes (chat's
prompt_tokens/completion_tokens, Anthropic's and Responses' input_tokens/output_tokens, their cached-prompt
details), whole or inside a stream's events. proxy/http/flow.py feeds it the body as it leaves, untouched, for
the requests of a keys-file key; pure.

The client's answer is the right place to read it: the search loop sums every turn's usage into the one the client
gets, and a relayed answer carries vLLM's own, so one reader serves every path.
"""
from __future__ import annotations

from typing import Any

from proxy.core import codec

MAX_BODY = 8 * 1024 * 1024   # a whole JSON answer read for its usage; a bigger one (none seen) is not read
MAX_LINE = 1024 * 1024       # a stream's partial event line kept across chunks


def usage_of(obj: Any) -> dict | None:
    """The usage object in one JSON answer or stream event: at the top (chat, Anthropic's message_delta and whole
    messages), in Anthropic's message_start `message`, or in a Responses event's `response`. Pure."""
    if not isinstance(obj, dict):
        return None
    for holder in (obj, obj.get("message"), obj.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            return holder["usage"]
    return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def figures(usage: dict) -> dict[str, int]:
    """prompt_tokens, completion_tokens and cached_tokens from any API's usage object. Pure."""
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    prompt = _int(usage.get("prompt_tokens")) or _int(usage.get("input_tokens"))
    if "input_tokens" in usage and "prompt_tokens" not in usage:
        # Anthropic counts the prompt's cached part apart from input_tokens.
        cached = cached or _int(usage.get("cache_read_input_tokens"))
        prompt += _int(usage.get("cache_read_input_tokens")) + _int(usage.get("cache_creation_input_tokens"))
    return {"prompt_tokens": prompt, "completion_tokens": _int(usage.get("completion_tokens"))
            or _int(usage.get("output_tokens")), "cached_tokens": cached}


def generated_text(obj: Any) -> str:
    """The generated text one stream event carries, in any API's shape: chat's choices[].delta (content, reasoning,
    tool-call arguments; every choice, so n > 1 counts each), /v1/completions' choices[].text, Anthropic's
    delta.text / thinking / partial_json, a Responses event's string delta. Pure."""
    if not isinstance(obj, dict):
        return ""
    parts: list[str] = []
    for choice in obj.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            parts += [v for k in ("content", "reasoning", "reasoning_content") if isinstance(v := delta.get(k), str)]
            for call in delta.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    parts.append(function["arguments"])
        if isinstance(choice.get("text"), str):
            parts.append(choice["text"])
    delta = obj.get("delta")
    if isinstance(delta, str):
        parts.append(delta)
    elif isinstance(delta, dict):
        parts += [v for k in ("text", "thinking", "partial_json") if isinstance(v := delta.get(k), str)]
    return "".join(parts)


class UsageScan:
    """Reads the usage out of one answer's bytes as they pass. A stream's usage comes in several events
    (Anthropic's message_start and message_delta; vLLM's continuous usage) and each figure only grows, so the
    largest of each is the answer's."""

    def __init__(self):
        self.stream = False
        self._carry = b""
        self._body: list[bytes] = []
        self._size = 0
        self.found: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
        self.usage_seen = False
        self.text_events = 0   # stream events that carried generated text: at least one token each
        self.text_chars = 0    # the characters they carried

    def headers(self, headers: list[tuple[str, str]]) -> None:
        kind = next((v for n, v in headers if n.lower() == "content-type"), "")
        self.stream = kind.split(";")[0].strip().lower() == "text/event-stream"

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        if not self.stream:
            self._size += len(chunk)
            if self._size <= MAX_BODY:
                self._body.append(bytes(chunk))
            return
        lines = (self._carry + bytes(chunk)).split(b"\n")
        carry = lines.pop()
        self._carry = carry if len(carry) <= MAX_LINE else b""
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            if b'"usage"' in line:
                self._take(line[5:])
            elif b'"delta"' in line or b'"text"' in line:
                self._count(line[5:])

    def _count(self, raw: bytes) -> None:
        try:
            text = generated_text(codec.loads(raw))
        except (ValueError, RecursionError):
            return
        if text:
            self.text_events += 1
            self.text_chars += len(text)

    def _take(self, raw: bytes) -> None:
        try:
            usage = usage_of(codec.loads(raw))
        except (ValueError, RecursionError):
            return
        if usage is not None:
            self.usage_seen = True
            for name, value in figures(usage).items():
                self.found[name] = max(self.found[name], value)

    def result(self) -> dict[str, int]:
        """The figures found, once the body has passed."""
        if not self.stream and self._body and self._size <= MAX_BODY:
            self._take(b"".join(self._body))
            self._body = []
        return dict(self.found)

    def streamed_tokens(self) -> int:
        """At least how many tokens the stream's text events carried, for a stream whose usage never came (the
        client hung up first, or it did not ask and the proxy relayed the stream as it was): one per event (vLLM
        sends one token an event, or more with --stream-interval), or a token per 4 characters when that is more
        (WEB_FETCH_MAX_TOKENS's measure)."""
        return max(self.text_events, -(-self.text_chars // 4))
