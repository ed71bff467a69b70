"""POST /v1/chat/completions: inject web_search and web_fetch and run their loop server-side, in
plain responses and inside live streams; everything else goes back to the client untouched.

Used by proxy.app; not run on its own. The rules (when to inject, which calls are searches,
how turns and usage add up) are pure functions at the top, tested without a network; below
them, the chat dialects that proxy.loop drives.
"""
from __future__ import annotations

import logging

from flask import Response

from . import citations, codec, loop
from . import validate as V
from .codec import data_of, iter_frame_batches
from .errors import error_response, sse_error
from .exchange import Exchange, response_headers
from .fetch_wire import FETCH_TOOL_DESCRIPTION, URL_SCHEMA, FetchRequest, parse_fetch_arguments
from .search import NOT_EXECUTED, QUERY_SCHEMA, TOOL_DESCRIPTION, parse_arguments
from .tools import tool_text

log = logging.getLogger("proxy.chat")

PATH = "/v1/chat/completions"
WEB_SEARCH = "web_search"
WEB_SEARCH_TOOL = {"type": "function",
                   "function": {"name": WEB_SEARCH, "description": TOOL_DESCRIPTION, "parameters": QUERY_SCHEMA}}
WEB_FETCH = "web_fetch"
WEB_FETCH_TOOL = {"type": "function",
                  "function": {"name": WEB_FETCH, "description": FETCH_TOOL_DESCRIPTION, "parameters": URL_SCHEMA}}
PROXY_TOOLS = {WEB_SEARCH: WEB_SEARCH_TOOL, WEB_FETCH: WEB_FETCH_TOOL}  # in the order they are added


# ---- pure rules ---------------------------------------------------------------------------

def validate(body) -> tuple[str, str | None] | None:
    """(message, param) when the body is not a chat request vLLM could take, or has a field the
    proxy reads of the wrong JSON type; else None."""
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
    try:
        # The names the proxy compares with its own tools' (tool_name, forced_tool).
        for i, tool in enumerate(body.get("tools") or []):
            V.string(tool.get("name"), f"tools[{i}].name")
            V.string(V.obj(tool.get("function"), f"tools[{i}].function").get("name"), f"tools[{i}].function.name")
        if isinstance(body.get("tool_choice"), dict):
            choice = V.obj(body["tool_choice"].get("function"), "tool_choice.function")
            V.string(choice.get("name"), "tool_choice.function.name")
    except V.Invalid as e:
        return e.openai_message, e.param
    return None


def tool_name(tool: dict) -> str | None:
    fn = tool.get("function")
    return fn.get("name") if isinstance(fn, dict) else tool.get("name")


def tools_to_inject(body: dict, search: bool = True, fetch: bool = True) -> tuple[str, ...]:
    """The names of the proxy's tools this request gets (web_search, web_fetch), none when adding
    one would change what the client asked for. Pure.

    None when the client forbids tools (tool_choice "none") or asks for several choices (a loop
    can only follow one); each tool unless it is switched off (INJECT_WEB_SEARCH,
    INJECT_WEB_FETCH) or the client has a tool of that name (its calls are its own).
    """
    if body.get("tool_choice") == "none" or (body.get("n") or 1) != 1:
        return ()
    theirs = {tool_name(t) for t in body.get("tools") or []}
    wanted = ((WEB_SEARCH, search), (WEB_FETCH, fetch))
    return tuple(name for name, on in wanted if on and name not in theirs)


def should_inject(body: dict, enabled: bool) -> bool:
    """web_search alone: whether tools_to_inject would add it."""
    return WEB_SEARCH in tools_to_inject(body, search=enabled, fetch=False)


def with_tools(body: dict, names) -> dict:
    """A copy of the request with the proxy's named tools added; every other field as it was."""
    return {**body, "tools": list(body.get("tools") or []) + [PROXY_TOOLS[n] for n in names]}


def with_web_search(body: dict) -> dict:
    return with_tools(body, (WEB_SEARCH,))


