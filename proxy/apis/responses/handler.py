"""POST /v1/responses (OpenAI's Responses API, Codex): the hosted web_search tool, run by the
proxy as function tools on vLLM's own /v1/responses (a search, and reading a page or finding
text in it, which the client sees as the hosted tool's `open_page` and `find_in_page`
actions); every other Responses request stays on the transparent relay.

Used by proxy.http.app; not run on its own (tests/test_responses.py drives it end to end). This is
the handler and the plain and streamed dialects that proxy.engine.loop drives; the rules they follow
are pure functions in request.py (what vLLM gets first), calls.py (the proxy's own
calls and the next request) and output.py (what the client sees), and the streamed
dialect numbers its events with stream.py; how each tool shows (its action, item and events) is the
presentation table in presentation.py.
"""
from __future__ import annotations

from functools import partial

from flask import Response

from proxy.apis import citations, mend
from proxy.apis.responses.calls import internal_calls, next_request, tool_request
from proxy.apis.responses.given import given
from proxy.apis.responses.output import (
    add_usage,
    client_view,
    failed_response,
    final_response,
    kept_records,
    pending_item,
    row_of,
    visible_output,
    web_search_item,
)
from proxy.apis.responses.request import (
    ResponsesPlan,
    first_request,
    make_plan,
    needs_rewrite,
    refusal,
    survey,
    validate,
)
from proxy.apis.responses.stream import ClientStream, ResponsesTurn
from proxy.core import codec, routes
from proxy.core.errors import error_response
from proxy.engine import loop
from proxy.engine.exchange import Exchange
from proxy.engine.flow import asks_to_stream

PATH = routes.RESPONSES


def handle(ex: Exchange) -> Response:
    try:
        body = ex.json()
    except (ValueError, UnicodeDecodeError):
        return ex.relay()  # not ours to judge: vLLM answers it in its own words
    ex.flow.stream = asks_to_stream(body)  # the relay's queue reads it: the body is not parsed again
    history = survey(body)  # one pass over the input, for the mending, the checks and the rewrite
    mended = mend.responses(body) if history.broken_calls else None  # arguments only: the survey still holds
    body = mended or body
    if not isinstance(body, dict) or not needs_rewrite(body, history):
        return ex.relay(codec.dumps(body)) if mended else ex.relay()
    problem = validate(body, history) or refusal(body)
    if problem:
        return error_response(400, problem[0], param=problem[1])
    plan = make_plan(body, ex.cfg.searxng_results, ex.cfg.inject_web_fetch)
    # What the model read is kept by ws_ id under the key that ran it: another member's ids replay nothing.
    request = first_request(body, plan, lambda id_: ex.services.kept.get(ex.flow.owned(id_)), history)
    if not plan.hosted:
        # History only: the model has no search tool this time, so vLLM's answer is final.
        return ex.relay(codec.dumps(request))
    ex.ledger = ex.new_ledger(partial(given, body))  # gathered at the first fetch or search, if one comes
    dialect = StreamedResponses if body.get("stream") else PlainResponses
    return loop.run(ex, dialect(ex, request, plan))


def vllm_error(status: int, raw: bytes) -> str:
    try:
        message = codec.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:300].decode("utf-8", "replace")
    return f"vLLM answered HTTP {status}: {message}"


# ---- the dialects: the search loop (proxy.engine.loop) as the hosted web_search tool ----------------

class _Responses:
    """What both kinds of Responses request share: the search calls, the searches as the
    client's filters shape them, the next request (the loop's Dialect contract, proxy/engine/loop.py)."""

    path = PATH
    first_turn = None
    headers: list = []

    def __init__(self, ex: Exchange, request: dict, plan: ResponsesPlan):
        self.session = ex.session()
        self.request = request
        self.sources = loop.sources_for(ex)
        self.plan = plan
        self.usage: dict | None = None
        self.kept = ex.services.kept
        self.flow = ex.flow

    def own_calls(self, turn) -> list:
        return internal_calls(turn.output, self.plan)

    def requests(self, calls: list) -> list:
        return [tool_request(c, self.plan) for c in calls]

    def run_tools(self, calls: list, requests: list) -> list:
        """One round: every internal call of the turn (searches and page reads), concurrently."""
        return self.session.run(requests, limit=self.plan.search_limit, language=self.plan.language)

    def follow(self, turn, calls: list, outcomes: list) -> dict:
        """The next request: the turn's items and their outputs appended; the outcomes by call_id."""
        by_call = dict(zip([c.get("call_id") for c in calls], outcomes, strict=True))
        self.request = next_request(self.request, turn.output, self.plan, by_call, self.sources)
        # The client keeps only each call's action: what the model read is kept here for the turns that replay it.
        for key, record in kept_records(calls, self.request["input"]).items():
            self.kept.put(self.flow.owned(key), record)
        return by_call

    def error_reply(self, status, message, type_=None) -> Response:
        return error_response(status, message, type_=type_)

    def vllm_reply(self, up, raw) -> Response:
        return loop.vllm_answer(up, raw)


class _PlainTurn:
    """A whole response object, as a plain turn."""

    def __init__(self, data: dict):
        self.data, self.output = data, data.get("output") or []


