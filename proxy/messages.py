"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's API, Claude Code): the proxy
plays Anthropic's `web_search` server tool on top of vLLM's own Messages route, on the
shared search core; everything without server tools or server blocks is relayed byte for byte.

Used by proxy.app; not run on its own (tests: tests/run.sh tests/test_messages.py). The rules
(which requests, the rewrite, replayed history, the blocks the client sees, usage) are pure
functions at the top; below them, the dialects that proxy.loop drives, the streamed one
writing its events with proxy/messages_stream.py.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field

from flask import Response

from . import loop
from .errors import anthropic_error, as_anthropic_error, upstream_error_status
from .exchange import Exchange, encode_json, response_headers
from .jsonio import as_dict
from .messages_stream import PING, SSE_HEADERS, ClientMessage, error_event
from .search import (
    NOT_EXECUTED,
    QUERY_SCHEMA,
    TOOL_DESCRIPTION,
    Hit,
    SearchOutcome,
    filter_domains,
    format_for_model,
    parse_arguments,
)
from .upstream import UpstreamError

log = logging.getLogger("proxy.messages")

SERVER_TOOL_PREFIX = "web_search_"
SERVER_NAME = "web_search"          # the name Anthropic gives the server tool's blocks
SERVER_BLOCKS = frozenset({"server_tool_use", "web_search_tool_result"})
SUBREQUEST_PREFIX = "Perform a web search for the query: "
# What the model reads again when a replayed error block is all that is left of a search.
ERROR_TEXT = {
    "too_many_requests": "Search failed: the search engine rate-limited the proxy (too_many_requests).",
    "unavailable": "Search failed: the search engine is unavailable.",
    "invalid_tool_input": "Search failed: the query was empty or unusable.",
    "query_too_long": "Search failed: the query was too long; use a few keywords.",
    "max_uses_exceeded": "Not searched: the search limit of this request (max_uses) was used up.",
}
MODELS_TTL = 60.0  # seconds a /v1/models answer is trusted for ANTHROPIC_ANY_MODEL
# Claude Code's search sub-request names its query; searching it directly saves the model
# turn that would only copy it into a tool call (measured: see tests/test_claude_code.py).
SUBREQUEST_SHORTCUT = True


# ---- pure rules: which requests -----------------------------------------------------------

def is_server_tool(tool) -> bool:
    """Anthropic's server tool, by type: Claude Desktop's client-side `WebSearch` is a normal tool."""
    return isinstance(tool, dict) and str(tool.get("type") or "").startswith(SERVER_TOOL_PREFIX)


def server_tool(body: dict) -> dict | None:
    tools = body.get("tools")
    return next((t for t in tools if is_server_tool(t)), None) if isinstance(tools, list) else None


def has_server_blocks(body: dict) -> bool:
    msgs = body.get("messages")
    return isinstance(msgs, list) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list)
        and any(isinstance(b, dict) and b.get("type") in SERVER_BLOCKS for b in m["content"]) for m in msgs)


def needs_rewrite(body) -> bool:
    return isinstance(body, dict) and (server_tool(body) is not None or has_server_blocks(body))


def validate(body: dict) -> str | None:
    """What makes a request the proxy must rewrite unusable, or None."""
    if not isinstance(body.get("messages"), list) or not all(isinstance(m, dict) for m in body["messages"]):
        return "messages: must be an array of message objects"
    if body.get("tools") is not None and (not isinstance(body["tools"], list)
                                          or not all(isinstance(t, dict) for t in body["tools"])):
        return "tools: must be an array of tool objects"
    spec = server_tool(body) or {}
    mu = spec.get("max_uses")
    if mu is not None and (isinstance(mu, bool) or not isinstance(mu, int) or mu < 1):
        return "tools: web_search max_uses must be a positive integer"
    if spec.get("allowed_domains") and spec.get("blocked_domains"):
        return "tools: web_search may have allowed_domains or blocked_domains, not both"
    for key in ("allowed_domains", "blocked_domains"):
        if spec.get(key) is not None and not isinstance(spec[key], list):
            return f"tools: web_search {key} must be an array of domains"
    return None


