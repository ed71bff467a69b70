"""POST /v1/responses with `stream: true` and the hosted web_search tool: vLLM's events relayed
live, the internal function_call held back and replaced by web_search_call events, every turn
folded into one client stream. The rules live in proxy/responses.py.

Used by proxy.responses; not run on its own (tests/test_responses.py drives it end to end).
"""
from __future__ import annotations

import json
import logging

from flask import Response

from .background import run_with_keepalive
from .errors import upstream_error_status
from .exchange import Exchange, response_headers, start_stream
from .responses import (PATH, Plan, add_usage, client_view, compact, failed_response, final_response,
                        is_client_call, next_request, run_searches, search_calls,
                        web_search_item, ws_id)
from .search import parse_arguments
from .sse import comment, event_and_data, iter_frames
from .upstream import UpstreamError

log = logging.getLogger("proxy.responses")

ENVELOPE_OPEN = ("response.created", "response.in_progress")
ENVELOPE_END = ("response.completed", "response.incomplete", "response.failed")


def stream_loop(ex: Exchange, request: dict, plan: Plan) -> Response:
    first, answer = start_stream(ex, PATH, request)
    if answer is not None:
        return answer
    return Response(ClientStream(ex, request, plan).events(first), status=200, headers=response_headers(first),
                    direct_passthrough=True)


def frame(data: dict) -> bytes:
    """One event as vLLM frames it: `event: <type>`, compact JSON, blank line."""
    return b"event: " + data["type"].encode() + b"\ndata: " + compact(data) + b"\n\n"


