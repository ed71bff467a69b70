"""The streaming half of the Messages server-tool loop: vLLM's events relayed live, its
internal tool_use blocks held back, each search shown as server-tool blocks with `ping`
events while it runs, and the whole reply kept as one well-formed Anthropic message.

Used by proxy.messages; not run on its own (tests: tests/run.sh tests/test_messages.py).
"""
from __future__ import annotations

import json
import logging
import re
import uuid

from flask import Response

from .background import run_with_keepalive
from .errors import anthropic_error, anthropic_error_bytes, upstream_error_status
from .exchange import ClientWatch, Exchange, encode_json, response_headers, start_stream
from .messages import (Plan, Searcher, add_usage, as_anthropic_error,
                       next_request, server_use_block, tool_results, turn_calls, with_searches)
from .sse import event_and_data, iter_frames
from .upstream import UpstreamError

log = logging.getLogger("proxy.messages")

PING = b'event: ping\ndata: {"type": "ping"}\n\n'
SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")]
# vLLM writes `index` as the last key of a block event, so a renumbered event can keep every
# other byte; a JSON string can't hold a raw newline, so this only matches the real key.
_INDEX_TAIL = re.compile(rb'"index":\d+}(\r?\n)')


def event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: ".encode() + encode_json(data) + b"\n\n"


def error_event(status: int, message: str, raw: bytes | None = None) -> bytes:
    body = as_anthropic_error(status, raw) if raw is not None else anthropic_error_bytes(status, message)
    return b"event: error\ndata: " + body.strip().replace(b"\n", b" ") + b"\n\n"


def reindex(frame: bytes, data: dict, new: int) -> bytes:
    """The event with its block index renumbered over the whole client message. The client's
    accumulator looks blocks up by index, so after a held-back or added block it must move."""
    if data.get("index") == new:
        return frame
    out, n = _INDEX_TAIL.subn(b'"index":%d}\\1' % new, frame, count=1)
    if n:
        return out
    name, _ = event_and_data(frame)
    return event(name or data.get("type", "message"), {**data, "index": new})


def server_block_events(block: dict, index: int) -> list[bytes]:
    """A server_tool_use as Anthropic streams it (empty input, "" then the JSON), or a whole
    web_search_tool_result as one start and its stop."""
    if block["type"] == "server_tool_use":
        return [event("content_block_start", {"type": "content_block_start", "index": index,
                                              "content_block": {**block, "input": {}}}),
                event("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta", "partial_json": ""}}),
                event("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta",
                                                        "partial_json": json.dumps(block["input"], ensure_ascii=False)}}),
                event("content_block_stop", {"type": "content_block_stop", "index": index})]
    return [event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}),
            event("content_block_stop", {"type": "content_block_stop", "index": index})]


class _Turn:
    """One streamed vLLM turn, gathered as its events pass: the blocks (to append to the
    history), the held tool_use events, the final message_delta."""

    def __init__(self):
        self.blocks: dict[int, dict] = {}
        self.json: dict[int, str] = {}
        self.held: list[tuple[bytes, dict]] = []
        self.delta: dict | None = None
        self.delta_frame = b""
        self.stop_frame = b""

    def add(self, data: dict):
        kind, idx = data.get("type"), data.get("index")
        if kind == "content_block_start":
            self.blocks[idx] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta" and idx in self.blocks:
            block, delta = self.blocks[idx], data.get("delta") or {}
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
        return (self.blocks.get(idx) or {}).get("type") == "tool_use"

    def content(self) -> list[dict]:
        out = []
        for idx in sorted(self.blocks):
            block = self.blocks[idx]
            if block.get("type") == "tool_use" and self.json.get(idx):
                try:
                    block = {**block, "input": json.loads(self.json[idx])}
                except ValueError:
                    block = {**block, "input": self.json[idx]}  # parse_arguments reports it
            out.append(block)
        return out


def stream_loop(ex: Exchange, body: dict, plan: Plan, first: list[dict] | None) -> Response:
    up = None
    if first is None:
        up, answer = start_stream(ex, ex.target, body, error=anthropic_error, translate=as_anthropic_error)
        if answer is not None:
            return answer
        headers = response_headers(up)
    else:
        ex.watch = ClientWatch(ex.environ)
        headers = SSE_HEADERS
    return Response(_events(ex, body, plan, up, first), status=200, headers=headers, direct_passthrough=True)