def subrequest_query(body: dict) -> str | None:
    """The <q> of Claude Code's search sub-request (only the server tool; one user message
    `Perform a web search for the query: <q>`), else None."""
    tools, msgs = body.get("tools") or [], body.get("messages") or []
    if len(tools) != 1 or not is_server_tool(tools[0]) or len(msgs) != 1 or msgs[0].get("role") != "user":
        return None
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and tc.get("type") == "none":
        return None
    content = msgs[0].get("content")
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if len(texts) != 1 or len(content) != 1:
            return None
        content = texts[0]
    if isinstance(content, str) and content.startswith(SUBREQUEST_PREFIX):
        return content[len(SUBREQUEST_PREFIX):]
    return None


def served_model_for(model, served: list[str] | None) -> str | None:
    """The served model to use instead of an unknown `model` (ANTHROPIC_ANY_MODEL), or None."""
    if not served or model in served:
        return None
    return served[0]


# ---- pure rules: the rewrite ----------------------------------------------------------------

@dataclass
class Plan:
    """How one rewritten request searches."""
    name: str                        # the search tool's name on the vLLM side
    server: bool                     # the server tool is in `tools` (else only history is rewritten)
    max_uses: int | None = None
    allowed: list = field(default_factory=list)
    blocked: list = field(default_factory=list)
    client_tools: bool = False       # ordinary tools besides the search tool


def internal_name(tools) -> str:
    """`web_search`, unless the client has an ordinary tool of that name: then a free variant."""
    taken = {t.get("name") for t in tools or [] if isinstance(t, dict) and not is_server_tool(t)}
    name, n = SERVER_NAME, 1
    while name in taken:
        name = f"{SERVER_NAME}_server" + (f"_{n}" if n > 1 else "")
        n += 1
    return name


def search_tool(name: str, plan: Plan) -> dict:
    desc = TOOL_DESCRIPTION
    if plan.allowed:
        desc += " Only results from these domains are shown: " + ", ".join(map(str, plan.allowed)) + "."
    if plan.blocked:
        desc += " Results from these domains are never shown: " + ", ".join(map(str, plan.blocked)) + "."
    return {"name": name, "description": desc, "input_schema": QUERY_SCHEMA}


def rewrite(body: dict) -> tuple[dict, Plan]:
    """The request as vLLM accepts it: the server tool as an ordinary tool, server blocks in
    history as tool_use/tool_result; every other field unchanged. Pure."""
    spec = server_tool(body)
    tools = body.get("tools")
    name = internal_name(tools)
    plan = Plan(name=name, server=spec is not None,
                max_uses=(spec or {}).get("max_uses"),
                allowed=list((spec or {}).get("allowed_domains") or []),
                blocked=list((spec or {}).get("blocked_domains") or []),
                client_tools=any(not is_server_tool(t) for t in tools or []))
    out = dict(body)
    if tools is not None:
        out["tools"] = [search_tool(name, plan) if is_server_tool(t) else t for t in tools]
    tc = body.get("tool_choice")
    if spec is not None and isinstance(tc, dict) and tc.get("type") == "tool" and tc.get("name") == SERVER_NAME \
            and name != SERVER_NAME and not _client_has(tools, SERVER_NAME):
        out["tool_choice"] = {**tc, "name": name}
    if has_server_blocks(body):
        out["messages"] = rewrite_history(body["messages"], name)
    return out, plan


def _client_has(tools, name) -> bool:
    return any(isinstance(t, dict) and not is_server_tool(t) and t.get("name") == name for t in tools or [])


