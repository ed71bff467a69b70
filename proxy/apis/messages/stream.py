"""The Anthropic event stream a client reads over every turn of a /v1/messages search: vLLM's
events relayed live with block indexes renumbered over the whole message, its internal
tool_use blocks held back, server-tool blocks added, one message_start and one end.

Used by proxy/apis/messages/handler.py's streamed dialect; not run on its own (tests: tests/test_messages.py).
"""
from __future__ import annotations

import re
import uuid
from typing import Any

from proxy.apis.citations import Citer
from proxy.apis.messages.wire import anthropic_error_bytes, as_anthropic_error
from proxy.core import codec
from proxy.core.codec import event_and_data, iter_frames

SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]
# vLLM writes `index` as the last key of a block event, so a renumbered event can keep every
# other byte; a JSON string can't hold a raw newline, so this only matches the real key.
_INDEX_TAIL = re.compile(rb'"index":\d+}(\r?\n)')


def event(name: str, data: dict) -> bytes:
    return codec.event(name, data)


def error_event(status: int, message: str, raw: bytes | None = None) -> bytes:
    body = as_anthropic_error(status, raw) if raw is not None else anthropic_error_bytes(status, message)
    return codec.raw_event("error", body)


def reindex(frame: bytes, data: dict, new: int | None) -> bytes:
    """The event with its block index renumbered over the whole client message. The client's
    accumulator looks blocks up by index, so after a held-back or added block it must move.
    An event without an index (None) has nothing to renumber."""
    if new is None or data.get("index") == new:
        return frame
    out, n = _INDEX_TAIL.subn(b'"index":%d}\\1' % new, frame, count=1)
    if n:
        return out
    name, _ = event_and_data(frame)
    return event(name or data.get("type", "message"), {**data, "index": new})


def server_block_events(block: dict, index: int) -> list[bytes]:
    """A server_tool_use as Anthropic streams it (empty input, "" then the JSON), or a whole
    web_search_tool_result or web_fetch_tool_result as one start and its stop."""
    if block["type"] == "server_tool_use":
        return [event("content_block_start", {"type": "content_block_start", "index": index,
                                              "content_block": {**block, "input": {}}}),
                event("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta", "partial_json": ""}}),
                event("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta",
                                                        "partial_json": codec.arguments_text(block["input"])}}),
                event("content_block_stop", {"type": "content_block_stop", "index": index})]
    return [event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}),
            event("content_block_stop", {"type": "content_block_stop", "index": index})]


class MessagesTurn:
    """One streamed vLLM turn, gathered as its events pass: the blocks (to append to the
    history), the held tool_use events, the final message_delta."""

    def __init__(self):
        # Keyed by the events' `index` exactly as sent (JSON: vLLM's ints, in practice).
        self.by_index: dict[Any, dict] = {}
        self.blocks: list[dict] = []      # in order, once the turn has ended
        self.index: dict[Any, int] = {}   # vLLM's block index -> the client's
        self.json: dict[Any, str] = {}
        self.held: list[tuple[bytes, dict]] = []
        self.delta: dict | None = None
        self.delta_frame = b""
        self.stop_frame = b""

    def add(self, data: dict):
        kind, idx = data.get("type"), data.get("index")
        if kind == "content_block_start":
            self.by_index[idx] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta" and idx in self.by_index:
            block, delta = self.by_index[idx], data.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            elif dtype == "signature_delta":
                block["signature"] = delta.get("signature", "")
            elif dtype == "input_json_delta":
                self.json[idx] = self.json.get(idx, "") + delta.get("partial_json", "")

    def is_tool(self, idx) -> bool:
        return (self.by_index.get(idx) or {}).get("type") == "tool_use"

    def content(self) -> list[dict]:
        out = []
        for idx in sorted(self.by_index):
            block = self.by_index[idx]
            if block.get("type") == "tool_use" and self.json.get(idx):
                try:
                    block = {**block, "input": codec.loads(self.json[idx])}
                except ValueError:
                    block = {**block, "input": self.json[idx]}  # parse_arguments reports it
            out.append(block)
        return out


class ClientMessage:
    """The one message the client's stream holds over every turn: opened once, its blocks
    numbered in one sequence."""

    def __init__(self):
        self.started = False
        self.next_index = 0
        self.citer: Citer | None = None  # the answer's citations (proxy.apis.citations); None: CITATIONS=off

    def open(self, model) -> bytes:
        """A message_start of the proxy's own, for a stream whose first turn it made itself."""
        self.started = True
        return event("message_start", {"type": "message_start", "message": {
            "id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
            "content": [], "model": model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})

    def stream_turn(self, up):
        """Relay one vLLM turn; returns it gathered, or None once its error event was sent."""
        turn = MessagesTurn()
        for frame in iter_frames(up.iter_raw()):
            name, payload = event_and_data(frame)
            try:
                data = codec.loads(payload) if payload else None
            except ValueError:
                data = None
            if not isinstance(data, dict):
                yield frame  # comments and anything unknown pass as they are
                continue
            kind = data.get("type", name)
            if kind == "message_start":
                if not self.started:
                    self.started = True
                    yield frame
                continue  # a later turn's start: the client's message is already open
            if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
                turn.add(data)
                idx = data.get("index")
                if turn.is_tool(idx):
                    turn.held.append((frame, data))
                    continue
                if kind == "content_block_start":
                    turn.index[idx] = self.take_index()
                yield reindex(frame, data, turn.index.get(idx, idx))
                if self.citer is not None and kind == "content_block_delta":
                    yield from self.citations(turn.index.get(idx, idx), data)
            elif kind == "message_delta":
                turn.delta, turn.delta_frame = data, frame
            elif kind == "message_stop":
                # Read on to the end of the body (it ends right here) so this
                # connection goes back to the pool instead of being dropped.
                turn.stop_frame = frame
                continue
            elif kind == "error":
                yield frame if (payload or b"").startswith(b'{"type":"error"') else error_event(500, "", payload)
                return None
            else:
                yield frame
        if not turn.stop_frame:
            yield error_event(502, "vLLM ended the stream early (no message_stop); the answer is incomplete")
            return None
        turn.blocks = turn.content()
        return turn

    def citations(self, index, data: dict):
        """The citations_delta events for the markers a text_delta completes, inside its block, right after it
        (vLLM's own events pass as they are; these are the proxy's, added)."""
        delta = data.get("delta") or {}
        if self.citer is None or delta.get("type") != "text_delta":
            return
        for citation in self.citer.feed(index, str(delta.get("text") or "")):
            yield event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "citations_delta", "citation": citation}})

    def take_index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    def blocks(self, blocks: list[dict]) -> list[bytes]:
        """Server blocks of the proxy's own, each at the next index."""
        return [e for b in blocks for e in server_block_events(b, self.take_index())]

    def finish(self, turn: MessagesTurn, usage: dict | None):
        """The last turn's held client tool calls, then the one message_delta (vLLM's own
        bytes when `usage` is None: nothing was searched) and message_stop."""
        for frame, data in turn.held:
            idx = data.get("index")
            if data.get("type") == "content_block_start":
                turn.index[idx] = self.take_index()
            yield reindex(frame, data, turn.index.get(idx, idx))
        if usage is None:
            yield turn.delta_frame
        else:
            delta = dict(turn.delta or {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}})
            delta["usage"] = usage
            yield event("message_delta", delta)
        yield turn.stop_frame