def forced_tool(tool_choice) -> str | None:
    """The function a tool_choice forces, if it forces one."""
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        return tool_choice["function"].get("name")
    return None


def forces_web_search(tool_choice) -> bool:
    return forced_tool(tool_choice) in PROXY_TOOLS


def call_name(call: dict):
    return (call.get("function") or {}).get("name")


def is_search(call: dict, ours=(WEB_SEARCH,)) -> bool:
    """Whether the proxy runs this call: one of its injected tools (web_search by default)."""
    return call_name(call) in ours


def tool_request(call: dict):
    """A call of the proxy's as the search session runs it: a query, or a fetch request."""
    arguments = (call.get("function") or {}).get("arguments")
    return parse_fetch_arguments(arguments) if call_name(call) == WEB_FETCH else parse_arguments(arguments)


def add_usage(total: dict | None, turn: dict | None) -> dict | None:
    """Sum two usage objects: token counts add, reasoning tokens add, the rest is the latest."""
    if not turn:
        return total
    if not total:
        return codec.loads(codec.dumps(turn))
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


def tool_results(calls: list[dict], outcomes: list, ours=tuple(PROXY_TOOLS),
                 sources: citations.Sources | None = None) -> list[dict]:
    """One tool message per call, in order: the proxy's results (of the calls named in `ours`,
    in `outcomes`' order, their sources numbered for citing), or the not-executed stub."""
    found = iter(outcomes)
    return [{"role": "tool", "tool_call_id": c.get("id"),
             "content": citations.numbered(sources, o := next(found), tool_text(o)) if is_search(c, ours)
             else NOT_EXECUTED}
            for c in calls]


def next_request(body: dict, messages: list[dict]) -> dict:
    """The following turn: same request, longer history; a forced web_search is forced once."""
    out = {**body, "messages": messages}
    if forces_web_search(body.get("tool_choice")):
        out["tool_choice"] = "auto"
    return out


def completion_calls(data: dict) -> list | None:
    """The tool calls of a chat completion's first choice, or None when it isn't one. Pure."""
    try:
        choice = (data.get("choices") or [{}])[0]
        calls = (choice.get("message") or {}).get("tool_calls") or []
    except (AttributeError, TypeError, IndexError, KeyError):
        return None
    return calls if isinstance(calls, list) and all(isinstance(c, dict) for c in calls) else None


# ---- the handler, and the search loop (proxy.loop) as chat completions speak it -----------

def handle(ex: Exchange) -> Response:
    try:
        body = codec.loads(ex.body)
    except (ValueError, UnicodeDecodeError) as e:
        return error_response(400, f"Request body is not valid JSON: {e}")
    except RecursionError:
        # `[[[[...` a few thousand deep: the client's mistake, not a 500.
        return error_response(400, "Request body is not valid JSON: it is nested too deeply.")
    problem = validate(body)
    if problem:
        return error_response(400, problem[0], param=problem[1])
    ours = tools_to_inject(body, ex.cfg.inject_web_search, ex.cfg.inject_web_fetch)
    if not ours:
        return ex.relay()
    body = with_tools(body, ours)
    if body.get("stream"):
        if ex.cfg.stream_search == "client":
            return ex.relay(codec.dumps(body))
        return loop.run(ex, StreamedChat(ex, body, ours))
    return loop.run(ex, PlainChat(ex, body, ours))


