"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's API, Claude Code): the proxy
plays Anthropic's `web_search` and `web_fetch` server tools on top of vLLM's own Messages route,
on the shared search and fetch cores; everything without server tools or server blocks is
relayed byte for byte.

The handler and the two dialects proxy.engine.loop drives, used by proxy.http.app (tests: tests/run.sh
tests/test_messages.py tests/test_messages_fetch.py). The rules are pure functions elsewhere:
which requests and the rewrite in proxy/apis/messages/request.py, replayed history in
proxy/apis/messages/history.py, the blocks the client sees and usage in proxy/apis/messages/blocks.py;
the streamed dialect writes its events with proxy/apis/messages/stream.py.
"""
from __future__ import annotations

from functools import partial

from flask import Response

from proxy.apis import citations, mend
from proxy.apis.messages.blocks import add_usage, client_id, kept_text, server_use_block, turn_calls
from proxy.apis.messages.given import given_parts
from proxy.apis.messages.presentation import SERVER_TOOLS, model_text, result_block, tool_results, with_counts
from proxy.apis.messages.request import (
    MessagesPlan,
    needs_rewrite,
    next_request,
    rewrite,
    served_model_for,
    shortcut_turn,
    subrequest,
    survey,
    tool_request,
    validate,
)
from proxy.apis.messages.stream import SSE_HEADERS, ClientMessage, error_event
from proxy.apis.messages.wire import PING, anthropic_error, as_anthropic_error
from proxy.core import codec
from proxy.core.codec import as_dict
from proxy.engine import loop
from proxy.engine.exchange import Exchange, UpstreamError, gateway_status, response_headers
from proxy.engine.flow import asks_to_stream
from proxy.tools import registry
from proxy.tools.base import Outcome, Request


def handle(ex: Exchange) -> Response:
    try:
        body = ex.json()
    except (ValueError, UnicodeDecodeError):
        return ex.relay()  # not ours to judge: vLLM says what is wrong, as it always did
    ex.flow.stream = asks_to_stream(body)  # the relay's queue reads it: the body is not parsed again
    renamed = False
    if ex.cfg.anthropic_any_model and isinstance(body, dict):
        model = served_model_for(body.get("model"), ex.services.models.get(lambda: _models(ex)))
        if model:
            body["model"], renamed = model, True
    history = survey(body)  # one pass over the blocks, for the mending, the checks and the rewrite
    mended = mend.messages(body) if isinstance(body, dict) and history.broken_input else None
    body = mended or body
    if not needs_rewrite(body, history):
        return ex.relay(codec.dumps(body)) if renamed or mended else ex.relay()
    problem = validate(body, history)
    if problem:
        return anthropic_error(400, problem)
    vbody, plan = rewrite(body, ex.cfg.citations, ex.services.kept.get, history)
    ex.ledger = ex.new_ledger(partial(given_parts, body))  # gathered at the first fetch or search, if one comes
    if ex.target.split("?", 1)[0].rstrip("/").endswith("/count_tokens"):
        return count_tokens(ex, vbody)
    # Claude Code's search sub-request names its query; searching it directly saves the model
    # turn that would only copy it into a tool call (measured: see tests/test_claude_code.py).
    sub = subrequest(body)
    first = _Blocks(shortcut_turn(sub, plan)) if sub is not None else None
    dialect = StreamedMessages if body.get("stream") else PlainMessages
    return loop.run(ex, dialect(ex, vbody, plan, first))


def _models(ex: Exchange) -> tuple[int, bytes]:
    """vLLM's GET /v1/models, asked with this client's credentials: (status, body)."""
    headers = [(n, v) for n, v in ex.headers if n.lower() in ("authorization", "x-api-key")]
    call = ex.call("GET", "/v1/models", None, headers)
    raw = call.read()
    return call.response.status, raw


def count_tokens(ex: Exchange, vbody: dict) -> Response:
    watch = ex.watch_client()
    try:
        call = ex.post(ex.target, vbody)
        raw = call.read()
    except UpstreamError as e:
        status, msg = gateway_status(e)
        return anthropic_error(status, msg)
    finally:
        watch.stop()
    return vllm_reply(call.response, raw)


def vllm_reply(up, raw: bytes) -> Response:
    """vLLM's answer as the client's: its errors in Anthropic's shape, anything else as sent."""
    if up.status != 200:
        return Response(as_anthropic_error(up.status, raw), status=up.status, mimetype="application/json")
    return Response(raw, status=200, headers=response_headers(up))


