"""vLLM 0.32's Anthropic Messages wire format (non-streaming JSON and `event:`/`data:` streams),
rebuilt from the real captures in tests/data/vllm-0.32-samples/messages-*, for the scripted
stand-in's replies and for reading what the proxy sent back.

Imported by tests; tests/test_messages.py checks these builders byte for byte against the captures.
"""
from __future__ import annotations

import itertools
import json

from .scripted_backend import Reply
from .vllm_wire import compact, sse_reply

_ids = itertools.count(1)


def _hex() -> str:
    return f"{next(_ids) + 0xb000000000000000:016x}"


def text(t) -> dict:
    """A text block; pass a list to fix how a stream splits it into deltas."""
    pieces = list(t) if isinstance(t, (list, tuple)) else [t]
    return {"type": "text", "text": "".join(pieces), "_pieces": pieces}


def thinking(t, signature: str = "93bb5fb484d54d27a83052feac5fed95") -> dict:
    pieces = list(t) if isinstance(t, (list, tuple)) else [t]
    return {"type": "thinking", "thinking": "".join(pieces), "signature": signature, "_pieces": pieces}


def tool_use(name: str, input_, ident: str | None = None) -> dict:
    """A tool call; `input_` may be a raw string (what a confused model writes) for streams."""
    raw = input_ if isinstance(input_, str) else json.dumps(input_, ensure_ascii=False)
    return {"type": "tool_use", "id": ident or f"chatcmpl-tool-{_hex()}", "name": name,
            "input": input_ if isinstance(input_, dict) else {}, "_json": raw}


def _public(block: dict) -> dict:
    return {k: v for k, v in block.items() if not k.startswith("_")}


def message(blocks, stop_reason=None, input_tokens=17, output_tokens=8, ident=None, model="foundation") -> dict:
    """A non-streaming Messages response exactly as vLLM 0.32 dumps it (no stop_sequence key)."""
    blocks = list(blocks)
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {"id": ident or f"chatcmpl-{_hex()}", "type": "message", "role": "assistant",
            "content": [_public(b) for b in blocks], "model": model, "stop_reason": stop_reason,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def message_reply(blocks, **kw) -> Reply:
    return Reply(status=200, body=compact(message(blocks, **kw)))


def event(name: str, data: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + compact(data) + b"\n\n"


def stream_frames(blocks, stop_reason=None, input_tokens=17, output_tokens=8, ident=None, model="foundation") -> list[bytes]:
    """The events of one streamed turn in vLLM's order and key order: message_start, each
    block's start/deltas/stop (index last), message_delta with usage, message_stop."""
    blocks = list(blocks)
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    frames = [event("message_start", {"type": "message_start", "message": {
        "id": ident or f"chatcmpl-{_hex()}", "type": "message", "role": "assistant", "content": [],
        "model": model, "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})]

    def delta(d, i):
        frames.append(event("content_block_delta", {"type": "content_block_delta", "delta": d, "index": i}))

    for i, b in enumerate(blocks):
        start: dict[str, object]
        if b["type"] == "text":
            start = {"type": "text", "text": ""}
        elif b["type"] == "thinking":
            start = {"type": "thinking", "thinking": ""}
        else:
            start = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
        frames.append(event("content_block_start", {"type": "content_block_start", "content_block": start, "index": i}))
        if b["type"] == "text":
            for p in b["_pieces"]:
                delta({"type": "text_delta", "text": p}, i)
        elif b["type"] == "thinking":
            for p in b["_pieces"]:
                delta({"type": "thinking_delta", "thinking": p}, i)
            delta({"type": "signature_delta", "signature": b["signature"]}, i)
        else:
            delta({"type": "input_json_delta", "partial_json": b["_json"]}, i)
        frames.append(event("content_block_stop", {"type": "content_block_stop", "index": i}))
    frames.append(event("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                                          "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}))
    frames.append(event("message_stop", {"type": "message_stop"}))
    return frames


def stream_reply(blocks, gap: float = 0.0, **kw) -> Reply:
    return sse_reply(stream_frames(blocks, **kw), gap)


def error_reply(status: int, message: str, param=None) -> Reply:
    """vLLM's error on /v1/messages: OpenAI's shape, as in messages-error-*.json."""
    return Reply(status=status, body=compact({"error": {"message": message, "type": "Bad Request",
                                                        "param": param, "code": status}}))


def parse_stream(raw: bytes) -> list[tuple[str | None, dict | None]]:
    """(event name, data) for every event of an Anthropic stream, in order."""
    out = []
    for frame in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = None, None
        for line in frame.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data = json.loads(line[5:])
        if name or data is not None:
            out.append((name, data))
    return out