def rewrite_history(messages: list[dict], name: str) -> list[dict]:
    """Replayed server blocks as blocks vLLM accepts. Pure.

    Anthropic keeps a search's `server_tool_use` and its result in the assistant message;
    vLLM needs a `tool_use` in the assistant turn and its `tool_result` in the next user
    turn. So an assistant message is cut after each run of searches, and the results open
    the user turn that follows (merged into the next user message when there is one).
    """
    out: list[dict] = []
    carry: list[dict] = []       # tool_results waiting for the next user message
    for msg in messages:
        content = msg.get("content")
        if msg.get("role") == "user" and carry:
            rest = content if isinstance(content, list) else ([{"type": "text", "text": content}] if content else [])
            out.append({**msg, "content": carry + rest})
            carry = []
            continue
        if msg.get("role") != "assistant" or not isinstance(content, list) \
                or not any(isinstance(b, dict) and b.get("type") in SERVER_BLOCKS for b in content):
            out.append(msg)
            continue
        queries = {b.get("id"): str((as_dict(b.get("input"))).get("query", ""))
                   for b in content if isinstance(b, dict) and b.get("type") == "server_tool_use"}
        ids = set(queries)
        seg: list[dict] = []
        results: list[dict] = []
        for b in content:
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "server_tool_use":
                if results and not _pending(seg, results, ids):
                    out += [{**msg, "content": seg}, {"role": "user", "content": _complete(seg, results, ids)}]
                    seg, results = [], []
                seg.append({"type": "tool_use", "id": b.get("id"), "name": name, "input": b.get("input") or {}})
            elif kind == "web_search_tool_result":
                tid = b.get("tool_use_id")
                text = format_for_model(outcome_from_block(queries.get(tid, ""), b.get("content")))
                results.append({"type": "tool_result", "tool_use_id": tid, "content": text})
            else:
                if results or _pending(seg, results, ids):
                    out += [{**msg, "content": seg}, {"role": "user", "content": _complete(seg, results, ids)}]
                    seg, results = [], []
                seg.append(b)
        if seg:
            out.append({**msg, "content": seg})
        carry = _complete(seg, results, ids) if results or _pending(seg, results, ids) else []
    if carry:
        out.append({"role": "user", "content": carry})
    return out