# ---- the dialects: the search loop (proxy.engine.loop) as Anthropic's server tool ------------------

class _Blocks:
    """One turn's content blocks (and for a plain turn, vLLM's answer they came from)."""

    def __init__(self, blocks: list[dict], up=None, raw: bytes = b"", data: dict | None = None):
        self.blocks, self.up, self.raw, self.data = blocks, up, raw, data


class _Messages:
    """What both kinds of Messages request share: the server tools' calls (max_uses, domain filters, the counts in
    usage.server_tool_use), their blocks, the next request (the loop's Dialect contract, proxy/engine/loop.py). How
    each tool shows is its row in presentation.SERVER_TOOLS; nothing here tells one tool from another."""

    headers: list = []

    def __init__(self, ex: Exchange, body: dict, plan: MessagesPlan, first: _Blocks | None):
        self.session = ex.session()
        self.request = body
        self.sources = loop.sources_for(ex)
        self.path = ex.target  # the client's own path and query (Claude Code's `?beta=true`)
        self.body, self.plan, self.first_turn = body, plan, first
        self.messages = list(body["messages"])
        self.kept = ex.services.kept
        self.limit = ex.cfg.searxng_results
        self.used: dict[str, int] = {}    # calls asked for, per vLLM-side name, against its max_uses
        self.counts: dict[str, int] = {}  # results that count in usage.server_tool_use, by its key
        self.usage: dict | None = None
        self.uses: list[dict] = []  # the server_tool_use blocks of the round under way

    def own_calls(self, turn: _Blocks) -> list:
        # Only the server tools in `tools`: with only replayed history rewritten, the model has none.
        ours = self.plan.ours()
        return [b for b in turn.blocks if b.get("type") == "tool_use" and b.get("name") in ours]

    def requests(self, calls: list) -> list[Request]:
        return [tool_request(c, self.plan) for c in calls]

    def run_tools(self, calls: list, requests: list[Request]) -> list:
        """One round: the calls within max_uses run together on the session (one round of MAX_SEARCH_ITER, even
        when every call is over max_uses); outcomes in call order."""
        out: list = [self.over_max_uses(c, r) for c, r in zip(calls, requests, strict=True)]
        at = [i for i, o in enumerate(out) if o is None]
        for i, o in zip(at, self.session.run([requests[i] for i in at], limit=self.limit), strict=True):
            out[i] = o
        return out

    def over_max_uses(self, call: dict, request: Request) -> Outcome | None:
        """The max_uses_exceeded outcome of a call past its server tool's max_uses (counting it), or None."""
        tp = self.plan.offered[str(call.get("name"))]
        self.used[tp.name] = used = self.used.get(tp.name, 0) + 1
        if tp.max_uses is None or used <= tp.max_uses:
            return None
        return registry.tool(tp.tool).failure(request, "max_uses_exceeded",
                                              SERVER_TOOLS[tp.tool].used_up.format(limit=tp.max_uses))

    def announce(self, calls: list):
        self.uses = [server_use_block(c, self.plan.offered[str(c.get("name"))].tool) for c in calls]
        return ()

    def results(self, outcomes: list) -> list[dict]:
        """The result blocks (web_search_tool_result, web_fetch_tool_result, ...) answering this round's
        server_tool_use blocks."""
        results = []
        for use, outcome in zip(self.uses, outcomes, strict=True):
            tp, row = self.plan.plan_of(outcome.tool), SERVER_TOOLS[outcome.tool]
            block = result_block(use["id"], outcome, tp.citations if tp is not None else None)
            if row.usage_key and row.counted(block):
                self.counts[row.usage_key] = self.counts.get(row.usage_key, 0) + 1
            results.append(block)
        return results

    @property
    def cites_pages(self) -> bool:
        return self.plan.cites_pages

    def cited(self, blocks: list[dict]) -> list[dict]:
        """The text blocks with the citations their markers name (proxy.apis.citations); others as they were."""
        shape = citations.anthropic_shape(self.cites_pages)
        out = []
        for b in blocks:
            found = citations.cite_text(b["text"], self.sources, shape) \
                if b.get("type") == "text" and isinstance(b.get("text"), str) else []
            out.append({**b, "citations": list(b.get("citations") or []) + found} if found else b)
        return out

    def usage_total(self) -> dict:
        return with_counts(self.usage, self.counts)

    def follow(self, turn: _Blocks, calls: list, outcomes: list):
        self.messages = self.messages + [{"role": "assistant", "content": turn.blocks},
                                         tool_results(turn_calls(turn.blocks), calls, outcomes, self.sources,
                                                      self.cites_pages)]
        self.request = next_request(self.body, self.messages, self.plan)
        # A failure's sentence is more than its result block can hold: kept by the block's id for the replays.
        for call, outcome in zip(calls, outcomes, strict=True):
            if kept_text(outcome):
                self.kept.put(client_id(call.get("id")), {"output": model_text(outcome, as_dict(call.get("input")))})

    def error_reply(self, status, message, type_=None) -> Response:
        return anthropic_error(status, message)  # Anthropic's error types follow the status

    def vllm_reply(self, up, raw) -> Response:
        return vllm_reply(up, raw)


