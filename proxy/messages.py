"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's API, Claude Code): the proxy
plays Anthropic's `web_search` and `web_fetch` server tools on top of vLLM's own Messages route,
on the shared search and fetch cores; everything without server tools or server blocks is
relayed byte for byte.

Used by proxy.app; not run on its own (tests: tests/run.sh tests/test_messages.py
tests/test_messages_fetch.py). The rules
(which requests, the rewrite, replayed history, the blocks the client sees, usage) are pure
functions at the top; below them, the dialects that proxy.loop drives, the streamed one
writing its events with proxy/messages_stream.py.
"""
from __future__ import annotations

import base64
import binascii
import logging
import re
import uuid
from dataclasses import dataclass, field, replace

from flask import Response

from . import citations, codec, loop
from . import validate as V
from .codec import as_dict, as_list
from .errors import anthropic_error, as_anthropic_error, upstream_error_status
from .exchange import Exchange, response_headers
from .fetch import FETCH_TOOL_DESCRIPTION, URL_SCHEMA, FetchOutcome, FetchRequest, parse_fetch_arguments
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
# Every web_fetch_* version is served as web_fetch_20250910: the later ones (the SDK knows
# _20260209, _20260309, _20260318) only add options and share its blocks, as web_search_* do.
FETCH_TOOL_PREFIX = "web_fetch_"
FETCH_NAME = "web_fetch"
SERVER_BLOCKS = frozenset({"server_tool_use", "web_search_tool_result", "web_fetch_tool_result"})
SUBREQUEST_PREFIX = "Perform a web search for the query: "
# What the model reads again when a replayed error block is all that is left of a search.
ERROR_TEXT = {
    "too_many_requests": "Search failed: the search engine rate-limited the proxy (too_many_requests).",
    "unavailable": "Search failed: the search engine is unavailable.",
    "invalid_tool_input": "Search failed: the query was empty or unusable.",
    "query_too_long": "Search failed: the query was too long; use a few keywords.",
    "max_uses_exceeded": "Not searched: the search limit of this request (max_uses) was used up.",
}
# The same for a replayed web_fetch error (the live sentence, naming the URL's answer, is gone).
FETCH_ERROR_TEXT = {
    "url_not_accessible": "Fetch failed: the page could not be reached or answered with an error (url_not_accessible).",
    "url_not_allowed": "Not fetched: this URL is not allowed (url_not_allowed).",
    "unsupported_content_type": "Fetch failed: the page is not text the proxy can read (unsupported_content_type).",
    "too_many_requests": "Fetch failed: the site rate-limited the proxy (too_many_requests).",
    "max_uses_exceeded": "Not fetched: the fetch limit of this request (max_uses) was used up.",
    "invalid_tool_input": 'Fetch failed: the call had no usable "url".',
    "url_too_long": "Fetch failed: the URL was too long.",
    "unavailable": "Fetch failed: web_fetch was unavailable.",
}
CUT_NOTE = "\n\n(cut short: only the beginning of the page is shown)"
# Claude Code's search sub-request names its query; searching it directly saves the model
# turn that would only copy it into a tool call (measured: see tests/test_claude_code.py).
SUBREQUEST_SHORTCUT = True


# ---- pure rules: which requests -----------------------------------------------------------

def _typed(tool, prefix: str) -> bool:
    return isinstance(tool, dict) and str(tool.get("type") or "").startswith(prefix)


def is_search_tool(tool) -> bool:
    """Anthropic's web_search server tool, by type: Claude Desktop's client-side `WebSearch` is a normal tool."""
    return _typed(tool, SERVER_TOOL_PREFIX)


def is_fetch_tool(tool) -> bool:
    """Anthropic's web_fetch server tool, by type (Claude Code's client-side WebFetch is a normal tool)."""
    return _typed(tool, FETCH_TOOL_PREFIX)


def is_server_tool(tool) -> bool:
    """One of the server tools the proxy plays."""
    return is_search_tool(tool) or is_fetch_tool(tool)


def server_tool(body: dict, kind=is_search_tool) -> dict | None:
    """The request's web_search server tool (or, with kind=is_fetch_tool, its web_fetch one)."""
    tools = body.get("tools")
    return next((t for t in tools if kind(t)), None) if isinstance(tools, list) else None