class PlainResponses(_Responses):
    """Non-streaming: one response holding every turn's visible items, usage summed."""

    name = "responses"
    stream = False

    def error(self, status, message, type_=None) -> Response:
        return self.error_reply(status, message, type_)

    def announce(self, calls: list):
        return ()

    def __init__(self, ex, request, plan):
        super().__init__(ex, request, plan)
        self.first: dict | None = None           # the first turn's response: its id and created_at are the client's
        self.output: list = []      # the visible items of the turns before the last

    def parse(self, up, raw, data) -> _PlainTurn:
        self.first = self.first or data
        self.usage = add_usage(self.usage, data.get("usage"))
        return _PlainTurn(data)

    def finish(self, turn: _PlainTurn):
        output = citations.cited_items(self.output + list(turn.output), self.sources)
        result = final_response(turn.data, self.first or turn.data, output, self.usage, self.plan)
        yield Response(codec.dumps(result), status=200, mimetype="application/json")

    def record(self, turn: _PlainTurn, calls, outcomes):
        self.output += visible_output(turn.output, self.plan, self.follow(turn, calls, outcomes))
        return ()


class StreamedResponses(_Responses):
    """Streaming: vLLM's events live, the internal function_call held back and replaced by
    web_search_call events, every turn folded into one client stream."""

    name = "responses stream"
    stream = True

    def keepalive(self, requests: list) -> bytes:
        return loop.searching_comment([r.shown for r in requests])

    def __init__(self, ex, request, plan):
        super().__init__(ex, request, plan)
        self.out = ClientStream(lambda response: client_view(response, plan))
        if self.sources is not None:
            self.out.citer = citations.Citer(self.sources, citations.url_citation)
        self.turn: ResponsesTurn | None = None  # the latest turn: a failure shows its response
        self.placed: list = []         # (call, client output_index) of the round's searches

    def stream_turn(self, up):
        turn = self.turn = ResponsesTurn(self.session.rounds == 0)
        yield from self.out.stream_turn(up, turn)
        if turn.error is not None:
            yield self.error(502, turn.error)
            return None
        if turn.response is None:
            yield self.error(502, "vLLM ended the stream early (no response.completed); the answer is incomplete")
            return None
        self.usage = add_usage(self.usage, turn.response.get("usage"))
        turn.output = turn.response.get("output") or []
        self.out.adopt(turn.output)
        return turn

    def finish(self, turn: ResponsesTurn):
        yield from turn.flush(self.out)
        response = turn.response or {}  # relay returns a turn only once its response.completed came
        items = citations.cited_items(list(self.out.items), self.sources, self.out.citer.found if self.out.citer else None)
        final = final_response(response, self.out.first or response, items, self.usage, self.plan)
        yield self.out.emit({"type": "response.completed", "response": final, "sequence_number": 0})

    def announce(self, calls):
        """Each call shown starting (a search or a page read alike, as OpenAI shows page opens): its item, in
        progress, then its row's events (web_search_call's in_progress and searching)."""
        self.placed, shown = [], []
        for call in calls:
            item, row = pending_item(call, self.plan), row_of(call, self.plan)
            index = self.out.new_index(item)
            self.placed.append((call, index))
            shown.append(self.out.emit({"type": "response.output_item.added", "item": item, "output_index": index,
                                        "sequence_number": 0}))
            shown += [self.out.emit({"type": kind, "item_id": item["id"], "output_index": index, "sequence_number": 0})
                      for kind in row.events]
        return shown

    def record(self, turn: ResponsesTurn, calls, outcomes):
        """Each call's result shown: its row's completed event (unless it failed), then its item done."""
        self.follow(turn, calls, outcomes)
        shown = []
        for (call, index), outcome in zip(self.placed, outcomes, strict=True):
            item = self.out.items[index] = web_search_item(call, outcome, self.plan)
            if item["status"] == "completed":
                shown.append(self.out.emit({"type": row_of(call, self.plan).completed, "item_id": item["id"],
                                            "output_index": index, "sequence_number": 0}))
            shown.append(self.out.emit({"type": "response.output_item.done", "item": item, "output_index": index,
                                        "sequence_number": 0}))
        return shown

    def error(self, status, message, type_=None) -> bytes:
        """The stream's end as a failed response with the items the client already saw, or a
        bare error event, as OpenAI sends, when no response was opened to fail."""
        code = type_ or "server_error"
        first = self.out.first
        if first is None:
            return self.out.emit({"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0})
        # ResponseError.code is a closed list in openai 3.57 (no room for the cap's own name): the name rides
        # in the message, so a strict typed client still loads the failed response.
        resp = failed_response((self.turn and self.turn.response) or first, list(self.out.items), self.usage,
                               self.plan, "server_error", message if type_ is None else f"{message} ({type_})")
        resp["id"], resp["created_at"] = first.get("id"), first.get("created_at")
        return self.out.emit({"type": "response.failed", "response": resp, "sequence_number": 0})

    def refused(self, status, raw) -> bytes:
        return self.error(status, vllm_error(status, raw))
