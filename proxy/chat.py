"""POST /v1/chat/completions: inject web_search, run the search loop server-side, in plain
responses and inside live streams, and hand everything else back to the client untouched.

Used by proxy.app; not run on its own. The rules (when to inject, which calls are searches,
how turns and usage add up) are pure functions at the top, tested without a network.
"""
from __future__ import annotations

import logging

from flask import Response

from . import jsonio
from .background import run_with_keepalive
from .errors import error_response, sse_error, upstream_error_status
from .exchange import ClientWatch, Exchange, ask, encode_json, response_headers, start_stream
from .search import NOT_EXECUTED, QUERY_SCHEMA, TOOL_DESCRIPTION, format_for_model, parse_arguments
from .sse import comment, data_of, iter_frame_batches
from .upstream import UpstreamError

log = logging.getLogger("proxy.chat")

PATH = "/v1/chat/completions"
WEB_SEARCH = "web_search"
WEB_SEARCH_TOOL = {"type": "function",
                   "function": {"name": WEB_SEARCH, "description": TOOL_DESCRIPTION, "parameters": QUERY_SCHEMA}}


# ---- pure rules ---------------------------------------------------------------------------

def validate(body) -> tuple[str, str | None] | None:
    """(message, param) when the body is not a chat request vLLM could take, else None."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object.", None
    if not isinstance(body.get("messages"), list):
        return "`messages` must be an array of message objects.", "messages"
    if not all(isinstance(m, dict) for m in body["messages"]):
        return "Every entry of `messages` must be an object.", "messages"
    if "tools" in body and body["tools"] is not None:
        if not isinstance(body["tools"], list) or not all(isinstance(t, dict) for t in body["tools"]):
            return "`tools` must be an array of tool objects.", "tools"
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        return "`stream` must be true or false.", "stream"
    if "stream_options" in body and body["stream_options"] is not None and not isinstance(body["stream_options"], dict):
        return "`stream_options` must be an object.", "stream_options"
    if "tool_choice" in body and not isinstance(body["tool_choice"], (str, dict, type(None))):
        return "`tool_choice` must be a string or an object.", "tool_choice"
    return None


def tool_name(tool: dict) -> str | None:
    fn = tool.get("function")
    return fn.get("name") if isinstance(fn, dict) else tool.get("name")


def should_inject(body: dict, enabled: bool) -> bool:
    """Inject web_search unless that would change what the client asked for. Pure.

    Not when switched off, when the client forbids tools (tool_choice "none"), when the
    client has its own web_search (its calls are its own), or when it asks for several
    choices (a loop can only follow one).
    """
    if not enabled or body.get("tool_choice") == "none":
        return False
    if (body.get("n") or 1) != 1:
        return False
    return not any(tool_name(t) == WEB_SEARCH for t in body.get("tools") or [])


def with_web_search(body: dict) -> dict:
    """A copy of the request with the web_search tool added; every other field as it was."""
    return {**body, "tools": list(body.get("tools") or []) + [WEB_SEARCH_TOOL]}


def forces_web_search(tool_choice) -> bool:
    return (isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict)
            and tool_choice["function"].get("name") == WEB_SEARCH)


def is_search(call: dict) -> bool:
    return (call.get("function") or {}).get("name") == WEB_SEARCH


def add_usage(total: dict | None, turn: dict | None) -> dict | None:
    """Sum two usage objects: token counts add, reasoning tokens add, the rest is the latest."""
    if not turn:
        return total
    if not total:
        return jsonio.loads(jsonio.dumps(turn))
    out = dict(turn)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        out[key] = (total.get(key) or 0) + (turn.get(key) or 0)
    a = (total.get("completion_tokens_details") or {}).get("reasoning_tokens")
    b = (turn.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if a is not None or b is not None:
        out["completion_tokens_details"] = {**(turn.get("completion_tokens_details") or {}),
                                            "reasoning_tokens": (a or 0) + (b or 0)}
    return out


def assistant_turn(message: dict) -> dict:
    """The assistant message to append, as vLLM wrote it: reasoning stays so the chat
    template decides what the model sees again; the response-only null fields go."""
    out = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": c.get("id"), "type": "function",
                              "function": {"name": (c.get("function") or {}).get("name"),
                                           "arguments": (c.get("function") or {}).get("arguments") or ""}}
                             for c in message["tool_calls"]]
    for key in ("reasoning", "reasoning_content"):
        if message.get(key):
            out[key] = message[key]
    return out


def tool_results(calls: list[dict], outcomes: list) -> list[dict]:
    """One tool message per call, in order: search results, or the not-executed stub."""
    found = iter(outcomes)
    return [{"role": "tool", "tool_call_id": c.get("id"),
             "content": format_for_model(next(found)) if is_search(c) else NOT_EXECUTED}
            for c in calls]


def next_request(body: dict, messages: list[dict]) -> dict:
    """The following turn: same request, longer history; a forced web_search is forced once."""
    out = {**body, "messages": messages}
    if forces_web_search(body.get("tool_choice")):
        out["tool_choice"] = "auto"
    return out


# ---- the handler --------------------------------------------------------------------------

def handle(ex: Exchange) -> Response:
    try:
        body = jsonio.loads(ex.body)
    except (ValueError, UnicodeDecodeError) as e:
        return error_response(400, f"Request body is not valid JSON: {e}")
    except RecursionError:
        # `[[[[...` a few thousand deep: the client's mistake, not a 500.
        return error_response(400, "Request body is not valid JSON: it is nested too deeply.")
    problem = validate(body)
    if problem:
        return error_response(400, problem[0], param=problem[1])
    if not should_inject(body, ex.cfg.inject_web_search):
        return ex.relay()
    body = with_web_search(body)
    if body.get("stream"):
        if ex.cfg.stream_search == "client":
            return ex.relay(encode_json(body))
        return stream_loop(ex, body)
    return plain_loop(ex, body)


def plain_loop(ex: Exchange, body: dict) -> Response:
    """Non-streaming: ask, search, append, ask again, until the model answers."""
    session = ex.session()
    ex.watch = ClientWatch(ex.environ)
    messages = list(body["messages"])
    usage = None
    request = body
    try:
        while True:
            turn = ask(ex, PATH, request, f"chat turn {session.rounds + 1}")
            if isinstance(turn, Response):
                return turn
            up, raw, data = turn
            calls = completion_calls(data)
            if calls is None:
                # A 200 that is not a chat completion (a truncated or foreign body) is vLLM's
                # fault, so it is a gateway error, not a 500 from the proxy.
                log.warning("chat turn %d: vLLM answered 200 with a body that is not a chat completion", session.rounds + 1)
                return error_response(502, "vLLM answered 200 with a body that is not a chat completion.")
            choice = data["choices"][0] if data.get("choices") else {}
            if not any(is_search(c) for c in calls):
                if session.rounds == 0:
                    return Response(raw, status=200, headers=response_headers(up))  # untouched
                data["usage"] = add_usage(usage, data.get("usage"))
                return Response(jsonio.dumps(data), status=200, mimetype="application/json")
            usage = add_usage(usage, data.get("usage"))
            if session.exhausted:
                return error_response(422, session.cap_message(), type_="search_iterations_exceeded")
            outcomes = session.run([parse_arguments((c.get("function") or {}).get("arguments")) for c in calls if is_search(c)])
            messages = messages + [assistant_turn(choice["message"])] + tool_results(calls, outcomes)
            request = next_request(body, messages)
    finally:
        ex.watch.stop()


def completion_calls(data: dict) -> list | None:
    """The tool calls of a chat completion's first choice, or None when it isn't one. Pure."""
    try:
        choice = (data.get("choices") or [{}])[0]
        calls = (choice.get("message") or {}).get("tool_calls") or []
    except (AttributeError, TypeError, IndexError, KeyError):
        return None
    return calls if isinstance(calls, list) and all(isinstance(c, dict) for c in calls) else None


def stream_loop(ex: Exchange, body: dict) -> Response:
    """Streaming: relay each event as it comes, hold back tool-call events until the turn
    ends, and when its calls are searches, search and go on in the same client stream."""
    first, answer = start_stream(ex, PATH, body)
    if answer is not None:
        return answer
    return Response(_stream_events(ex, body, first), status=200, headers=response_headers(first),
                    direct_passthrough=True)


class _Turn:
    """What one streamed backend turn said, gathered as its events pass."""

    def __init__(self):
        self.content: list[str] = []    # the turn's text, kept only as text: a long answer's
        self.reasoning: list[str] = []  # events would be several times its size in memory
        self.held = []            # tool-call and finish events, kept until the turn's end
        self.usage_frame = None
        self.done = False

    def calls(self) -> list[dict]:
        calls: dict[int, dict] = {}
        for frame in self.held:
            chunk = jsonio.loads(data_of(frame))
            for choice in chunk.get("choices") or []:
                for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                    c = calls.setdefault(tc.get("index", 0), {"id": None, "type": "function",
                                                              "function": {"name": None, "arguments": ""}})
                    if tc.get("id"):
                        c["id"] = tc["id"]
                    fn = tc.get("function") or {}
                    if fn.get("name"):
                        c["function"]["name"] = fn["name"]
                    c["function"]["arguments"] += fn.get("arguments") or ""
        return [calls[i] for i in sorted(calls)]

    def add_text(self, payload: bytes):
        for choice in jsonio.loads(payload).get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            r = delta.get("reasoning") or delta.get("reasoning_content")
            if r:
                self.reasoning.append(r)

    def message(self, calls) -> dict:
        return assistant_turn({"content": "".join(self.content) or None, "tool_calls": calls,
                               "reasoning": "".join(self.reasoning) or None})


def _restamp(payload: bytes, ident, created, usage=None) -> bytes | None:
    """A later turn's chunk as part of the first turn's completion: its id and created, no
    second role announcement. Touching the bytes is needed only here, after a search."""
    chunk = jsonio.loads(payload)
    chunk["id"], chunk["created"] = ident, created
    if usage is not None:
        chunk["usage"] = usage
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if "role" in delta:
            delta.pop("role")
            if delta in ({}, {"content": ""}) and choice.get("finish_reason") is None:
                return None
    return b"data: " + jsonio.dumps(chunk) + b"\n\n"


def _stream_events(ex: Exchange, body: dict, up):
    session = ex.session()
    messages = list(body["messages"])
    usage = None
    ident = created = None
    turn_no = 1
    try:
        while True:
            turn = _Turn()
            try:
                for frames in iter_frame_batches(up.iter_raw()):
                    out, texts, failed = [], [], False
                    for frame in frames:
                        payload = data_of(frame)
                        if payload is None or not payload.startswith(b"{"):
                            if payload == b"[DONE]":
                                # Read on to the end of the body (it ends right here) so this
                                # connection goes back to the pool instead of being dropped.
                                turn.done = True
                            else:
                                out.append(frame)  # comments and anything unknown pass as they are
                            continue
                        if ident is None:
                            head = jsonio.loads(payload)
                            ident, created = head.get("id"), head.get("created")
                        if payload.startswith(b'{"error"'):
                            out.append(frame)
                            turn.done = failed = True
                            break
                        # Cheap substring tests keep the common event (a token) off the JSON parser.
                        if b'"tool_calls"' in payload:
                            turn.held.append(frame)
                        elif b'"choices":[]' in payload and b'"usage"' in payload:
                            turn.usage_frame = frame
                        else:
                            out.append(frame if turn_no == 1 else _restamp(payload, ident, created) or b"")
                            texts.append(payload)
                    # What one read brought leaves in one write: a proxy that fell behind a burst
                    # catches up in one send, not one per event.
                    data = b"".join(out)
                    if data:
                        yield data
                    for payload in texts:
                        turn.add_text(payload)  # after the yield: the client never waits on it
                    if failed:
                        break
            except UpstreamError as e:
                if ex.watch.gone:
                    return
                status, msg = upstream_error_status(e)
                log.warning("chat stream turn %d: %s", turn_no, msg)
                yield sse_error(status, msg)
                return
            if not turn.done:
                yield sse_error(502, "vLLM ended the stream early (no [DONE]); the answer is incomplete")
                return

            calls = turn.calls() if turn.held else []
            if not any(is_search(c) for c in calls):
                for frame in turn.held:
                    yield frame if turn_no == 1 else _restamp(data_of(frame), ident, created) or b""
                if turn.usage_frame is not None:
                    if turn_no == 1:
                        yield turn.usage_frame
                    else:
                        total = add_usage(usage, jsonio.loads(data_of(turn.usage_frame)).get("usage"))
                        yield _restamp(data_of(turn.usage_frame), ident, created, usage=total)
                yield b"data: [DONE]\n\n"
                return

            if turn.usage_frame is not None:
                usage = add_usage(usage, jsonio.loads(data_of(turn.usage_frame)).get("usage"))
            if session.exhausted:
                yield sse_error(422, session.cap_message(), "search_iterations_exceeded")
                return
            queries = [parse_arguments(c["function"]["arguments"]) for c in calls if is_search(c)]
            label = ", ".join(repr(q) for q, _ in queries if q)
            outcomes = yield from run_with_keepalive(
                lambda: session.run(queries), ex.cfg.keepalive_interval,
                comment(f"searching {label}"), should_stop=lambda: ex.watch.gone)
            if ex.watch.gone or outcomes is None:
                return
            messages = messages + [turn.message(calls)] + tool_results(calls, outcomes)
            try:
                up = ex.post(PATH, next_request(body, messages))
                if up.status != 200:
                    raw = up.read()
                    yield b"data: " + raw.strip() + b"\n\ndata: [DONE]\n\n"
                    return
            except UpstreamError as e:
                if ex.watch.gone:
                    return
                status, msg = upstream_error_status(e)
                yield sse_error(status, msg)
                return
            turn_no += 1
    finally:
        ex.watch.stop()
        up.abort()