class PlainMessages(_Messages):
    """Non-streaming: one message holding every search's and fetch's blocks and the model's text."""

    name = "messages"
    stream = False

    def error(self, status, message, type_=None) -> Response:
        return self.error_reply(status, message, type_)

    def __init__(self, ex, body, plan, first):
        super().__init__(ex, body, plan, first)
        self.content: list[dict] = []  # the blocks of the turns before the last
        self.ident = None              # the first turn's id, the client's message's

    def parse(self, up, raw, data) -> _Blocks:
        self.ident = self.ident or data.get("id")
        self.usage = add_usage(self.usage, data.get("usage"))
        return _Blocks([b for b in data.get("content") or [] if isinstance(b, dict)], up, raw, data)

    def finish(self, turn: _Blocks):
        if self.session.rounds == 0:
            yield Response(turn.raw, status=200, headers=response_headers(turn.up))  # untouched
            return
        data = turn.data or {}  # a plain turn always has its JSON object (Plain.read)
        data["id"], data["content"] = self.ident, self.cited(self.content + turn.blocks)  # one message, as the stream says
        data["usage"] = self.usage_total()
        yield Response(codec.dumps(data), status=200, mimetype="application/json")

    def record(self, turn: _Blocks, calls, outcomes):
        # The model's own words of a search turn stay; its tool calls become server blocks.
        self.content += [b for b in turn.blocks if b.get("type") != "tool_use"] + self.uses + self.results(outcomes)
        self.follow(turn, calls, outcomes)
        return ()


class StreamedMessages(_Messages):
    """Streaming: vLLM's events live, each search and fetch shown as server-tool blocks with `ping`
    events while it runs, the whole reply one well-formed Anthropic message."""

    name = "messages stream"
    stream = True
    headers = SSE_HEADERS

    def __init__(self, ex, body, plan, first):
        super().__init__(ex, body, plan, first)
        self.out = ClientMessage()
        if self.sources is not None:
            self.out.citer = citations.Citer(self.sources, citations.anthropic_shape(self.cites_pages))

    def stream_turn(self, up):
        turn = yield from self.out.stream_turn(up)
        if turn is not None:
            self.usage = add_usage(self.usage, (turn.delta or {}).get("usage"))
        return turn

    def finish(self, turn):
        # Nothing searched: vLLM's own message_delta; else one with usage over every turn.
        usage = self.usage_total() if self.session.rounds else None
        return self.out.finish(turn, usage)

    def announce(self, calls):
        super().announce(calls)
        opening = [] if self.out.started else [self.out.open(self.body.get("model"))]
        return opening + self.out.blocks(self.uses)

    def keepalive(self, requests) -> bytes:
        return PING

    def record(self, turn, calls, outcomes):
        shown = self.out.blocks(self.results(outcomes))
        self.follow(turn, calls, outcomes)
        return shown

    def error(self, status, message, type_=None) -> bytes:
        return error_event(status, message)

    def refused(self, status, raw) -> bytes:
        return error_event(status if status != 200 else 502, "", raw)