def _events(ex: Exchange, body: dict, plan: Plan, up, first):
    searcher = Searcher(ex, plan)
    messages = list(body["messages"])
    usage = None
    started = False
    next_index = 0          # the client's block index, counted over the whole message
    try:
        while True:
            if first is not None:
                turn_blocks, first = first, None
                if not started:
                    started = True
                    yield event("message_start", {"type": "message_start", "message": {
                        "id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
                        "content": [], "model": body.get("model"), "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": 0, "output_tokens": 0}}})
            else:
                turn = _Turn()
                index_map: dict[int, int] = {}
                try:
                    for frame in iter_frames(up.iter_raw()):
                        name, payload = event_and_data(frame)
                        try:
                            data = json.loads(payload) if payload else None
                        except ValueError:
                            data = None
                        if not isinstance(data, dict):
                            yield frame  # comments and anything unknown pass as they are
                            continue
                        kind = data.get("type", name)
                        if kind == "message_start":
                            if not started:
                                started = True
                                yield frame
                            continue  # a later turn's start: the client's message is already open
                        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
                            turn.add(data)
                            idx = data.get("index")
                            if turn.is_tool(idx):
                                turn.held.append((frame, data))
                                continue
                            if kind == "content_block_start":
                                index_map[idx] = next_index
                                next_index += 1
                            yield reindex(frame, data, index_map.get(idx, idx))
                        elif kind == "message_delta":
                            turn.delta, turn.delta_frame = data, frame
                        elif kind == "message_stop":
                            # Read on to the end of the body (it ends right here) so this
                            # connection goes back to the pool instead of being dropped.
                            turn.stop_frame = frame
                            continue
                        elif kind == "error":
                            yield frame if payload.startswith(b'{"type":"error"') else error_event(500, "", payload)
                            return
                        else:
                            yield frame
                except UpstreamError as e:
                    if ex.watch.gone:
                        return
                    status, msg = upstream_error_status(e)
                    log.warning("messages stream turn %d: %s", searcher.session.rounds + 1, msg)
                    yield error_event(status, msg)
                    return
                if not turn.stop_frame:
                    yield error_event(502, "vLLM ended the stream early (no message_stop); the answer is incomplete")
                    return
                usage = add_usage(usage, (turn.delta or {}).get("usage"))
                turn_blocks = turn.content()
                if not any(searcher.is_search(b) for b in turn_blocks):
                    yield from _finish(turn, index_map, next_index, searcher, usage)
                    return

            searches = [b for b in turn_blocks if searcher.is_search(b)]
            if searcher.session.exhausted:
                yield error_event(422, searcher.session.cap_message())
                return
            uses = [server_use_block(b) for b in searches]
            for u in uses:
                for e in server_block_events(u, next_index):
                    yield e
                next_index += 1
            outcomes = yield from run_with_keepalive(
                lambda: searcher.run(searches), ex.cfg.keepalive_interval, PING,
                should_stop=lambda: ex.watch.gone)
            if ex.watch.gone or outcomes is None:
                return
            results = searcher.results(uses, outcomes)
            for r in results:
                for e in server_block_events(r, next_index):
                    yield e
                next_index += 1
            messages = messages + [{"role": "assistant", "content": turn_blocks},
                                   tool_results(turn_calls(turn_blocks), searches, outcomes)]
            try:
                up = ex.post(ex.target, next_request(body, messages, plan))
                if up.status != 200 or not up.is_event_stream:
                    raw = up.read()
                    yield error_event(up.status if up.status != 200 else 502, "", raw)
                    return
            except UpstreamError as e:
                if ex.watch.gone:
                    return
                status, msg = upstream_error_status(e)
                yield error_event(status, msg)
                return
    finally:
        ex.watch.stop()
        if up is not None:
            up.abort()


def _finish(turn: _Turn, index_map: dict, next_index: int, searcher: Searcher, usage):
    """The last turn's held client tool calls, then the one message_delta and message_stop."""
    for frame, data in turn.held:
        idx = data.get("index")
        if data.get("type") == "content_block_start":
            index_map[idx] = next_index
            next_index += 1
        yield reindex(frame, data, index_map.get(idx, idx))
    if searcher.session.rounds == 0:
        yield turn.delta_frame  # nothing was searched: vLLM's own bytes
    else:
        delta = dict(turn.delta or {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}})
        delta["usage"] = with_searches(usage, searcher.requests)
        yield event("message_delta", delta)
    yield turn.stop_frame