class _Chat(loop.Dialect):
    """What both kinds of chat request share: the calls, the searches and fetches, the next request."""

    path = PATH

    def __init__(self, ex: Exchange, body: dict, ours: tuple[str, ...] = (WEB_SEARCH,)):
        body = {**body, "messages": citations.without_annotations(body["messages"])}  # an earlier answer's, sent back
        super().__init__(ex, body)
        self.body = body
        self.ours = ours  # the proxy's tools in this request: the calls it runs itself
        self.messages = list(body["messages"])
        self.usage: dict | None = None

    def searches(self, turn) -> list:
        return [c for c in turn.calls if is_search(c, self.ours)]

    def queries(self, calls: list) -> list:
        return [(r.url, None) if isinstance(r, FetchRequest) else r for r in map(tool_request, calls)]

    def search(self, calls: list) -> list:
        return self.session.run([tool_request(c) for c in calls])

    def error_reply(self, status, message, type_=None) -> Response:
        return error_response(status, message, type_=type_)

    def follow(self, message: dict, calls: list, outcomes: list):
        """The next request: the assistant turn, then one tool message per call."""
        self.messages = self.messages + [assistant_turn(message)] + tool_results(calls, outcomes, self.ours, self.sources)
        self.request = next_request(self.body, self.messages)


class _Completion:
    """A whole chat completion, as a plain turn."""

    def __init__(self, up, raw: bytes, data: dict, calls: list):
        self.up, self.raw, self.data, self.calls = up, raw, data, calls


class PlainChat(loop.Plain, _Chat):
    """Non-streaming: the client gets vLLM's last completion, usage summed over the turns."""

    name = "chat"

    def parse(self, up, raw, data):
        calls = completion_calls(data)
        if calls is None:
            # A 200 that is not a chat completion (a truncated or foreign body) is vLLM's
            # fault, so it is a gateway error, not a 500 from the proxy.
            log.warning("chat turn %d: vLLM answered 200 with a body that is not a chat completion",
                        self.session.rounds + 1)
            return self.error(502, "vLLM answered 200 with a body that is not a chat completion.")
        return _Completion(up, raw, data, calls)

    def finish(self, turn: _Completion):
        if self.session.rounds == 0:
            yield Response(turn.raw, status=200, headers=response_headers(turn.up))  # untouched
            return
        turn.data["usage"] = add_usage(self.usage, turn.data.get("usage"))
        message = (turn.data["choices"][0].get("message") or {}) if turn.data.get("choices") else {}
        found = citations.cite_text(message.get("content") or "", self.sources, citations.chat_citation)
        if found:  # vLLM writes "annotations": null
            message["annotations"] = list(message.get("annotations") or []) + found
        yield Response(codec.dumps(turn.data), status=200, mimetype="application/json")

    def record(self, turn: _Completion, calls, outcomes):
        self.usage = add_usage(self.usage, turn.data.get("usage"))
        self.follow(turn.data["choices"][0]["message"], turn.calls, outcomes)
        return ()


class _Turn:
    """What one streamed backend turn said, gathered as its events pass."""

    def __init__(self):
        self.content: list[str] = []    # the turn's text, kept only as text: a long answer's
        self.reasoning: list[str] = []  # events would be several times its size in memory
        self.held = []            # tool-call and finish events, kept until the turn's end
        self.usage_frame = None
        self.done = False
        self.calls: list[dict] = []  # once the turn has ended

    def gather_calls(self) -> list[dict]:
        calls: dict[int, dict] = {}
        for frame in self.held:
            chunk = codec.loads(data_of(frame))
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
        for choice in codec.loads(payload).get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            r = delta.get("reasoning") or delta.get("reasoning_content")
            if r:
                self.reasoning.append(r)

    def message(self) -> dict:
        return {"content": "".join(self.content) or None, "tool_calls": self.calls,
                "reasoning": "".join(self.reasoning) or None}


def _restamp(payload: bytes, ident, created, usage=None) -> bytes | None:
    """A later turn's chunk as part of the first turn's completion: its id and created, no
    second role announcement. Touching the bytes is needed only here, after a search."""
    chunk = codec.loads(payload)
    chunk["id"], chunk["created"] = ident, created
    if usage is not None:
        chunk["usage"] = usage
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if "role" in delta:
            delta.pop("role")
            if delta in ({}, {"content": ""}) and choice.get("finish_reason") is None:
                return None
    return codec.data(chunk)


