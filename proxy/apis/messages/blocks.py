"""The server-tool blocks a /v1/messages client sees and what the model reads from them, live or
replayed (web_search and web_fetch results, `encrypted_content`, what counts in usage), which the presentation
table (presentation.py) names per tool; pure, tested by
tests/run.sh tests/test_messages.py tests/test_messages_fetch.py.
"""
from __future__ import annotations

import base64
import binascii
import re
import uuid

from proxy.core import codec
from proxy.core.codec import as_dict, as_list
from proxy.tools.base import Outcome
from proxy.tools.sources import Sources
from proxy.tools.web_fetch import FetchOutcome, removed_note
from proxy.tools.web_search import Hit, SearchOutcome, format_for_model

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


# ---- search results and `encrypted_content` -------------------------------------------------

def encode_content(hit: Hit, outcome: SearchOutcome | None = None) -> str:
    """`encrypted_content`: NOT encrypted, base64 of compact JSON holding the snippet (and, on a
    search's first result, everything else the model read: the query as searched, its answers and
    infoboxes, the notes on how the results came, the cache's age, the repeat warning), so a
    replayed result gives the model back exactly the text it read the first time, and vLLM's
    prefix cache still matches it."""
    data: dict[str, object] = {"snippet": hit.snippet}
    if outcome is not None:
        data["query"] = outcome.query
        for key in ("answers", "infoboxes", "notes"):
            if getattr(outcome, key):
                data[key] = getattr(outcome, key)
        if outcome.cached_age is not None:
            # Whole seconds, as cached_note shows them: the replay prints the same number.
            data["cached_age"] = round(outcome.cached_age)
        if outcome.repeated:
            data["repeated"] = True
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
    """A replayed web_search_tool_result read back into the outcome it was made from (`query`: the
    server_tool_use's, unless the first result kept the one searched). Pure."""
    if isinstance(content, dict):
        code = content.get("error_code") or "unavailable"
        return SearchOutcome(query, "failed", message=ERROR_TEXT.get(code, f"Search failed: {code}."), error_code=code)
    hits: list[Hit] = []
    first: dict = {}
    for i, r in enumerate(content if isinstance(content, list) else []):
        if not isinstance(r, dict) or not r.get("url"):
            continue
        extra = decode_content(r.get("encrypted_content"))
        if i == 0:  # what encode_content stored, or whatever a client put in its place
            first = extra
        hits.append(Hit(title=str(r.get("title") or r["url"]), url=str(r["url"]),
                        snippet=str(extra.get("snippet") or ""), date=r.get("page_age")))
    answers, infoboxes, notes = ([str(a) for a in as_list(first.get(k))] for k in ("answers", "infoboxes", "notes"))
    if hits or answers or infoboxes:
        age = first.get("cached_age")
        return SearchOutcome(str(first.get("query") or query), "ok", hits=hits, answers=answers, infoboxes=infoboxes,
                             notes=notes, repeated=first.get("repeated") is True,
                             cached_age=float(age) if isinstance(age, (int, float)) and not isinstance(age, bool) else None)
    return SearchOutcome(query, "empty", message=f'No results for "{query}". Try different keywords.')


def search_text(outcome: SearchOutcome, query: str) -> str:
    """What the model reads for a search (`query`: the call's, as its server_tool_use block keeps it). Results read
    as their web_search_tool_result block replays them, so a later request that replays the block reads the same
    bytes and vLLM's prefix cache still matches from there on. A failed or empty search reads its own sentence: its
    block has no room for it, so the handler keeps it (kept_text) for the replays. Pure."""
    if outcome.status != "ok":
        return format_for_model(outcome)
    return format_for_model(outcome_from_block(query, result_block("", outcome)["content"]))


def kept_text(outcome: Outcome) -> bool:
    """Whether a result's text cannot be rebuilt from its block (a failure's own sentence, an empty search's), so
    the handler keeps it by the block's id for the replays (history.rewrite_history's `kept`). Pure."""
    return outcome.status != "ok"


def input_query(block: dict) -> str:
    """The query of a tool_use or server_tool_use block as the replay reads it."""
    return str(as_dict(block.get("input")).get("query", ""))


# ---- fetched pages --------------------------------------------------------------------------

def document_text(outcome: FetchOutcome) -> str:
    """A page's text as its document holds it: the page, then what the model must know of how it came (what of
    it a person would not see was taken out, that it was cut short), after the text so char locations into the
    page still hold. Kept in the document so a replayed page reads as the live one did. Pure."""
    page = outcome.page
    if page is None:
        return ""
    note = removed_note(page)
    return page.text + (f"\n\n{note}" if note else "") + (CUT_NOTE if outcome.truncated else "")


def fetch_content(outcome: FetchOutcome, citations: dict | None = None) -> dict:
    """The `content` of a web_fetch_tool_result: the page as a plain-text document, or the error
    (BetaWebFetchBlock / BetaWebFetchToolResultErrorBlock). Pure."""
    page = outcome.page
    if page is None:
        return {"type": "web_fetch_tool_result_error", "error_code": outcome.error_code or "unavailable"}
    doc: dict = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                "data": document_text(outcome)},
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
    matches). An error reads as `message` (the live sentence, which the handler keeps for the
    replays: the error block has room only for its code) or its code's sentence. Pure."""
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


def replayed_text(content, sources: Sources | None) -> str:
    """A replayed web_fetch result's text, numbered as it was when its document had citations enabled."""
    text, doc = fetch_text(content), as_dict(as_dict(content).get("content"))
    if sources is None or as_dict(doc.get("citations")).get("enabled") is not True:
        return text
    return sources.number_document(str(as_dict(content).get("url") or ""), doc.get("title"),
                                   str(as_dict(doc.get("source")).get("data") or ""), text)


def fetch_model_text(outcome: FetchOutcome) -> str:
    """What the model reads for a web_fetch call: the text its block replays to, so a replayed page reads the same."""
    return fetch_text(fetch_content(outcome), outcome.message or None)


# ---- the server_tool_use blocks, the counts in usage, the model's tool_result turn ------------

def client_id(vllm_id) -> str:
    tail = re.sub(r"[^A-Za-z0-9]", "", re.split(r"[-_]", str(vllm_id or ""))[-1])
    return "srvtoolu_" + (tail or uuid.uuid4().hex[:24])


def server_use_block(call: dict, name: str) -> dict:
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


def turn_calls(turn: list[dict]) -> list[dict]:
    return [b for b in turn if b.get("type") == "tool_use"]