def _searches_of(seg, ids) -> list[dict]:
    # Only the rewritten server calls: a client tool_use gets its result from the client.
    return [b for b in seg if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") in ids]


def _pending(seg, results, ids) -> bool:
    """True while a search of this segment still waits for its result."""
    done = {r["tool_use_id"] for r in results}
    return any(b.get("id") not in done for b in _searches_of(seg, ids))


def _complete(seg, results, ids) -> list[dict]:
    """Results in call order, with a stand-in for a search whose result was not replayed."""
    by_id = {r["tool_use_id"]: r for r in results}
    return [by_id.get(b.get("id")) or {"type": "tool_result", "tool_use_id": b.get("id"),
                                       "content": "No result was recorded for this search."}
            for b in _searches_of(seg, ids)]


# ---- pure rules: the blocks the client sees -------------------------------------------------

def encode_content(hit: Hit, outcome: SearchOutcome | None = None) -> str:
    """`encrypted_content`: NOT encrypted, base64 of compact JSON holding the snippet (and, on a
    search's first result, its answers and infoboxes), so a replayed result gives the model
    back exactly what it read the first time."""
    data: dict[str, object] = {"snippet": hit.snippet}
    if outcome is not None and outcome.answers:
        data["answers"] = outcome.answers
    if outcome is not None and outcome.infoboxes:
        data["infoboxes"] = outcome.infoboxes
    return base64.b64encode(encode_json(data)).decode()


def decode_content(text) -> dict:
    """What encode_content() stored, or {} for anything else (Anthropic's real ciphertext)."""
    try:
        data = json.loads(base64.b64decode(str(text), validate=True))
    except (ValueError, binascii.Error, TypeError):
        return {}
    return data if isinstance(data, dict) else {}


def result_block(tool_use_id: str, outcome: SearchOutcome) -> dict:
    content: dict | list[dict]
    if outcome.status == "failed":
        content = {"type": "web_search_tool_result_error", "error_code": outcome.error_code or "unavailable"}
    else:
        content = [{"type": "web_search_result", "url": h.url, "title": h.title,
                    "encrypted_content": encode_content(h, outcome if i == 0 else None), "page_age": h.date}
                   for i, h in enumerate(outcome.hits)]
    return {"type": "web_search_tool_result", "tool_use_id": tool_use_id, "content": content}


def outcome_from_block(query: str, content) -> SearchOutcome:
    """A replayed web_search_tool_result read back into the outcome it was made from. Pure."""
    if isinstance(content, dict):
        code = content.get("error_code") or "unavailable"
        return SearchOutcome(query, "failed", message=ERROR_TEXT.get(code, f"Search failed: {code}."), error_code=code)
    hits, answers, infoboxes = [], [], []
    for i, r in enumerate(content if isinstance(content, list) else []):
        if not isinstance(r, dict) or not r.get("url"):
            continue
        extra = decode_content(r.get("encrypted_content"))
        if i == 0:
            answers, infoboxes = list(extra.get("answers") or []), list(extra.get("infoboxes") or [])
        hits.append(Hit(title=str(r.get("title") or r["url"]), url=str(r["url"]),
                        snippet=str(extra.get("snippet") or ""), date=r.get("page_age")))
    if hits or answers or infoboxes:
        return SearchOutcome(query, "ok", hits=hits, answers=answers, infoboxes=infoboxes)
    return SearchOutcome(query, "empty", message=f'No results for "{query}". Try different keywords.')


def client_id(vllm_id) -> str:
    tail = re.sub(r"[^A-Za-z0-9]", "", re.split(r"[-_]", str(vllm_id or ""))[-1])
    return "srvtoolu_" + (tail or uuid.uuid4().hex[:24])


def server_use_block(call: dict) -> dict:
    return {"type": "server_tool_use", "id": client_id(call.get("id")), "name": SERVER_NAME,
            "input": as_dict(call.get("input"))}


def counts_as_search(block: dict) -> bool:
    """Claude Code's rule for "Did N searches": a result block whose content is a list."""
    return block.get("type") == "web_search_tool_result" and isinstance(block.get("content"), list)


def add_usage(total: dict | None, turn: dict | None) -> dict | None:
    """Token counts of two turns added; anything else is the latest turn's."""
    if not turn:
        return total
    if not total:
        return dict(turn)
    out = {**total, **turn}
    for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        if key in total or key in turn:
            out[key] = (total.get(key) or 0) + (turn.get(key) or 0)
    return out


def with_searches(usage: dict | None, requests: int) -> dict:
    return {**(usage or {"input_tokens": 0, "output_tokens": 0}), "server_tool_use": {"web_search_requests": requests}}


def next_request(body: dict, messages: list[dict], plan: Plan) -> dict:
    """The following turn: longer history; a choice that forces searching is relaxed after the
    first round so the model writes its answer instead of searching forever."""
    out = {**body, "messages": messages}
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and ((tc.get("type") == "tool" and tc.get("name") == plan.name)
                                 or (tc.get("type") == "any" and not plan.client_tools)):
        out["tool_choice"] = {k: v for k, v in tc.items() if k == "disable_parallel_tool_use"} | {"type": "auto"}
    return out


def tool_results(calls: list[dict], searches: list[dict], outcomes: list[SearchOutcome]) -> dict:
    """The user turn answering every tool call of a search turn: results, or not-executed."""
    text = {id(c): format_for_model(o) for c, o in zip(searches, outcomes, strict=True)}
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.get("id"),
                                         "content": text.get(id(c), NOT_EXECUTED)} for c in calls]}