def fetch_tool(body: dict) -> dict | None:
    return server_tool(body, is_fetch_tool)


def has_server_blocks(body: dict) -> bool:
    msgs = body.get("messages")
    return isinstance(msgs, list) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list)
        and any(V.kind(b) in SERVER_BLOCKS for b in m["content"]) for m in msgs)


def needs_rewrite(body) -> bool:
    return isinstance(body, dict) and (server_tool(body, is_server_tool) is not None or has_server_blocks(body))


def validate(body: dict) -> str | None:
    """What makes a request the proxy must rewrite unusable, or None."""
    if not isinstance(body.get("messages"), list) or not all(isinstance(m, dict) for m in body["messages"]):
        return "messages: must be an array of message objects"
    if body.get("tools") is not None and (not isinstance(body["tools"], list)
                                          or not all(isinstance(t, dict) for t in body["tools"])):
        return "tools: must be an array of tool objects"
    fetch = fetch_tool(body)
    problem = _spec_problem(SERVER_NAME, server_tool(body) or {}, ("max_uses",)) \
        or _spec_problem(FETCH_NAME, fetch or {}, ("max_uses", "max_content_tokens")) \
        or (None if fetch is None or fetch.get("citations") is None or isinstance(fetch["citations"], dict)
            else "tools: web_fetch citations must be an object like {\"enabled\": true}")
    if problem:
        return problem
    try:
        _check_types(body)
    except V.Invalid as e:
        return e.anthropic_message
    return None


def _check_types(body: dict) -> None:
    """The fields the rewrite reads (names, ids, domains, tool_choice, replayed server blocks) are of
    the JSON type it reads them as, or V.Invalid names the first that is not."""
    V.boolean(body.get("stream"), "stream")
    for i, tool in enumerate(body.get("tools") or []):
        V.fields(tool, f"tools.{i}", name=V.string, type=V.string)
        if is_server_tool(tool):
            V.fields(tool, f"tools.{i}", allowed_domains=V.strings, blocked_domains=V.strings)
    if isinstance(body.get("tool_choice"), dict):
        V.fields(body["tool_choice"], "tool_choice", type=V.string, name=V.string)
    for i, msg in enumerate(body["messages"]):
        content = msg.get("content")
        if not (isinstance(content, list) and any(V.kind(b) in SERVER_BLOCKS for b in content)):
            continue  # history without server blocks goes to vLLM as it is: vLLM judges it
        for j, block in enumerate(content):
            at = f"messages.{i}.content.{j}"
            block = V.obj(block, at)
            V.fields(block, at, type=V.string, id=V.string, tool_use_id=V.string, name=V.string)
            if block.get("type") == "server_tool_use":
                V.fields(block, at, input=V.obj)
            elif block.get("type") == "web_search_tool_result" and not isinstance(block.get("content"), list):
                V.fields(V.obj(block.get("content"), f"{at}.content"), f"{at}.content", error_code=V.string)
            elif block.get("type") == "web_fetch_tool_result":
                V.fields(V.obj(block.get("content"), f"{at}.content"), f"{at}.content", error_code=V.string)


