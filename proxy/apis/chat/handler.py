"""POST /v1/chat/completions: inject web_search and web_fetch and run their loop server-side, in
plain responses and inside live streams; everything else goes back to the client untouched.

Used by proxy.http.app; not run on its own (tests/run.sh tests/test_chat_search.py tests/test_chat_stream.py
tests/test_chat_fetch.py drive it end to end). This is the handler and the plain and streamed dialects
that proxy.engine.loop drives; the rules they follow (when to inject, which calls are the proxy's, how turns
and usage add up) are pure functions in proxy/apis/chat/rules.py; which tools chat offers is its
presentation table (proxy/apis/chat/presentation.py).
"""
from __future__ import annotations

import logging
from functools import partial

from flask import Response

from proxy.apis import citations, mend
from proxy.apis.chat.given import given
from proxy.apis.chat.presentation import offered
from proxy.apis.chat.rules import (
    Survey,
    add_usage,
    assistant_turn,
    completion_calls,
    is_proxy_call,
    next_request,
    survey,
    tool_request,
    tool_results,
    tools_to_inject,
    validate,
    with_tools,
)
from proxy.core import codec, routes
from proxy.core.codec import data_of, iter_frame_batches
from proxy.core.errors import error_response, sse_error
from proxy.engine import loop
from proxy.engine.exchange import Exchange, response_headers
from proxy.engine.flow import asks_to_stream

log = logging.getLogger("proxy.chat")

PATH = routes.CHAT


def handle(ex: Exchange) -> Response:
    try:
        body = ex.json()
    except (ValueError, UnicodeDecodeError) as e:
        return error_response(400, f"Request body is not valid JSON: {e}")
    except RecursionError:
        # `[[[[...` a few thousand deep: the client's mistake, not a 500.
        return error_response(400, "Request body is not valid JSON: it is nested too deeply.")
    ex.flow.stream = asks_to_stream(body)  # the relay's queue reads it: the body is not parsed again
    history = survey(body)  # one pass over the messages, for the checks, the mending and the rewrite
    problem = validate(body, history)
    if problem:
        return error_response(400, problem[0], param=problem[1])
    mended = mend.chat(body) if history.broken_calls else None  # arguments only: the survey still holds
    body = mended or body
    ours = tools_to_inject(body, offered(ex.cfg))
    if not ours:
        return ex.relay(codec.dumps(body)) if mended else ex.relay()
    ex.ledger = ex.new_ledger(partial(given, body))  # gathered at the first fetch or search, if one comes
    body = with_tools(body, ours)
    if body.get("stream"):
        if ex.cfg.stream_search == "client":
            return ex.relay(codec.dumps(body))
        return loop.run(ex, StreamedChat(ex, body, ours, history))
    return loop.run(ex, PlainChat(ex, body, ours, history))


class _Chat:
    """What both kinds of chat request share: the calls, the searches and fetches, the next request
    (the loop's Dialect contract, proxy/engine/loop.py)."""

    path = PATH
    first_turn = None
    headers: list = []

    def __init__(self, ex: Exchange, body: dict, ours: tuple[str, ...], history: Survey):
        if history.annotated:  # an earlier answer's, sent back
            body = {**body, "messages": citations.without_annotations(body["messages"])}
        self.session = ex.session()
        self.request = body
        self.sources = loop.sources_for(ex)
        self.body = body
        self.ours = ours  # the proxy's tools in this request: the calls it runs itself
        self.messages = list(body["messages"])
        self.usage: dict | None = None

    def own_calls(self, turn) -> list:
        return [c for c in turn.calls if is_proxy_call(c, self.ours)]


    def requests(self, calls: list) -> list:
        return [tool_request(c) for c in calls]

    def run_tools(self, calls: list, requests: list) -> list:
        return self.session.run(requests)

    def error_reply(self, status, message, type_=None) -> Response:
        return error_response(status, message, type_=type_)

    def vllm_reply(self, up, raw) -> Response:
        return loop.vllm_answer(up, raw)

    def announce(self, calls: list):
        return ()

    def follow(self, message: dict, calls: list, outcomes: list):
        """The next request: the assistant turn, then one tool message per call."""
        self.messages = self.messages + [assistant_turn(message)] + tool_results(calls, outcomes, self.ours, self.sources)
        self.request = next_request(self.body, self.messages)


class _Completion:
    """A whole chat completion, as a plain turn."""

    def __init__(self, up, raw: bytes, data: dict, calls: list):
        self.up, self.raw, self.data, self.calls = up, raw, data, calls


