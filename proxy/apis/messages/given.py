"""What an Anthropic Messages request body gives web_fetch, pure (issue 33): its parts in order, each with who
wrote it (proxy/tools/provenance.py's Given). The system prompt, the user's text and documents, client tool
results (Claude Code's own tools), and the results of earlier web_search and web_fetch calls give URLs; the
model's text, thinking and tool inputs give none. Tested by tests/test_provenance.py.
"""
from __future__ import annotations

from proxy.apis.given import client_given, user_given
from proxy.core.codec import as_dict
from proxy.tools.provenance import MODEL, PAGE, READ, Given

SEARCH_RESULTS = "web_search_tool_result"
FETCH_RESULT = "web_fetch_tool_result"


def given(body) -> tuple[list[Given], list[tuple[str, str]]]:
    """(the request's parts as Given, in order; the pages earlier web_fetch results hold, as (url, text), whose
    links the Ledger learns as links: budgeted, like this request's own). Pure."""
    body = as_dict(body)
    out: list[Given] = client_given("system", body.get("system"))
    pages: list[tuple[str, str]] = []
    messages = body.get("messages")
    for msg in messages if isinstance(messages, list) else []:
        msg = as_dict(msg)
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [content]
        if msg.get("role") == "user":  # a person's words, client tool results and what a client generated
            out.extend(user_given(blocks))
        elif msg.get("role") == "assistant":
            for block in blocks:
                out.extend(_assistant(as_dict(block), pages) if isinstance(block, dict) else [Given(MODEL, block)])
    return out, pages


def given_parts(body) -> list[Given]:
    """given()'s parts, then each page as a PAGE part: the links of pages read in earlier requests are links, within
    this request's budget, and the client's memory keeps none of them (the history resends them). Pure."""
    parts, pages = given(body)
    return [*parts, *(Given(PAGE, page) for page in pages)]


def _assistant(block: dict, pages: list) -> list[Given]:
    kind = block.get("type")
    if kind == SEARCH_RESULTS:
        results = block.get("content")
        return [Given("search", [as_dict(r).get("url") for r in results] if isinstance(results, list) else [])]
    if kind == FETCH_RESULT:
        result = as_dict(block.get("content"))
        url = result.get("url")
        if not isinstance(url, str):
            return []
        source = as_dict(as_dict(result.get("content")).get("source"))
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            pages.append((url, source["data"]))
        return [Given(READ, url)]  # read earlier: at the depth it was read at
    # The model's own blocks (text, thinking, tool_use, server_tool_use) allow nothing; the citations the proxy put
    # on a text block name what searches and fetches gave.
    cites = block.get("citations")
    urls = [as_dict(c).get("url") for c in cites] if isinstance(cites, list) else []
    return [Given(MODEL, {k: v for k, v in block.items() if k != "citations"}), Given(READ, urls)]