def _positive(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1


def _spec_problem(label: str, spec: dict, counts: tuple[str, ...]) -> str | None:
    """What is wrong with one server tool's options, or None (Anthropic's rules: whole counts,
    and allowed_domains or blocked_domains, not both)."""
    for key in counts:
        if spec.get(key) is not None and not _positive(spec[key]):
            return f"tools: {label} {key} must be a positive integer"
    if spec.get("allowed_domains") and spec.get("blocked_domains"):
        return f"tools: {label} may have allowed_domains or blocked_domains, not both"
    for key in ("allowed_domains", "blocked_domains"):
        if spec.get(key) is not None and not isinstance(spec[key], list):
            return f"tools: {label} {key} must be an array of domains"
    return None


def subrequest_query(body: dict) -> str | None:
    """The <q> of Claude Code's search sub-request (only the server tool; one user message
    `Perform a web search for the query: <q>`), else None."""
    tools, msgs = body.get("tools") or [], body.get("messages") or []
    if len(tools) != 1 or not is_search_tool(tools[0]) or len(msgs) != 1 or msgs[0].get("role") != "user":
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

@dataclass(frozen=True)
class FetchPlan:
    """The web_fetch tool's options, as the fetch core takes them."""
    max_uses: int | None = None
    allowed: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    max_tokens: int | None = None    # max_content_tokens
    citations: dict | None = None    # echoed in each document; {"enabled": true}: pages are cited (char_location)


@dataclass
class Plan:
    """How one rewritten request searches and fetches."""
    name: str                        # the search tool's name on the vLLM side
    server: bool                     # the web_search tool is in `tools` (else only history is rewritten)
    max_uses: int | None = None
    allowed: list = field(default_factory=list)
    blocked: list = field(default_factory=list)
    client_tools: bool = False       # ordinary tools besides the server tools
    fetch_name: str = FETCH_NAME     # the fetch tool's name on the vLLM side
    fetch: FetchPlan | None = None   # None: no web_fetch tool in `tools`

    def ours(self) -> set[str]:
        """The vLLM-side names of the calls the proxy runs itself."""
        return ({self.name} if self.server else set()) | ({self.fetch_name} if self.fetch else set())


def internal_name(tools, base: str = SERVER_NAME) -> str:
    """`web_search` (or `web_fetch`), unless the client has an ordinary tool of that name: then a free variant."""
    taken = {t.get("name") for t in tools or [] if isinstance(t, dict) and not is_server_tool(t)}
    name, n = base, 1
    while name in taken:
        name = f"{base}_server" + (f"_{n}" if n > 1 else "")
        n += 1
    return name


def search_tool(name: str, plan: Plan) -> dict:
    desc = TOOL_DESCRIPTION
    if plan.allowed:
        desc += " Only results from these domains are shown: " + ", ".join(map(str, plan.allowed)) + "."
    if plan.blocked:
        desc += " Results from these domains are never shown: " + ", ".join(map(str, plan.blocked)) + "."
    return {"name": name, "description": desc, "input_schema": QUERY_SCHEMA}


def fetch_plan(spec: dict) -> FetchPlan:
    return FetchPlan(max_uses=spec.get("max_uses"), allowed=tuple(map(str, spec.get("allowed_domains") or ())),
                     blocked=tuple(map(str, spec.get("blocked_domains") or ())),
                     max_tokens=spec.get("max_content_tokens"), citations=spec.get("citations"))


def fetch_tool_for_vllm(name: str, fp: FetchPlan) -> dict:
    """web_fetch as an ordinary tool: the fetch core's description and schema (chat's WEB_FETCH_TOOL)."""
    desc = FETCH_TOOL_DESCRIPTION
    if fp.allowed:
        desc += " Only pages on these domains can be fetched: " + ", ".join(fp.allowed) + "."
    if fp.blocked:
        desc += " Pages on these domains are never fetched: " + ", ".join(fp.blocked) + "."
    return {"name": name, "description": desc, "input_schema": URL_SCHEMA}


def rewrite(body: dict, cite: bool = True) -> tuple[dict, Plan]:
    """The request as vLLM accepts it: the server tool as an ordinary tool, server blocks in
    history as tool_use/tool_result; every other field unchanged. Pure."""
    spec, fspec = server_tool(body), fetch_tool(body)
    tools = body.get("tools")
    name = internal_name(tools)
    plan = Plan(name=name, server=spec is not None,
                max_uses=(spec or {}).get("max_uses"),
                allowed=list((spec or {}).get("allowed_domains") or []),
                blocked=list((spec or {}).get("blocked_domains") or []),
                client_tools=any(not is_server_tool(t) for t in tools or []),
                fetch_name=internal_name(tools, FETCH_NAME), fetch=fetch_plan(fspec) if fspec is not None else None)
    out = dict(body)
    if tools is not None:
        out["tools"] = [search_tool(name, plan) if is_search_tool(t)
                        else fetch_tool_for_vllm(plan.fetch_name, plan.fetch) if is_fetch_tool(t) and plan.fetch
                        else t for t in tools]
    tc = body.get("tool_choice")
    if spec is not None and isinstance(tc, dict) and tc.get("type") == "tool" and tc.get("name") == SERVER_NAME \
            and name != SERVER_NAME and not _client_has(tools, SERVER_NAME):
        out["tool_choice"] = {**tc, "name": name}
    if has_server_blocks(body):
        out["messages"] = rewrite_history(body["messages"], name, plan.fetch_name, cite)
    out["messages"] = citations.without_citations(out["messages"])  # an earlier answer's cited text blocks
    return out, plan


def _client_has(tools, name) -> bool:
    return any(isinstance(t, dict) and not is_server_tool(t) and t.get("name") == name for t in tools or [])


def rewrite_history(messages: list[dict], name: str, fetch_name: str = FETCH_NAME, cite: bool = True) -> list[dict]:
    """Replayed server blocks as blocks vLLM accepts (`name`, `fetch_name`: the tools' names on
    the vLLM side). Pure.

    Anthropic keeps a search's (or fetch's) `server_tool_use` and its result in the assistant message;
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
                or not any(V.kind(b) in SERVER_BLOCKS for b in content):
            out.append(msg)
            continue
        queries = {b.get("id"): str((as_dict(b.get("input"))).get("query", ""))
                   for b in content if isinstance(b, dict) and b.get("type") == "server_tool_use"}
        ids = set(queries)
        # Numbered as when this answer was made (one counter per answer, pages only when they were cited), so the
        # model reads the same text again (CITATIONS=off: unnumbered, as then).
        sources = citations.Sources() if cite else None
        seg: list[dict] = []
        results: list[dict] = []
        for b in content:
            kind = V.kind(b)
            if kind == "server_tool_use":
                if results and not _pending(seg, results, ids):
                    out += [{**msg, "content": seg}, {"role": "user", "content": _complete(seg, results, ids)}]
                    seg, results = [], []
                tool = fetch_name if b.get("name") == FETCH_NAME else name
                seg.append({"type": "tool_use", "id": b.get("id"), "name": tool, "input": b.get("input") or {}})
            elif kind in ("web_search_tool_result", "web_fetch_tool_result"):
                tid = b.get("tool_use_id")
                text = replayed_text(b.get("content"), sources) if kind == "web_fetch_tool_result" \
                    else citations.numbered(sources, outcome := outcome_from_block(queries.get(tid, ""), b.get("content")),
                                            format_for_model(outcome))
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
                                       "content": "No result was recorded for this call."}
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
    return base64.b64encode(codec.dumps(data)).decode()


def decode_content(text) -> dict:
    """What encode_content() stored, or {} for anything else (Anthropic's real ciphertext)."""
    try:
        data = codec.loads(base64.b64decode(str(text), validate=True))
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
        if i == 0:  # what encode_content stored, or whatever a client put in its place
            answers, infoboxes = ([str(a) for a in as_list(extra.get(k))] for k in ("answers", "infoboxes"))
        hits.append(Hit(title=str(r.get("title") or r["url"]), url=str(r["url"]),
                        snippet=str(extra.get("snippet") or ""), date=r.get("page_age")))
    if hits or answers or infoboxes:
        return SearchOutcome(query, "ok", hits=hits, answers=answers, infoboxes=infoboxes)
    return SearchOutcome(query, "empty", message=f'No results for "{query}". Try different keywords.')


def fetch_content(outcome: FetchOutcome, citations: dict | None = None) -> dict:
    """The `content` of a web_fetch_tool_result: the page as a plain-text document, or the error
    (BetaWebFetchBlock / BetaWebFetchToolResultErrorBlock). Pure."""
    page = outcome.page
    if page is None:
        return {"type": "web_fetch_tool_result_error", "error_code": outcome.error_code or "unavailable"}
    doc: dict = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": page.text},
                 "title": page.title}
    if citations is not None:
        # Echoed as asked; the proxy writes no citation blocks into the model's text.
        doc["citations"] = {"enabled": bool(citations.get("enabled"))}
    return {"type": "web_fetch_result", "url": page.url, "retrieved_at": page.retrieved_at, "content": doc}


def fetch_result_block(tool_use_id: str, outcome: FetchOutcome, citations: dict | None = None) -> dict:
    return {"type": "web_fetch_tool_result", "tool_use_id": tool_use_id, "content": fetch_content(outcome, citations)}


def fetch_text(content, message: str | None = None) -> str:
    """What the model reads for a web_fetch result, made from the block's content alone, so a
    replayed page gives the model back exactly the text it read (and vLLM's prefix cache still
    matches). An error reads as `message` (the live sentence) or its code's sentence. Pure."""
    content = as_dict(content)
    if content.get("type") != "web_fetch_result":
        code = str(content.get("error_code") or "unavailable")
        return message or FETCH_ERROR_TEXT.get(code, f"Fetch failed: {code}.")
    doc = as_dict(content.get("content"))
    source = as_dict(doc.get("source"))
    # Anthropic's own replayed PDFs come as base64: not text the local model could read.
    data = str(source.get("data") or "") if source.get("type") == "text" else "(a PDF document the proxy cannot show)"
    title = doc.get("title")
    head = f"Page {content.get('url')}" + (f' "{title}"' if title else "")
    return head + (f"\nRetrieved {content['retrieved_at']}" if content.get("retrieved_at") else "") + "\n\n" + data


def replayed_text(content, sources: citations.Sources | None) -> str:
    """A replayed web_fetch result's text, numbered as it was when its document had citations enabled."""
    text, doc = fetch_text(content), as_dict(as_dict(content).get("content"))
    if sources is None or as_dict(doc.get("citations")).get("enabled") is not True:
        return text
    return sources.number_document(str(as_dict(content).get("url") or ""), doc.get("title"),
                                   str(as_dict(doc.get("source")).get("data") or ""), text)


def model_text(outcome) -> str:
    """The tool_result text of one call of a round: a search's results or a fetch's page."""
    if not isinstance(outcome, FetchOutcome):
        return format_for_model(outcome)
    text = fetch_text(fetch_content(outcome), outcome.message or None)
    return text + CUT_NOTE if outcome.page is not None and outcome.page.truncated else text


def fetch_request(arguments, fp: FetchPlan) -> FetchRequest:
    """A web_fetch call as the fetch core runs it, with the tool's limits. Pure."""
    return replace(parse_fetch_arguments(arguments), max_tokens=fp.max_tokens,
                   allowed_domains=fp.allowed, blocked_domains=fp.blocked)


def client_id(vllm_id) -> str:
    tail = re.sub(r"[^A-Za-z0-9]", "", re.split(r"[-_]", str(vllm_id or ""))[-1])
    return "srvtoolu_" + (tail or uuid.uuid4().hex[:24])


def server_use_block(call: dict, name: str = SERVER_NAME) -> dict:
    return {"type": "server_tool_use", "id": client_id(call.get("id")), "name": name,
            "input": as_dict(call.get("input"))}


def counts_as_search(block: dict) -> bool:
    """Claude Code's rule for "Did N searches": a result block whose content is a list."""
    return block.get("type") == "web_search_tool_result" and isinstance(block.get("content"), list)


def counts_as_fetch(block: dict) -> bool:
    """web_fetch_requests counts pages fetched, as web_search_requests counts searches that ran."""
    return block.get("type") == "web_fetch_tool_result" and as_dict(block.get("content")).get("type") == "web_fetch_result"


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


def with_searches(usage: dict | None, requests: int, fetches: int | None = None) -> dict:
    """Usage with server_tool_use, both counts always: anthropic 2.16's ServerToolUsage requires
    web_search_requests and web_fetch_requests, and Anthropic always sends both."""
    counts = {"web_search_requests": requests, "web_fetch_requests": fetches or 0}
    return {**(usage or {"input_tokens": 0, "output_tokens": 0}), "server_tool_use": counts}


def next_request(body: dict, messages: list[dict], plan: Plan) -> dict:
    """The following turn: longer history; a choice that forces searching is relaxed after the
    first round so the model writes its answer instead of searching forever."""
    out = {**body, "messages": messages}
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and ((tc.get("type") == "tool" and tc.get("name") in plan.ours() | {plan.name})
                                 or (tc.get("type") == "any" and not plan.client_tools)):
        out["tool_choice"] = {k: v for k, v in tc.items() if k == "disable_parallel_tool_use"} | {"type": "auto"}
    return out


def tool_results(calls: list[dict], searches: list[dict], outcomes: list,
                 sources: citations.Sources | None = None, pages: bool = False) -> dict:
    """The user turn answering every tool call of a search turn: results, pages, or not-executed (`sources`:
    numbered for citing, pages only when web_fetch has citations enabled)."""
    text = {id(c): citations.numbered(sources, o, model_text(o), pages) for c, o in zip(searches, outcomes, strict=True)}
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.get("id"),
                                         "content": text.get(id(c), NOT_EXECUTED)} for c in calls]}