class PlainChat(_Chat):
    """Non-streaming: the client gets vLLM's last completion, usage summed over the turns."""

    name = "chat"
    stream = False

    def error(self, status, message, type_=None) -> Response:
        return self.error_reply(status, message, type_)

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


class _StreamedTurn:
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


class StreamedChat(_Chat):
    """Streaming: each event relayed as it comes, tool-call events held back until the turn
    ends, and when its calls are searches, the search goes on in the same client stream."""

    name = "chat stream"
    stream = True

    def __init__(self, ex: Exchange, body: dict, ours: tuple[str, ...], history: Survey):
        super().__init__(ex, body, ours, history)
        self.ident = self.created = self.model = None  # the first turn's, which every later chunk takes
        self.flow = ex.flow
        given_options = body.get("stream_options")
        options: dict = given_options if isinstance(given_options, dict) else {}
        # A key's tokens per day count streams too: vLLM is asked for the usage chunk the client did not ask for,
        # and the proxy keeps it (the flow's usage_unseen) instead of sending it, so the client's stream is as it asked.
        self.hide_usage = ex.flow.metered and not options.get("include_usage")
        if self.hide_usage:
            self.body = self.request = {**self.request, "stream_options": {**options, "include_usage": True}}
        # The answer's annotations: positions in the content the client gathers over every turn of the stream.
        self.citer = citations.Citer(self.sources, citations.chat_citation) if self.sources is not None else None

    def stream_turn(self, up):
        turn = _StreamedTurn()
        first = self.session.rounds == 0
        for frames in iter_frame_batches(up.iter_raw()):
            out, texts, failed = self._sort_frames(frames, turn, first)
            # What one read brought leaves in one write: a proxy that fell behind a burst
            # catches up in one send, not one per event.
            data = b"".join(out)
            if data:
                yield data
            self._take_text(turn, texts)  # after the yield: the client never waits on it
            if failed:
                break
        if not turn.done:
            yield sse_error(502, "vLLM ended the stream early (no [DONE]); the answer is incomplete")
            return None
        turn.calls = turn.gather_calls() if turn.held else []
        return turn

    def _sort_frames(self, frames, turn: _StreamedTurn, first: bool) -> tuple[list[bytes], list[bytes], bool]:
        """One read's frames sorted: (what goes to the client now, the payloads whose text the
        turn keeps, whether vLLM sent an error); tool-call, finish and usage frames wait on `turn`."""
        out: list[bytes] = []
        texts: list[bytes] = []
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
                turn.done = True
                return out, texts, True
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
        return out, texts, False

    def _take_text(self, turn: _StreamedTurn, texts: list[bytes]):
        """The turn's text and reasoning kept from these payloads, the new text fed to the citer."""
        seen = len(turn.content)
        for payload in texts:
            turn.add_text(payload)
        if self.citer is not None:
            for piece in turn.content[seen:]:
                self.citer.feed("content", piece)

    def restamp(self, payload: bytes | None, usage=None) -> bytes:
        """A later turn's frame as the first turn's; b"" for a frame that carries no data."""
        if payload is None:
            return b""
        return _restamp(payload, self.ident, self.created, usage) or b""

    def finish(self, turn: _StreamedTurn):
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
            if self.hide_usage:
                self.flow.usage_unseen = add_usage(self.usage, codec.loads(data_of(turn.usage_frame) or b"{}")
                                                   .get("usage"))
            elif first:
                yield turn.usage_frame
            else:
                payload = data_of(turn.usage_frame) or b"{}"
                total = add_usage(self.usage, codec.loads(payload).get("usage"))
                yield self.restamp(payload, usage=total)
        yield codec.DONE

    def record(self, turn: _StreamedTurn, calls, outcomes):
        if turn.usage_frame is not None:
            self.usage = add_usage(self.usage, codec.loads(data_of(turn.usage_frame)).get("usage"))
        self.follow(turn.message(), turn.calls, outcomes)
        return ()

    def error(self, status, message, type_=None) -> bytes:
        return sse_error(status, message, type_)

    def keepalive(self, requests: list) -> bytes:
        return loop.searching_comment([r.shown for r in requests])

    def refused(self, status, raw) -> bytes:
        if status == 200:
            return sse_error(502, "vLLM answered a streamed turn without an event stream")
        return b"data: " + raw.strip() + b"\n\n" + codec.DONE  # vLLM's own error, as it wrote it