class ClientStream:
    """The numbering the client sees: one sequence_number and one output_index space over
    every turn, and the items the final response.completed lists."""

    def __init__(self, ex: Exchange, request: dict, plan: Plan):
        self.ex, self.request, self.plan = ex, request, plan
        self.seq = 0
        self.items: list[dict] = []       # by client output_index
        self.first: dict | None = None    # the first turn's response object
        self.usage = None

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

    def events(self, up):
        session = self.ex.session()
        turn_no = 1
        try:
            while True:
                turn = Turn(turn_no == 1)
                try:
                    yield from self.relay_turn(up, turn)
                except UpstreamError as e:
                    if self.ex.watch.gone:
                        return
                    status, msg = upstream_error_status(e)
                    log.warning("responses stream turn %d: %s", turn_no, msg)
                    yield from self.fail("server_error", msg, turn.response)
                    return
                if turn.error is not None:
                    yield from self.fail("server_error", turn.error, turn.response)
                    return
                if turn.response is None:
                    yield from self.fail("server_error", "vLLM ended the stream early (no response.completed); "
                                         "the answer is incomplete", None)
                    return
                self.usage = add_usage(self.usage, turn.response.get("usage"))
                output = turn.response.get("output") or []
                self.adopt(output)
                calls = search_calls(output, self.plan.name)
                if not calls:
                    yield from turn.flush(self)
                    yield self.completed(turn)
                    return
                if session.exhausted:
                    yield from self.fail("search_iterations_exceeded", session.cap_message(), turn.response)
                    return
                outcomes = yield from self.search(session, calls)
                if outcomes is None:
                    return  # the client left during the search
                self.request = next_request(self.request, output, self.plan, outcomes)
                try:
                    up = self.ex.post(PATH, self.request)
                    if up.status != 200 or not up.is_event_stream:
                        yield from self.fail("server_error", vllm_error(up.status, up.read()), turn.response)
                        return
                except UpstreamError as e:
                    if self.ex.watch.gone:
                        return
                    status, msg = upstream_error_status(e)
                    yield from self.fail("server_error", msg, turn.response)
                    return
                turn_no += 1
        finally:
            self.ex.watch.stop()
            up.abort()

    def relay_turn(self, up, turn: "Turn"):
        """Relay one vLLM stream: envelope events once, item events live and renumbered,
        function and custom tool calls held until the turn shows whether it searched."""
        for raw in iter_frames(up.iter_raw()):
            name, payload = event_and_data(raw)
            if payload is None:
                yield raw  # comments pass as they are
                continue
            try:
                data = json.loads(payload)
            except ValueError:
                yield raw
                continue
            kind = data.get("type") or name
            if kind in ENVELOPE_OPEN:
                # The client's response opens once; later turns open nothing it can see.
                if turn.first:
                    if kind == "response.created":
                        self.first = data.get("response") or {}
                    yield self.emit({**data, "response": client_view(data.get("response") or {}, self.plan)})
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
                if kind == "response.output_item.done" and index < len(self.items):
                    self.items[index] = data.get("item") or {}
                yield self.emit(data, raw, index)

    def search(self, session, calls):
        """Show each search starting, run them together with keep-alives, show each result."""
        placed = []
        for call in calls:
            query = parse_arguments(call.get("arguments"))[0] or ""
            item = {"id": ws_id(call), "type": "web_search_call", "status": "in_progress",
                    "action": {"type": "search", "query": query}}
            index = self.new_index(item)
            placed.append((call, index))
            yield self.emit({"type": "response.output_item.added", "item": item, "output_index": index, "sequence_number": 0})
            yield self.emit({"type": "response.web_search_call.in_progress", "item_id": item["id"], "output_index": index, "sequence_number": 0})
            yield self.emit({"type": "response.web_search_call.searching", "item_id": item["id"], "output_index": index, "sequence_number": 0})
        label = ", ".join(repr(parse_arguments(c.get("arguments"))[0]) for c in calls)
        outcomes = yield from run_with_keepalive(
            lambda: run_searches(session, calls, self.plan), self.ex.cfg.keepalive_interval,
            comment(f"searching {label}"), should_stop=lambda: self.ex.watch.gone)
        if self.ex.watch.gone or outcomes is None:
            return None
        by_call = {}
        for (call, index), outcome in zip(placed, outcomes):
            by_call[call.get("call_id")] = outcome
            item = web_search_item(call, outcome, self.plan)
            self.items[index] = item
            if item["status"] == "completed":
                yield self.emit({"type": "response.web_search_call.completed", "item_id": item["id"], "output_index": index, "sequence_number": 0})
            yield self.emit({"type": "response.output_item.done", "item": item, "output_index": index, "sequence_number": 0})
        return by_call

    def completed(self, turn: "Turn") -> bytes:
        final = final_response(turn.response, self.first or turn.response, list(self.items), self.usage, self.plan)
        return self.emit({"type": "response.completed", "response": final, "sequence_number": 0})

    def fail(self, code: str, message: str, last):
        """End the stream as a failed response: the client's one closing event, with the
        items it already saw."""
        if self.first is None:
            # No response was opened, so there is none to fail: a bare error event, as OpenAI sends.
            yield self.emit({"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0})
            return
        base = last or self.first
        resp = failed_response(base, list(self.items), self.usage, self.plan, code, message)
        resp["id"], resp["created_at"] = self.first.get("id"), self.first.get("created_at")
        yield self.emit({"type": "response.failed", "response": resp, "sequence_number": 0})


def vllm_error(status: int, raw: bytes) -> str:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:300].decode("utf-8", "replace")
    return f"vLLM answered HTTP {status}: {message}"


class Turn:
    """What one streamed vLLM response said, gathered as its events pass."""

    def __init__(self, first: bool):
        self.first = first
        self.held: dict[int, list] = {}   # vLLM output_index -> the held call's events
        self.index: dict[int, int] = {}   # vLLM output_index -> the client's
        self.response: dict | None = None  # the turn's final response object
        self.error: str | None = None     # vLLM's mid-stream error message

    def flush(self, stream: ClientStream):
        """The turn's client calls, now known not to sit beside a search: sent as vLLM wrote them."""
        for vi in sorted(self.held):
            events = self.held[vi]
            index = stream.new_index(events[0][0].get("item") or {})
            for data, raw in events:
                if data.get("type") == "response.output_item.done":
                    stream.items[index] = data.get("item") or {}
                yield stream.emit(data, raw, index)