def shortcut_turn(query: str, plan: Plan) -> list[dict]:
    """The tool call the model would have written for Claude Code's sub-request."""
    return [{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": plan.name, "input": {"query": query}}]


# ---- the handler -----------------------------------------------------------------------------

def handle(ex: Exchange) -> Response:
    try:
        body = codec.loads(ex.body)
    except (ValueError, UnicodeDecodeError):
        return ex.relay()  # not ours to judge: vLLM says what is wrong, as it always did
    renamed = False
    if ex.cfg.anthropic_any_model and isinstance(body, dict):
        model = served_model_for(body.get("model"), ex.services.models.get(ex))
        if model:
            body["model"], renamed = model, True
    if not needs_rewrite(body):
        return ex.relay(codec.dumps(body)) if renamed else ex.relay()
    problem = validate(body)
    if problem:
        return anthropic_error(400, problem)
    vbody, plan = rewrite(body, ex.cfg.citations)
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
    """What both kinds of Messages request share: the server tools' searches and fetches
    (max_uses, domain filters, the counts in usage.server_tool_use), their blocks, the next request."""

    def __init__(self, ex: Exchange, body: dict, plan: Plan, first: _Blocks | None):
        super().__init__(ex, body)
        self.path = ex.target  # the client's own path and query (Claude Code's `?beta=true`)
        self.body, self.plan, self.first_turn = body, plan, first
        self.messages = list(body["messages"])
        self.limit = ex.cfg.searxng_results
        self.used = 0          # searches asked for, against max_uses
        self.requests = 0      # searches that count as done (web_search_requests)
        self.fetch_used = 0    # fetches asked for, against web_fetch's max_uses
        self.fetches = 0       # pages fetched (web_fetch_requests)
        self.usage: dict | None = None
        self.uses: list[dict] = []  # the server_tool_use blocks of the round under way

    def searches(self, turn: _Blocks) -> list:
        # Only the server tools in `tools`: with only replayed history rewritten, the model has none.
        ours = self.plan.ours()
        return [b for b in turn.blocks if b.get("type") == "tool_use" and b.get("name") in ours]

    def is_fetch(self, call: dict) -> bool:
        return self.plan.fetch is not None and call.get("name") == self.plan.fetch_name

    def search(self, calls: list) -> list:
        """One round: the searches and fetches within max_uses run together on the session (one
        round of MAX_SEARCH_ITER, even when every call is over max_uses); outcomes in call order."""
        out: list = [None] * len(calls)
        items: list = []
        at: list[int] = []
        for i, c in enumerate(calls):
            refused = self.over_max_uses(c)
            if refused is not None:
                out[i] = refused
                continue
            fp = self.plan.fetch if self.is_fetch(c) else None
            items.append(fetch_request(c.get("input"), fp) if fp else parse_arguments(c.get("input")))
            at.append(i)
        for i, o in zip(at, self.session.run(items, limit=self.limit), strict=True):
            out[i] = o if isinstance(o, FetchOutcome) else filter_domains(o, self.plan.allowed, self.plan.blocked)
        return out

    def over_max_uses(self, call: dict) -> FetchOutcome | SearchOutcome | None:
        """The max_uses_exceeded outcome of a call past its tool's max_uses (counting it), or None."""
        if self.is_fetch(call):
            self.fetch_used += 1
            limit = self.plan.fetch.max_uses if self.plan.fetch else None
            if limit is None or self.fetch_used <= limit:
                return None
            return FetchOutcome(fetch_request(call.get("input"), FetchPlan()).url, error_code="max_uses_exceeded", message=(
                f"Not fetched: this request allows at most {limit} fetches (max_uses) and they are used up. "
                "Answer from the pages you already have."))
        self.used += 1
        if self.plan.max_uses is None or self.used <= self.plan.max_uses:
            return None
        return SearchOutcome(parse_arguments(call.get("input"))[0] or "", "failed", error_code="max_uses_exceeded", message=(
            f"Not searched: this request allows at most {self.plan.max_uses} searches (max_uses) and "
            "they are used up. Answer from the results you already have."))

    def announce(self, calls: list):
        self.uses = [server_use_block(c, FETCH_NAME if self.is_fetch(c) else SERVER_NAME) for c in calls]
        return ()

    def results(self, outcomes: list) -> list[dict]:
        """The web_search_tool_result and web_fetch_tool_result blocks answering this round's
        server_tool_use blocks."""
        citations = self.plan.fetch.citations if self.plan.fetch else None
        results = [fetch_result_block(u["id"], o, citations) if isinstance(o, FetchOutcome) else result_block(u["id"], o)
                   for u, o in zip(self.uses, outcomes, strict=True)]
        self.requests += sum(counts_as_search(r) for r in results)
        self.fetches += sum(counts_as_fetch(r) for r in results)
        return results

    @property
    def cites_pages(self) -> bool:
        """Fetched pages are cited (char_location) only when web_fetch asks for it, as at Anthropic."""
        return bool(self.plan.fetch and as_dict(self.plan.fetch.citations).get("enabled") is True)

    def cited(self, blocks: list[dict]) -> list[dict]:
        """The text blocks with the citations their markers name (proxy.citations); others as they were."""
        shape = citations.anthropic_shape(self.cites_pages)
        out = []
        for b in blocks:
            found = citations.cite_text(b["text"], self.sources, shape) \
                if b.get("type") == "text" and isinstance(b.get("text"), str) else []
            out.append({**b, "citations": list(b.get("citations") or []) + found} if found else b)
        return out

    def usage_total(self) -> dict:
        return with_searches(self.usage, self.requests, self.fetches if self.plan.fetch else None)

    def follow(self, turn: _Blocks, calls: list, outcomes: list):
        self.messages = self.messages + [{"role": "assistant", "content": turn.blocks},
                                         tool_results(turn_calls(turn.blocks), calls, outcomes, self.sources,
                                                      self.cites_pages)]
        self.request = next_request(self.body, self.messages, self.plan)

    def error_reply(self, status, message, type_=None) -> Response:
        return anthropic_error(status, message)  # Anthropic's error types follow the status

    def vllm_reply(self, up, raw) -> Response:
        return vllm_reply(up, raw)


class PlainMessages(loop.Plain, _Messages):
    """Non-streaming: one message holding every search's and fetch's blocks and the model's text."""

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
        data["id"], data["content"] = self.ident, self.cited(self.content + turn.blocks)  # one message, as the stream says
        data["usage"] = self.usage_total()
        yield Response(codec.dumps(data), status=200, mimetype="application/json")

    def record(self, turn: _Blocks, calls, outcomes):
        # The model's own words of a search turn stay; its tool calls become server blocks.
        self.content += [b for b in turn.blocks if b.get("type") != "tool_use"] + self.uses + self.results(outcomes)
        self.follow(turn, calls, outcomes)
        return ()


class StreamedMessages(loop.Stream, _Messages):
    """Streaming: vLLM's events live, each search and fetch shown as server-tool blocks with `ping`
    events while it runs, the whole reply one well-formed Anthropic message."""

    name = "messages stream"
    headers = SSE_HEADERS

    def __init__(self, ex, body, plan, first):
        super().__init__(ex, body, plan, first)
        self.out = ClientMessage()
        if self.sources is not None:
            self.out.citer = citations.Citer(self.sources, citations.anthropic_shape(self.cites_pages))

    def relay(self, up):
        turn = yield from self.out.relay(up)
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
