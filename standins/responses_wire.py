"""vLLM 0.32's Responses API wire format (`POST /v1/responses`), rebuilt from the real captures
in tests/data/vllm-0.32-samples/responses-* and vLLM 0.32's streaming_events.py (reasoning
events): field order, nulls, `event:`/`data:` framing, sequence numbers, reused item ids.

Imported by tests; tests/test_responses.py checks these builders byte for byte against the
captures. `model(*turns)` gives a scripted backend responder that answers like vLLM (streamed
or not, as each request asks), echoing the request's tools as vLLM does.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from .scripted_backend import Reply
from .vllm_wire import compact, sse_reply  # noqa: F401 (the same JSON and SSE framing; tests call w.compact, w.sse_reply)

CREATED_AT = 1796248628
_ids = itertools.count(1)


def _hex() -> str:
    return f"{0x5eed0000 + next(_ids):016x}"


# ---- items ------------------------------------------------------------------------------

@dataclass
class Item:
    """One output item of a turn, with the pieces it streams in."""
    type: str                    # reasoning | message | function_call
    pieces: list = field(default_factory=list)   # text/reasoning/arguments deltas
    id: str = ""
    name: str | None = None
    call_id: str | None = None
    namespace: str | None = None  # a call of a tool inside a `namespace` tool (Codex's web.run)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def reasoning(text, ident=None) -> Item:
    return Item("reasoning", _pieces(text), ident or f"rs_{_hex()}")


def message(text, ident=None) -> Item:
    return Item("message", _pieces(text), ident or f"msg_{_hex()}")


def call(name: str, arguments, ident=None, call_id=None, pieces: int = 3, namespace: str | None = None) -> Item:
    """A function_call; arguments as vLLM writes them (Python's json.dumps, with spaces)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    if isinstance(pieces, list):
        parts = pieces
    else:
        step = max(1, -(-len(args) // pieces))
        parts = [args[i:i + step] for i in range(0, len(args), step)] or [""]
    return Item("function_call", parts, ident or f"fc_{_hex()}", name, call_id or f"chatcmpl-tool-{_hex()}", namespace)


def _pieces(text) -> list:
    if isinstance(text, list):
        return text
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def output_item(item: Item, streamed: bool = False) -> dict:
    """The item as the final response lists it (`streamed`: as output_item.done carries it)."""
    if item.type == "reasoning":
        return {"id": item.id, "summary": [], "type": "reasoning",
                "content": [{"text": item.text, "type": "reasoning_text"}], "encrypted_content": None,
                "status": "completed" if streamed else None}
    if item.type == "message":
        return {"id": item.id, "content": [{"annotations": [], "text": item.text, "type": "output_text", "logprobs": None}],
                "role": "assistant", "status": "completed", "type": "message", "phase": None}
    return {"arguments": item.text, "call_id": item.call_id, "name": item.name, "type": "function_call",
            "id": item.id, "async": None, "caller": None, "namespace": item.namespace, "status": "completed"}


# ---- the response object --------------------------------------------------------------------

def usage(input_tokens: int, output_tokens: int, reasoning_tokens: int = 0, cached: int = 0, cache_write: int = 0) -> dict:
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": cache_write,
                                     "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens, "tool_output_tokens": 0,
                                      "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
            "total_tokens": input_tokens + output_tokens}


def echo_tool(tool: dict) -> dict:
    """A request tool as vLLM's pydantic dump echoes it in the response."""
    if tool.get("type") == "function":
        return {"name": tool.get("name"), "parameters": tool.get("parameters"), "strict": tool.get("strict"),
                "type": "function", "allowed_callers": None, "async": None, "defer_loading": None,
                "description": tool.get("description"), "output_schema": None}
    if tool.get("type") in ("web_search", "web_search_2025_08_26"):
        return {"type": tool["type"], "external_web_access": tool.get("external_web_access"),
                "filters": tool.get("filters"), "search_context_size": tool.get("search_context_size"),
                "user_location": tool.get("user_location")}
    return dict(tool)


def echo_reasoning(r) -> dict | None:
    if not isinstance(r, dict):
        return None
    return {"context": None, "effort": r.get("effort"), "generate_summary": None, "mode": None, "summary": r.get("summary")}


def response(request: dict, output: list, status: str = "completed", use=None, ident: str | None = None,
             created_at: int = CREATED_AT, incomplete_details=None) -> dict:
    """A response object in vLLM's field order, echoing `request` as vLLM does."""
    tool_choice = request.get("tool_choice", "auto")
    return {"id": ident, "created_at": created_at, "incomplete_details": incomplete_details,
            "instructions": request.get("instructions"), "metadata": request.get("metadata"), "model": "foundation",
            "object": "response", "output": output, "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "temperature": request.get("temperature", 1.0), "tool_choice": tool_choice,
            "tools": [echo_tool(t) for t in request.get("tools") or []], "top_p": request.get("top_p", 1.0),
            "background": False, "max_output_tokens": request.get("max_output_tokens"), "max_tool_calls": None,
            "previous_response_id": None, "prompt": None, "reasoning": echo_reasoning(request.get("reasoning")),
            "service_tier": "auto", "status": status, "text": None, "top_logprobs": None, "truncation": "disabled",
            "usage": use, "user": None, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "kv_transfer_params": None, "ec_transfer_params": None, "input_messages": None, "output_messages": None}


def default_usage(items: list[Item], input_tokens: int = 40) -> dict:
    out = sum(len(i.pieces) for i in items) + 5
    return usage(input_tokens, out, sum(len(i.pieces) for i in items if i.type == "reasoning"))


def body(request: dict, items: list[Item], use=None, ident=None, status="completed", incomplete_details=None,
         created_at: int = CREATED_AT) -> dict:
    """A non-streaming answer."""
    return response(request, [output_item(i) for i in items], status, use or default_usage(items),
                    ident or f"resp_{_hex()}", created_at, incomplete_details)


# ---- the stream -------------------------------------------------------------------------

def event(data: dict) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + compact(data) + b"\n\n"


def item_events(item: Item, index: int) -> list[dict]:
    """One item's events in vLLM's order (sequence numbers set by stream_frames)."""
    ev = []
    if item.type == "reasoning":
        ev.append({"item": {"id": item.id, "summary": [], "type": "reasoning", "content": None,
                            "encrypted_content": None, "status": "in_progress"},
                   "output_index": index, "sequence_number": 0, "type": "response.output_item.added"})
        ev.append({"content_index": 0, "item_id": item.id, "output_index": index, "part": {"text": "", "type": "reasoning_text"},
                   "sequence_number": 0, "type": "response.content_part.added"})
        for p in item.pieces:
            ev.append({"content_index": 0, "delta": p, "item_id": item.id, "output_index": index,
                       "sequence_number": 0, "type": "response.reasoning_text.delta"})
        ev.append({"content_index": 0, "item_id": item.id, "output_index": index, "sequence_number": 0,
                   "text": item.text, "type": "response.reasoning_text.done"})
        ev.append({"content_index": 0, "item_id": item.id, "output_index": index,
                   "part": {"text": item.text, "type": "reasoning_text"}, "sequence_number": 0,
                   "type": "response.content_part.done"})
    elif item.type == "message":
        ev.append({"item": {"id": item.id, "content": [], "role": "assistant", "status": "in_progress", "type": "message", "phase": None},
                   "output_index": index, "sequence_number": 0, "type": "response.output_item.added"})
        ev.append({"content_index": 0, "item_id": item.id, "output_index": index,
                   "part": {"annotations": [], "text": "", "type": "output_text", "logprobs": []},
                   "sequence_number": 0, "type": "response.content_part.added"})
        for p in item.pieces:
            ev.append({"content_index": 0, "delta": p, "item_id": item.id, "logprobs": [], "output_index": index,
                       "sequence_number": 0, "type": "response.output_text.delta"})
        ev.append({"content_index": 0, "item_id": item.id, "logprobs": [], "output_index": index, "sequence_number": 0,
                   "text": item.text, "type": "response.output_text.done"})
        ev.append({"content_index": 0, "item_id": item.id, "output_index": index,
                   "part": {"annotations": [], "text": item.text, "type": "output_text", "logprobs": None},
                   "sequence_number": 0, "type": "response.content_part.done"})
    else:
        ev.append({"item": {"arguments": "", "call_id": item.call_id, "name": item.name, "type": "function_call",
                            "id": item.id, "async": None, "caller": None, "namespace": item.namespace, "status": "in_progress"},
                   "output_index": index, "sequence_number": 0, "type": "response.output_item.added"})
        for p in item.pieces:
            ev.append({"delta": p, "item_id": item.id, "output_index": index, "sequence_number": 0,
                       "type": "response.function_call_arguments.delta"})
        ev.append({"arguments": item.text, "item_id": item.id, "output_index": index, "sequence_number": 0,
                   "type": "response.function_call_arguments.done", "name": item.name})
    ev.append({"item": output_item(item, streamed=True), "output_index": index, "sequence_number": 0,
               "type": "response.output_item.done"})
    return ev


def stream_frames(request: dict, items: list[Item], use=None, ident=None, status="completed",
                  incomplete_details=None, created_at: int = CREATED_AT) -> list[bytes]:
    """Every event of one streamed response, numbered from 0 as vLLM numbers them."""
    ident = ident or f"resp_{_hex()}"
    opening = response(request, [], "in_progress", None, ident, created_at)
    events = [{"response": opening, "sequence_number": 0, "type": "response.created"},
              {"response": opening, "sequence_number": 0, "type": "response.in_progress"}]
    for n, item in enumerate(items):
        events += item_events(item, n)
    final = response(request, [output_item(i) for i in items], status, use or default_usage(items), ident,
                     created_at, incomplete_details)
    events.append({"response": final, "sequence_number": 0, "type": "response.completed"})
    for n, e in enumerate(events):
        e["sequence_number"] = n
    return [event(e) for e in events]


def json_reply(obj, status: int = 200) -> Reply:
    return Reply(status=status, body=compact(obj))


def error_reply(status: int, message: str, type_: str = "BadRequestError", param=None) -> Reply:
    return json_reply({"error": {"message": message, "type": type_, "param": param, "code": status}}, status)


def answer(request: dict, items: list[Item], gap: float = 0.0, **kw) -> Reply:
    """vLLM's reply to `request`: streamed when it asks for a stream, else one JSON body."""
    if request.get("stream"):
        return sse_reply(stream_frames(request, items, **kw), gap)
    return json_reply(body(request, items, **kw))


def model(*turns, gap: float = 0.0):
    """A backend responder that answers each /v1/responses request with the next turn: a list
    of Items, or a callable(request) -> list of Items or a Reply. Past the last turn it
    answers 500, so a test never passes on a turn it did not script."""
    queue = list(turns)

    def respond(received):
        if received.path != "/v1/responses" or not queue:
            return None
        request = received.json()
        turn = queue.pop(0)
        if callable(turn):
            turn = turn(request)
        if isinstance(turn, Reply):
            return turn
        return answer(request, turn, gap)
    return respond