def shortcut_turn(query: str, plan: Plan) -> list[dict]:
    """The tool call the model would have written for Claude Code's sub-request."""
    return [{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": plan.name, "input": {"query": query}}]


# ---- the handler -----------------------------------------------------------------------------

_served: dict = {"names": None, "at": 0.0}


def served_models(ex: Exchange) -> list[str] | None:
    """vLLM's model names (GET /v1/models), cached briefly; None when vLLM can't tell."""
    if _served["names"] and time.monotonic() - _served["at"] < MODELS_TTL:
        return _served["names"]
    headers = [(n, v) for n, v in ex.headers if n.lower() in ("authorization", "x-api-key")]
    try:
        call = ex.call("GET", "/v1/models", None, headers)
        raw = call.read()
        names = [str(m["id"]) for m in json.loads(raw).get("data") or [] if isinstance(m, dict) and m.get("id")]
    except (UpstreamError, ValueError, AttributeError) as e:
        log.warning("ANTHROPIC_ANY_MODEL: cannot list vLLM's models: %s", e)
        return None
    if call.response.status != 200 or not names:
        return None
    _served.update(names=names, at=time.monotonic())
    return names


def handle(ex: Exchange) -> Response:
    try:
        body = json.loads(ex.body)
    except (ValueError, UnicodeDecodeError):
        return ex.relay()  # not ours to judge: vLLM says what is wrong, as it always did
    renamed = False
    if ex.cfg.anthropic_any_model and isinstance(body, dict):
        model = served_model_for(body.get("model"), served_models(ex))
        if model:
            body["model"], renamed = model, True
    if not needs_rewrite(body):
        return ex.relay(encode_json(body)) if renamed else ex.relay()
    problem = validate(body)
    if problem:
        return anthropic_error(400, problem)
    vbody, plan = rewrite(body)
    if ex.target.split("?", 1)[0].rstrip("/").endswith("/count_tokens"):
        return count_tokens(ex, vbody)
    query = subrequest_query(body) if SUBREQUEST_SHORTCUT else None
    first = _Blocks(shortcut_turn(query, plan)) if query is not None else None
    dialect = StreamedMessages if body.get("stream") else PlainMessages
    return loop.run(ex, dialect(ex, vbody, plan, first))


def count_tokens(ex: Exchange, vbody: dict) -> Response:
    watch = ex.watch_client()
    try:
        call = ex.post(ex.target, vbody)
        raw = call.read()
    except UpstreamError as e:
        status, msg = upstream_error_status(e)
        return anthropic_error(status, msg)
    finally:
        watch.stop()
    return vllm_reply(call.response, raw)


def vllm_reply(up, raw: bytes) -> Response:
    """vLLM's answer as the client's: its errors in Anthropic's shape, anything else as sent."""
    if up.status != 200:
        return Response(as_anthropic_error(up.status, raw), status=up.status, mimetype="application/json")
    return Response(raw, status=200, headers=response_headers(up))


# ---- the dialects: the search loop (proxy.loop) as Anthropic's server tool ------------------

class _Blocks:
    """One turn's content blocks (and for a plain turn, vLLM's answer they came from)."""

    def __init__(self, blocks: list[dict], up=None, raw: bytes = b"", data: dict | None = None):
        self.blocks, self.up, self.raw, self.data = blocks, up, raw, data


class _Messages(loop.Dialect):
    """What both kinds of Messages request share: the server tool's searches (max_uses,
    domain filters, the count in usage.server_tool_use), its blocks, the next request."""

    def __init__(self, ex: Exchange, body: dict, plan: Plan, first: _Blocks | None):
        super().__init__(ex, body)
        self.path = ex.target  # the client's own path and query (Claude Code's `?beta=true`)
        self.body, self.plan, self.first_turn = body, plan, first
        self.messages = list(body["messages"])
        self.limit = ex.cfg.searxng_results
        self.used = 0          # searches asked for, against max_uses
        self.requests = 0      # searches that count as done (web_search_requests)
        self.usage: dict | None = None
        self.uses: list[dict] = []  # the server_tool_use blocks of the round under way

    def searches(self, turn: _Blocks) -> list:
        if not self.plan.server:
            return []  # only replayed history was rewritten: the model has no search tool
        return [b for b in turn.blocks if b.get("type") == "tool_use" and b.get("name") == self.plan.name]

    def search(self, calls: list) -> list[SearchOutcome]:
        parsed = [parse_arguments(c.get("input")) for c in calls]
        allowed = len(parsed) if self.plan.max_uses is None else max(0, self.plan.max_uses - self.used)
        self.used += len(parsed)
        # A round whose calls are all over max_uses still counts toward MAX_SEARCH_ITER.
        run = self.session.run(parsed[:allowed], limit=self.limit)
        over = [SearchOutcome(q or "", "failed", error_code="max_uses_exceeded", message=(
            f"Not searched: this request allows at most {self.plan.max_uses} searches (max_uses) and "
            "they are used up. Answer from the results you already have."))
                for q, _ in parsed[allowed:]]
        return [filter_domains(o, self.plan.allowed, self.plan.blocked) for o in run] + over

    def announce(self, calls: list):
        self.uses = [server_use_block(c) for c in calls]
        return ()

    def results(self, outcomes: list[SearchOutcome]) -> list[dict]:
        """The web_search_tool_result blocks answering this round's server_tool_use blocks."""
        results = [result_block(u["id"], o) for u, o in zip(self.uses, outcomes, strict=True)]
        self.requests += sum(counts_as_search(r) for r in results)
        return results

    def follow(self, turn: _Blocks, calls: list, outcomes: list):
        self.messages = self.messages + [{"role": "assistant", "content": turn.blocks},
                                         tool_results(turn_calls(turn.blocks), calls, outcomes)]
        self.request = next_request(self.body, self.messages, self.plan)

    def error_reply(self, status, message, type_=None) -> Response:
        return anthropic_error(status, message)  # Anthropic's error types follow the status

    def vllm_reply(self, up, raw) -> Response:
        return vllm_reply(up, raw)


class PlainMessages(loop.Plain, _Messages):
    """Non-streaming: one message holding every search's blocks and the model's text."""

    name = "messages"

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
        data["id"], data["content"] = self.ident, self.content + turn.blocks  # one message, as the stream says
        data["usage"] = with_searches(self.usage, self.requests)
        yield Response(encode_json(data), status=200, mimetype="application/json")

    def record(self, turn: _Blocks, calls, outcomes):
        # The model's own words of a search turn stay; its tool calls become server blocks.
        self.content += [b for b in turn.blocks if b.get("type") != "tool_use"] + self.uses + self.results(outcomes)
        self.follow(turn, calls, outcomes)
        return ()


class StreamedMessages(loop.Stream, _Messages):
    """Streaming: vLLM's events live, each search shown as server-tool blocks with `ping`
    events while it runs, the whole reply one well-formed Anthropic message."""

    name = "messages stream"
    headers = SSE_HEADERS

    def __init__(self, ex, body, plan, first):
        super().__init__(ex, body, plan, first)
        self.out = ClientMessage()

    def relay(self, up):
        turn = yield from self.out.relay(up)
        if turn is not None:
            self.usage = add_usage(self.usage, (turn.delta or {}).get("usage"))
        return turn

    def finish(self, turn):
        # Nothing searched: vLLM's own message_delta; else one with usage over every turn.
        usage = with_searches(self.usage, self.requests) if self.session.rounds else None
        return self.out.finish(turn, usage)

    def announce(self, calls):
        super().announce(calls)
        opening = [] if self.out.started else [self.out.open(self.body.get("model"))]
        return opening + self.out.blocks(self.uses)

    def keepalive(self, calls) -> bytes:
        return PING

    def record(self, turn, calls, outcomes):
        shown = self.out.blocks(self.results(outcomes))
        self.follow(turn, calls, outcomes)
        return shown

    def error(self, status, message, type_=None) -> bytes:
        return error_event(status, message)

    def refused(self, status, raw) -> bytes:
        return error_event(status if status != 200 else 502, "", raw)


def turn_calls(turn: list[dict]) -> list[dict]:
    return [b for b in turn if b.get("type") == "tool_use"]
