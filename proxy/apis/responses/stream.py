"""The Responses event stream a client reads over every turn of a /v1/responses search: one
sequence_number and output_index space, the envelope opened once, vLLM's item events relayed
live and renumbered, its function and custom tool calls held until the turn shows whether
it searched.

Used by proxy/apis/responses/handler.py's streamed dialect; not run on its own (tests/test_responses.py
drives it end to end).
"""
from __future__ import annotations

from collections.abc import Callable

from proxy.apis.citations import Citer, cited_event
from proxy.core import codec
from proxy.core.codec import event_and_data, iter_frames

ENVELOPE_OPEN = ("response.created", "response.in_progress")
ENVELOPE_END = ("response.completed", "response.incomplete", "response.failed")


def frame(data: dict) -> bytes:
    """One event as vLLM frames it: `event: <type>`, compact JSON, blank line."""
    return codec.event(data["type"], data)


def is_client_call(item) -> bool:
    """A call to one of the client's own tools: held back while the turn may still search."""
    return isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call")


class ResponsesTurn:
    """What one streamed vLLM response said, gathered as its events pass."""

    def __init__(self, first: bool):
        self.first = first
        self.held: dict[int, list] = {}   # vLLM output_index -> the held call's events
        self.index: dict[int, int] = {}   # vLLM output_index -> the client's
        self.response: dict | None = None  # the turn's final response object
        self.error: str | None = None     # vLLM's mid-stream error message
        self.output: list = []            # the final response's items, once it has come

    def flush(self, stream: ClientStream):
        """The turn's client calls, now known not to sit beside a search: sent as vLLM wrote them."""
        for vi in sorted(self.held):
            events = self.held[vi]
            index = stream.new_index(events[0][0].get("item") or {})
            for data, raw in events:
                if data.get("type") == "response.output_item.done":
                    stream.items[index] = data.get("item") or {}
                yield stream.emit(data, raw, index)


class ClientStream:
    """The numbering the client sees: one sequence_number and one output_index space over
    every turn, and the items the final response lists. `view` turns a vLLM response object
    into the client's (its own tools echoed)."""

    def __init__(self, view: Callable[[dict], dict]):
        self.view = view
        self.seq = 0
        self.items: list[dict] = []       # by client output_index
        self.first: dict | None = None    # the first turn's response object
        self.citer: Citer | None = None   # the answer's citations (proxy.apis.citations); None: CITATIONS=off

    def emit(self, data: dict, raw: bytes | None = None, index: int | None = None) -> bytes:
        """The event renumbered for the client. vLLM's own bytes when the numbers already
        agree (a first turn before any held item); rewritten only when they don't."""
        same = data.get("sequence_number") == self.seq and (index is None or data.get("output_index") == index)
        if not same:
            data = {**data, "sequence_number": self.seq}
            if index is not None:
                data["output_index"] = index
        self.seq += 1
        return raw if same and raw is not None else frame(data)

    def adopt(self, output: list):
        """Prefer a turn's final item objects to its streamed ones (same ids), as vLLM does."""
        final = {i.get("id"): i for i in output if isinstance(i, dict) and i.get("id")}
        self.items = [final.get(i.get("id"), i) for i in self.items]

    def new_index(self, item: dict) -> int:
        self.items.append(item)
        return len(self.items) - 1

    def stream_turn(self, up, turn: ResponsesTurn):
        """Relay one vLLM stream: envelope events once, item events live and renumbered,
        function and custom tool calls held until the turn shows whether it searched."""
        for raw in iter_frames(up.iter_raw()):
            name, payload = event_and_data(raw)
            if payload is None:
                yield raw  # comments pass as they are
                continue
            try:
                data = codec.loads(payload)
            except ValueError:
                yield raw
                continue
            kind = data.get("type") or name
            if kind in ENVELOPE_OPEN:
                # The client's response opens once; later turns open nothing it can see.
                if turn.first:
                    if kind == "response.created":
                        self.first = data.get("response") or {}
                    yield self.emit({**data, "response": self.view(data.get("response") or {})})
                continue
            if kind in ENVELOPE_END:
                turn.response = data.get("response") or {}
                continue
            if kind == "error" or "error" in data:
                # vLLM gave up mid-generation: the client's response ends failed, once.
                err = data.get("error") if isinstance(data.get("error"), dict) else data
                turn.error = str(err.get("message") or "vLLM reported an error mid-stream")
                return
            if "output_index" not in data:
                yield self.emit(data, raw)
                continue
            vi = data["output_index"]
            if kind == "response.output_item.added" and is_client_call(data.get("item")):
                turn.held[vi] = [(data, raw)]
            elif vi in turn.held:
                turn.held[vi].append((data, raw))
            else:
                if kind == "response.output_item.added":
                    turn.index[vi] = self.new_index(data.get("item") or {})
                index = turn.index.get(vi, vi)
                if self.citer is not None and kind in ("response.content_part.done", "response.output_item.done"):
                    data, raw = self.cited(data, raw)
                if kind == "response.output_item.done" and index < len(self.items):
                    self.items[index] = data.get("item") or {}
                yield self.emit(data, raw, index)
                if self.citer is not None and kind == "response.output_text.delta":
                    yield from self.annotations(data, index)

    def annotations(self, delta: dict, index: int):
        """The annotation.added events for the markers this text delta completes, right after it."""
        if self.citer is None:
            return
        key = (delta.get("item_id"), delta.get("content_index"))
        before = len(self.citer.of(key))
        for n, annotation in enumerate(self.citer.feed(key, delta.get("delta") or ""), before):
            yield self.emit({"type": "response.output_text.annotation.added", "item_id": key[0], "output_index": index,
                             "content_index": key[1], "annotation_index": n, "annotation": annotation,
                             "sequence_number": 0})

    def cited(self, data: dict, raw: bytes) -> tuple[dict, bytes | None]:
        """A finished part or item with the annotations announced for it (vLLM's list is empty). Rewritten only
        when there are some: the SDK takes the done item, and the final response, as the text's last word."""
        new = cited_event(data, self.citer) if self.citer else data
        return (new, None) if new is not data else (data, raw)