class StreamedChat(loop.Stream, _Chat):
    """Streaming: each event relayed as it comes, tool-call events held back until the turn
    ends, and when its calls are searches, the search goes on in the same client stream."""

    name = "chat stream"

    def __init__(self, ex: Exchange, body: dict, ours: tuple[str, ...] = (WEB_SEARCH,)):
        super().__init__(ex, body, ours)
        self.ident = self.created = self.model = None  # the first turn's, which every later chunk takes
        # The answer's annotations: positions in the content the client gathers over every turn of the stream.
        self.citer = citations.Citer(self.sources, citations.chat_citation) if self.sources is not None else None

    def relay(self, up):
        turn = _Turn()
        first = self.session.rounds == 0
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
                if self.ident is None:
                    head = codec.loads(payload)
                    self.ident, self.created, self.model = head.get("id"), head.get("created"), head.get("model")
                if payload.startswith(b'{"error"'):
                    out.append(frame)
                    turn.done = failed = True
                    break
                # Cheap substring tests keep the common event (a token) off the JSON parser.
                if b'"tool_calls"' in payload:
                    turn.held.append(frame)
                elif self.citer is not None and self.sources and self.sources.by_n and b'"finish_reason":"' in payload:
                    # After a search, the answer's finish chunk waits: the annotations chunk goes before it.
                    turn.held.append(frame)
                    texts.append(payload)
                elif b'"choices":[]' in payload and b'"usage"' in payload:
                    turn.usage_frame = frame
                else:
                    out.append(frame if first else self.restamp(payload) or b"")
                    texts.append(payload)
            # What one read brought leaves in one write: a proxy that fell behind a burst
            # catches up in one send, not one per event.
            data = b"".join(out)
            if data:
                yield data
            seen = len(turn.content)
            for payload in texts:
                turn.add_text(payload)  # after the yield: the client never waits on it
            if self.citer is not None:
                for piece in turn.content[seen:]:
                    self.citer.feed("content", piece)
            if failed:
                break
        if not turn.done:
            yield sse_error(502, "vLLM ended the stream early (no [DONE]); the answer is incomplete")
            return None
        turn.calls = turn.gather_calls() if turn.held else []
        return turn

    def restamp(self, payload: bytes | None, usage=None) -> bytes:
        """A later turn's frame as the first turn's; b"" for a frame that carries no data."""
        if payload is None:
            return b""
        return _restamp(payload, self.ident, self.created, usage) or b""

    def finish(self, turn: _Turn):
        first = self.session.rounds == 0
        found = self.citer.of("content") if self.citer is not None else []
        if found:
            # The stream's annotations, all in one chunk's delta just before the finish chunk: the SDK's
            # accumulator puts a delta's `annotations` on the message, as message.annotations in a plain answer.
            chunk = {"id": self.ident, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                     "choices": [{"index": 0, "delta": {"annotations": found}, "logprobs": None, "finish_reason": None}]}
            yield codec.data(chunk)
        for frame in turn.held:
            yield frame if first else self.restamp(data_of(frame))
        if turn.usage_frame is not None:
            if first:
                yield turn.usage_frame
            else:
                payload = data_of(turn.usage_frame) or b"{}"
                total = add_usage(self.usage, codec.loads(payload).get("usage"))
                yield self.restamp(payload, usage=total)
        yield codec.DONE

    def record(self, turn: _Turn, calls, outcomes):
        if turn.usage_frame is not None:
            self.usage = add_usage(self.usage, codec.loads(data_of(turn.usage_frame)).get("usage"))
        self.follow(turn.message(), turn.calls, outcomes)
        return ()

    def error(self, status, message, type_=None) -> bytes:
        return sse_error(status, message, type_)

    def refused(self, status, raw) -> bytes:
        if status == 200:
            return sse_error(502, "vLLM answered a streamed turn without an event stream")
        return b"data: " + raw.strip() + b"\n\n" + codec.DONE  # vLLM's own error, as it wrote it
