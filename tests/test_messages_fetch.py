"""Anthropic's web_fetch server tool (web_fetch_20250910) on /v1/messages, played by the proxy: the
pure block builders checked against the anthropic SDK's own types, then the real proxy under
gunicorn, driven with the SDK, seen from the vLLM stand-in and the loopback web site.

Run: tests/run.sh tests/test_messages_fetch.py -q
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid

import pytest
from clients import anthropic
from test_chat_fetch import FACT, PAGE
from test_faults import post_raw, read_until

from proxy.apis.messages.blocks import (
    CUT_NOTE,
    FETCH_ERROR_TEXT,
    fetch_content,
    fetch_result_block,
    fetch_text,
)
from proxy.apis.messages.history import rewrite_history
from proxy.apis.messages.presentation import model_text, with_counts
from proxy.apis.messages.request import ToolPlan, needs_rewrite, next_request, rewrite, validate
from proxy.tools.base import Limits
from proxy.tools.web_fetch import FETCH_TOOL_DESCRIPTION, URL_SCHEMA, FetchOutcome, Page
from standins import anthropic_wire as W
from standins.scripted_backend import Reply

SEARCH = {"type": "web_search_20250305", "name": "web_search"}
FETCH = {"type": "web_fetch_20250910", "name": "web_fetch"}
ASK = [{"role": "user", "content": "What does the vLLM changelog say?"}]
VLLM_FETCH_TOOL = {"name": "web_fetch", "description": FETCH_TOOL_DESCRIPTION, "input_schema": URL_SCHEMA}
PAGE_OUTCOME = FetchOutcome("https://docs.example/a", page=Page(
    url="https://docs.example/a", title="Changelog", text="vLLM 0.32 adds things.", content_type="text/html",
    retrieved_at="2026-12-03T16:20:00Z", truncated=False))


# ---- pure rules ------------------------------------------------------------------------------

@pytest.mark.parametrize("body,expected", [
    ({"messages": ASK, "tools": [FETCH]}, True),
    # Later versions (the SDK knows _20260209, _20260309, _20260318) are served as this one.
    ({"messages": ASK, "tools": [{"type": "web_fetch_20260318", "name": "web_fetch", "use_cache": False}]}, True),
    # Claude Code's WebFetch, and a client's own web_fetch, are ordinary tools.
    ({"messages": ASK, "tools": [{"name": "WebFetch", "input_schema": {"type": "object"}}]}, False),
    ({"messages": ASK, "tools": [{"name": "web_fetch", "input_schema": {"type": "object"}}]}, False),
    ({"messages": ASK + [{"role": "assistant", "content": [
        {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {}}]}]}, True),
])
def test_which_requests_are_rewritten(body, expected):
    assert needs_rewrite(body) is expected


def test_the_tool_vllm_sees_and_the_plan():
    mine = {"name": "web_fetch", "input_schema": {"type": "object"}}
    body = {"messages": ASK, "tools": [SEARCH, mine, {**FETCH, "max_uses": 2, "max_content_tokens": 50,
                                                      "allowed_domains": ["docs.example"], "citations": {"enabled": True}}]}
    out, plan = rewrite(body)
    assert out["tools"][0]["name"] == "web_search" and out["tools"][1] == mine
    assert out["tools"][2] == {"name": "web_fetch_server", "input_schema": URL_SCHEMA,
                               "description": FETCH_TOOL_DESCRIPTION + " Only pages on these domains can be fetched: docs.example."}
    assert plan.offered["web_fetch_server"] == ToolPlan("web_fetch", "web_fetch_server", max_uses=2,
                                                        limits=Limits(("docs.example",), (), 50),
                                                        citations={"enabled": True})
    assert plan.ours() == {"web_search", "web_fetch_server"} and plan.client_tools
    assert rewrite({"messages": ASK, "tools": [FETCH]})[0]["tools"] == [VLLM_FETCH_TOOL]
    later = {"type": "web_fetch_20260318", "name": "web_fetch", "use_cache": False}  # its extra options are ignored
    assert rewrite({"messages": ASK, "tools": [later]})[0]["tools"] == [VLLM_FETCH_TOOL]


@pytest.mark.parametrize("tool_choice,expected", [
    ({"type": "tool", "name": "web_fetch"}, {"type": "auto"}),
    ({"type": "any"}, {"type": "auto"}),
    ({"type": "auto"}, {"type": "auto"}),
])
def test_a_forced_fetch_is_forced_once(tool_choice, expected):
    _, plan = rewrite({"messages": ASK, "tools": [FETCH]})
    assert next_request({"tool_choice": tool_choice}, [], plan)["tool_choice"] == expected


def test_a_client_web_fetch_forced_stays_forced():
    mine = {"name": "web_fetch", "input_schema": {"type": "object"}}
    _, plan = rewrite({"messages": ASK, "tools": [mine, FETCH]})
    tc = {"type": "tool", "name": "web_fetch"}  # the client's own tool: its calls go back to the client
    assert next_request({"tool_choice": tc}, [], plan)["tool_choice"] == tc


@pytest.mark.parametrize("spec,problem", [
    ({"allowed_domains": ["a.example"], "blocked_domains": ["b.example"]}, "web_fetch may have allowed_domains or blocked_domains, not both"),
    ({"max_uses": 0}, "web_fetch max_uses must be a positive integer"),
    ({"max_content_tokens": "500"}, "web_fetch max_content_tokens must be a positive integer"),
    ({"blocked_domains": "b.example"}, "web_fetch blocked_domains must be an array"),
    ({"citations": True}, "web_fetch citations must be an object"),
    ({"max_uses": 3, "max_content_tokens": 100, "citations": {"enabled": False}}, None),
])
def test_validate_the_fetch_tools_options(spec, problem):
    got = validate({"messages": ASK, "tools": [{**FETCH, **spec}]})
    assert (got is None) if problem is None else (problem in got), got


@pytest.mark.parametrize("citations,expected", [(None, None), ({"enabled": True}, {"enabled": True}),
                                                ({"enabled": False}, {"enabled": False})])
def test_page_block_is_the_sdks_web_fetch_result(citations, expected):
    block = fetch_result_block("srvtoolu_1", PAGE_OUTCOME, citations)
    assert block == {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {
        "type": "web_fetch_result", "url": "https://docs.example/a", "retrieved_at": "2026-12-03T16:20:00Z",
        "content": {"type": "document", "title": "Changelog",
                    "source": {"type": "text", "media_type": "text/plain", "data": "vLLM 0.32 adds things."},
                    **({"citations": expected} if expected else {})}}}
    parsed = anthropic.types.beta.BetaWebFetchToolResultBlock.model_validate(block)  # validated, not just constructed
    assert isinstance(parsed.content, anthropic.types.beta.BetaWebFetchBlock) and parsed.content.content.source.data == "vLLM 0.32 adds things."


CODES = ["url_not_accessible", "url_not_allowed", "unsupported_content_type", "too_many_requests",
         "max_uses_exceeded", "invalid_tool_input", "url_too_long", "unavailable"]


@pytest.mark.parametrize("code", CODES)
def test_error_block_is_the_sdks_error_and_replays_as_a_sentence(code):
    block = fetch_result_block("srvtoolu_1", FetchOutcome("https://x.example", error_code=code, message="live words"))
    assert block["content"] == {"type": "web_fetch_tool_result_error", "error_code": code}
    parsed = anthropic.types.beta.BetaWebFetchToolResultBlock.model_validate(block)
    assert isinstance(parsed.content, anthropic.types.beta.BetaWebFetchToolResultErrorBlock) and parsed.content.error_code == code
    # The error block has no room for the live sentence: the handler keeps it for the replays (test below); a
    # replay it no longer keeps reads the code's sentence.
    assert model_text(FetchOutcome("https://x.example", error_code=code, message="live words")) == "live words"
    assert fetch_text(block["content"], "live words") == "live words"
    assert fetch_text(block["content"]) == FETCH_ERROR_TEXT[code]


def test_a_replayed_page_gives_the_model_the_same_text():
    live = model_text(PAGE_OUTCOME)
    assert live == 'Page https://docs.example/a "Changelog"\nRetrieved 2026-12-03T16:20:00Z\n\nvLLM 0.32 adds things.'
    assert fetch_text(fetch_content(PAGE_OUTCOME, {"enabled": True})) == live
    cut = FetchOutcome(PAGE_OUTCOME.url, page=Page(**{**PAGE_OUTCOME.page.__dict__, "truncated": True}))
    assert model_text(cut) == live + CUT_NOTE  # live, the model is told; and the document keeps it for the replay
    assert fetch_text(fetch_content(cut)) == model_text(cut)
    hidden = FetchOutcome(PAGE_OUTCOME.url, page=Page(**{**PAGE_OUTCOME.page.__dict__, "truncated": True,
                                                         "invisible": 2, "hidden": 1}))
    assert model_text(hidden) == live + "\n\n(2 invisible characters removed, 1 hidden element removed: text a " \
        "person viewing the page does not see)" + CUT_NOTE
    assert fetch_text(fetch_content(hidden)) == model_text(hidden)


FSTU = {"type": "server_tool_use", "id": "srvtoolu_f", "name": "web_fetch", "input": {"url": "https://docs.example/a"}}
FRES = fetch_result_block("srvtoolu_f", PAGE_OUTCOME)


def test_replayed_fetch_blocks_become_tool_use_and_tool_result():
    history = [{"role": "assistant", "content": [FSTU, FRES, {"type": "text", "text": "so"}]},
               {"role": "user", "content": "more"}]
    assert rewrite_history(history, {"web_search": "web_search", "web_fetch": "web_fetch_server"}) == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "srvtoolu_f", "name": "web_fetch_server",
                                           "input": {"url": "https://docs.example/a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "srvtoolu_f",
                                      "content": model_text(PAGE_OUTCOME)}]},
        {"role": "assistant", "content": [{"type": "text", "text": "so"}]},
        {"role": "user", "content": "more"}]


@pytest.mark.parametrize("fetches,expected", [
    (None, {"web_search_requests": 2, "web_fetch_requests": 0}),  # both always: anthropic 2.16 requires both
    (1, {"web_search_requests": 2, "web_fetch_requests": 1}),
])
def test_usage_counts_fetches(fetches, expected):
    counts = {"web_search_requests": 2} | ({"web_fetch_requests": fetches} if fetches is not None else {})
    assert with_counts({"input_tokens": 1, "output_tokens": 2}, counts)["server_tool_use"] == expected


# ---- through the proxy -----------------------------------------------------------------------

@pytest.fixture
def fetching(start_proxy):
    """A proxy that may fetch from loopback, as a LAN allow-list would let it."""
    return start_proxy(KEEPALIVE_INTERVAL="0.2", WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", WEB_FETCH_URLS="any")


def sdk(proxy):
    return anthropic.Anthropic(base_url=proxy.url, api_key="dummy", max_retries=0, timeout=30)


def reply(blocks, stream, **kw):
    return W.stream_reply(blocks, **kw) if stream else W.message_reply(blocks, **kw)


def ask(proxy, stream, **kw) -> anthropic.types.beta.BetaMessage:
    """One request through the SDK's beta API (its web_fetch types); streamed ones go through its accumulator."""
    kw = {"model": "foundation", "max_tokens": 512, "messages": ASK, **kw}
    if stream:
        with sdk(proxy).beta.messages.stream(**kw) as s:
            return s.get_final_message()
    return sdk(proxy).beta.messages.create(**kw)


def fresh(path: str) -> str:
    """A path no earlier test used: the proxy's page cache outlives a test."""
    return f"/{uuid.uuid4().hex[:8]}{path}"


def turns(backend):
    return [r for r in backend.received if r.path.startswith("/v1/messages")]


def last_results(request) -> list[str]:
    """The tool_result texts of the last user turn vLLM got."""
    return [b["content"] for b in request.json()["messages"][-1]["content"] if b["type"] == "tool_result"]


def kinds(msg) -> list[str]:
    return [b.type for b in msg.content]


@pytest.mark.parametrize("stream", [False, True])
def test_search_then_fetch_then_answer(fetching, backend, searxng, site, stream):
    path = fresh("/changelog")
    site.route(path, PAGE)
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(reply([W.thinking("search first"), W.tool_use("web_search", {"query": "vllm changelog"})], stream,
                         input_tokens=100, output_tokens=10),
                   reply([W.tool_use("web_fetch", {"url": url})], stream, input_tokens=200, output_tokens=10),
                   reply([W.text(["It adds ", "prefix caching."])], stream, input_tokens=900, output_tokens=5))
    msg = ask(fetching, stream, tools=[SEARCH, FETCH])
    # The client's view: one message, each tool's server_tool_use and result, the answer, both counts.
    assert kinds(msg) == ["thinking", "server_tool_use", "web_search_tool_result",
                          "server_tool_use", "web_fetch_tool_result", "text"]
    use, res = msg.content[3], msg.content[4]
    assert use.name == "web_fetch" and use.input == {"url": url} and use.id.startswith("srvtoolu_")
    assert isinstance(res, anthropic.types.beta.BetaWebFetchToolResultBlock) and res.tool_use_id == use.id
    assert isinstance(res.content, anthropic.types.beta.BetaWebFetchBlock) and res.content.url == url
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", res.content.retrieved_at)
    doc = res.content.content
    assert (doc.type, doc.title, doc.source.type, doc.source.media_type) == ("document", "Changelog", "text", "text/plain")
    assert FACT in doc.source.data and "Sponsors" not in doc.source.data
    assert msg.content[5].text == "It adds prefix caching."
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (1200, 25)
    assert (msg.usage.server_tool_use.web_search_requests, msg.usage.server_tool_use.web_fetch_requests) == (1, 1)
    # The site's view: one GET of the page; SearXNG's: the search.
    assert [r.path for r in site.requests] == [path] and searxng.queries == ["vllm changelog"]
    # vLLM's view: both tools as ordinary tools, then the page's text as the fetch's tool result.
    first, _, third = turns(backend)
    assert first.json()["tools"][1] == VLLM_FETCH_TOOL
    (told,) = last_results(third)
    assert told == f'Page {url} "Changelog"\nRetrieved {res.content.retrieved_at}\n\n{doc.source.data}'


def test_a_pdf_is_a_document_of_its_text(fetching, backend, site):
    """A PDF comes back as the text the model read (a text source), with its title: Anthropic sends a base64 source,
    but a replayed base64 document would read back as no text (messages_blocks.fetch_text)."""
    from standins import pdf_files
    path = fresh("/paper.pdf")
    site.route(path, pdf_files.build([pdf_files.text_page("Abstract", "We read PDFs."), pdf_files.text_page("Two")],
                                     title="A paper"), headers={"Content-Type": "application/pdf"})
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(reply([W.tool_use("web_fetch", {"url": url})], False), reply([W.text(["Read."])], False))
    msg = ask(fetching, False, tools=[FETCH])
    doc = msg.content[1].content.content
    assert (doc.type, doc.title, doc.source.type, doc.source.media_type) == ("document", "A paper", "text", "text/plain")
    assert doc.source.data == "PDF, 2 pages.\n\n[page 1]\nAbstract\nWe read PDFs.\n\n[page 2]\nTwo"
    (told,) = last_results(turns(backend)[1])
    assert told.endswith(doc.source.data)


def test_stream_shows_the_fetch_live_as_its_own_blocks(fetching, backend, site):
    path = fresh("/slow-page")
    site.route(path, "slow words", headers={"Content-Type": "text/plain"}, stall=0.7)
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(W.stream_reply([W.text("reading"), W.tool_use("web_fetch", {"url": url})]),
                   W.stream_reply([W.text("done")]))
    status, _, raw = _raw_post(fetching, {"model": "foundation", "max_tokens": 99, "messages": ASK,
                                          "tools": [FETCH], "stream": True})
    assert status == 200, raw
    events = W.parse_stream(raw)
    names = [n for n, _ in events]
    assert names.count("message_start") == names.count("message_stop") == 1
    starts = [d for n, d in events if n == "content_block_start"]
    assert [(d["index"], d["content_block"]["type"]) for d in starts] == [
        (0, "text"), (1, "server_tool_use"), (2, "web_fetch_tool_result"), (3, "text")]
    # Keep-alives while the page is read: between the server_tool_use and its result.
    at = {d["content_block"]["type"]: i for i, (n, d) in enumerate(events) if n == "content_block_start"}
    assert "ping" in names[at["server_tool_use"]:at["web_fetch_tool_result"]]
    assert starts[2]["content_block"]["content"]["content"]["source"]["data"] == "slow words"
    assert events[-2][1]["usage"]["server_tool_use"] == {"web_search_requests": 0, "web_fetch_requests": 1}


def _raw_post(proxy, body, path="/v1/messages"):
    req = urllib.request.Request(proxy.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


LONG = "http://127.0.0.1:{port}/" + "a" * 300


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("allow,tool,route,inputs,codes,gets", [
    # loopback is refused unless WEB_FETCH_ALLOWED_NETWORKS lists it
    (False, {}, ("/p", 200, "text/plain"), ["/p"], ["url_not_allowed"], []),
    (True, {}, ("/p", 200, "application/pdf"), ["/p"], ["unsupported_content_type"], ["/p"]),
    (True, {}, None, ["/missing"], ["url_not_accessible"], ["/missing"]),
    (True, {}, ("/p", 429, "text/plain"), ["/p"], ["too_many_requests"], ["/p"]),
    (True, {}, None, [{"link": "/p"}], ["invalid_tool_input"], []),
    (True, {}, None, [LONG], ["url_too_long"], []),
    (True, {"max_uses": 1}, ("/p", 200, "text/plain"), ["/p", "/p?2"], [None, "max_uses_exceeded"], ["/p"]),
    (True, {"allowed_domains": ["docs.example"]}, ("/p", 200, "text/plain"), ["/p"], ["url_not_allowed"], []),
    (True, {"blocked_domains": ["127.0.0.1"]}, ("/p", 200, "text/plain"), ["/p"], ["url_not_allowed"], []),
    (True, {"allowed_domains": ["127.0.0.1"]}, ("/p", 200, "text/plain"), ["/p"], [None], ["/p"]),
])
def test_fetch_outcomes_become_result_blocks(start_proxy, fetching, backend, site, stream, allow, tool, route, inputs,
                                            codes, gets):
    # The fetcher's own outcomes, so any URL is let through to it (provenance refuses first: test_exfiltration.py).
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2", WEB_FETCH_URLS="any")
    tag = fresh("")
    if route:
        site.route(tag + route[0], "page words", status=route[1], headers={"Content-Type": route[2]})
    base = f"http://127.0.0.1:{site.port}{tag}"

    def args(i):
        return i if isinstance(i, dict) else {"url": i.format(port=site.port) if i.startswith("http") else base + i}

    calls = [W.tool_use("web_fetch", args(i)) for i in inputs]
    backend.script(reply(calls, stream), reply([W.text("sorry")], stream))
    msg = ask(fetching if allow else proxy, stream, tools=[{**FETCH, **tool}])
    results = [b for b in msg.content if b.type == "web_fetch_tool_result"]
    assert [None if isinstance(r.content, anthropic.types.beta.BetaWebFetchBlock) else r.content.error_code for r in results] == codes
    assert msg.usage.server_tool_use.web_fetch_requests == codes.count(None)
    told = last_results(turns(backend)[1])
    assert [t.startswith(("Fetch failed", "Not fetched")) for t in told] == [c is not None for c in codes]
    assert [r.path for r in site.requests] == [tag + g for g in gets]


def test_a_search_and_a_fetch_of_one_turn_run_together(fetching, backend, searxng, site):
    path = fresh("/a")
    site.route(path, "words of page a", headers={"Content-Type": "text/plain"})
    url = f"http://127.0.0.1:{site.port}{path}"
    calls = [W.tool_use("web_search", {"query": "q1"}), W.tool_use("web_fetch", {"url": url})]
    backend.script(W.message_reply(calls), W.message_reply([W.text("done")]))
    msg = ask(fetching, False, tools=[SEARCH, FETCH])
    assert kinds(msg) == ["server_tool_use", "server_tool_use", "web_search_tool_result", "web_fetch_tool_result", "text"]
    assert [b.name for b in msg.content[:2]] == ["web_search", "web_fetch"]
    assert [b.tool_use_id for b in msg.content[2:4]] == [b.id for b in msg.content[:2]]
    search_text, page_text = last_results(turns(backend)[1])
    assert search_text.startswith('Search results for "q1"') and page_text.endswith("words of page a")
    assert searxng.queries == ["q1"] and [r.path for r in site.requests] == [path]


@pytest.mark.parametrize("stream", [False, True])
def test_the_cap_counts_a_search_and_a_fetch_of_one_turn_as_one_round(start_proxy, backend, searxng, site, stream):
    p = start_proxy(MAX_SEARCH_ITER="1", KEEPALIVE_INTERVAL="0.2", WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", WEB_FETCH_URLS="any")
    path = fresh("/a")
    site.route(path, "a", headers={"Content-Type": "text/plain"})
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(reply([W.tool_use("web_search", {"query": "q1"}), W.tool_use("web_fetch", {"url": url})], stream),
                   reply([W.tool_use("web_fetch", {"url": url + "?2"})], stream))
    with pytest.raises(anthropic.APIStatusError) as e:
        ask(p, stream, tools=[SEARCH, FETCH])
    assert "1 of 1 search round used (1 search, 0 repeated, 0 empty, 1 page fetched)" in str(e.value)
    assert [r.path for r in site.requests] == [path] and len(turns(backend)) == 2


def test_both_domain_lists_are_refused_like_anthropic(fetching, backend):
    status, _, raw = _raw_post(fetching, {"model": "foundation", "max_tokens": 9, "messages": ASK, "tools": [
        {**FETCH, "allowed_domains": ["a.example"], "blocked_domains": ["b.example"]}]})
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"
    assert "not both" in json.loads(raw)["error"]["message"] and turns(backend) == []


def test_max_content_tokens_cuts_the_page(fetching, backend, site):
    path = fresh("/long")
    site.route(path, "word " * 400, headers={"Content-Type": "text/plain"})
    backend.script(W.message_reply([W.tool_use("web_fetch", {"url": f"http://127.0.0.1:{site.port}{path}"})]),
                   W.message_reply([W.text("ok")]))
    msg = ask(fetching, False, tools=[{**FETCH, "max_content_tokens": 10}])
    data = msg.content[1].content.content.source.data
    assert data.endswith(CUT_NOTE) and 30 <= len(data) - len(CUT_NOTE) <= 40 and data.startswith("word word")
    (told,) = last_results(turns(backend)[1])
    assert told.endswith(data)  # the note is in the document, so a replay tells the model the same


def test_replayed_history_shows_the_model_the_same_page(fetching, backend, site):
    path = fresh("/replay")
    site.route(path, "the page's words", headers={"Content-Type": "text/plain"})
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(W.message_reply([W.tool_use("web_fetch", {"url": url})]), W.message_reply([W.text("first")]))
    first = ask(fetching, False, tools=[FETCH])
    (seen_first,) = last_results(turns(backend)[1])
    error = [{"type": "server_tool_use", "id": "srvtoolu_e", "name": "web_fetch", "input": {"url": url + "x"}},
             {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_e",
              "content": {"type": "web_fetch_tool_result_error", "error_code": "url_not_accessible"}}]
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content] + error},
                     {"role": "user", "content": "and then?"}]
    for tools in ([FETCH], None):  # with the tool, or only the history to rewrite
        backend.reset()
        backend.script(W.message_reply([W.text("second")]))
        assert ask(fetching, False, messages=history, **({"tools": tools} if tools else {})).content[0].text == "second"
        sent = turns(backend)[0].json()["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
        assert sent[1]["content"] == [{"type": "tool_use", "id": first.content[0].id, "name": "web_fetch", "input": {"url": url}}]
        assert sent[2]["content"] == [{"type": "tool_result", "tool_use_id": first.content[0].id,
                                       "content": seen_first}]  # the very text it read the first time
        assert [b["type"] for b in sent[3]["content"]] == ["text", "tool_use"]
        assert sent[4]["content"] == [{"type": "tool_result", "tool_use_id": "srvtoolu_e",
                                       "content": FETCH_ERROR_TEXT["url_not_accessible"]},
                                      {"type": "text", "text": "and then?"}]
    assert [r.path for r in site.requests] == [path]  # replaying fetches nothing


def test_a_failed_fetch_replays_its_live_sentence(fetching, backend, site):
    """A failure's sentence (the page's answer, the reason) does not fit its error block: the proxy keeps it by the
    block's id, so turn 2 reads what turn 1's model read and vLLM's prefix cache matches past it."""
    path = fresh("/gone")
    site.route(path, "no", status=404, headers={"Content-Type": "text/plain"})
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(W.message_reply([W.tool_use("web_fetch", {"url": url})]), W.message_reply([W.text("first")]))
    first = ask(fetching, False, tools=[FETCH])
    (live,) = last_results(turns(backend)[1])
    assert live.startswith("Fetch failed") and live != FETCH_ERROR_TEXT["url_not_accessible"] and "404" in live
    history = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": "and then?"}]
    backend.reset()
    backend.script(W.message_reply([W.text("second")]))
    ask(fetching, False, messages=history, tools=[FETCH])
    assert turns(backend)[0].json()["messages"][2]["content"][0]["content"] == live


def test_count_tokens_counts_what_vllm_would_get(fetching, backend):
    backend.script(Reply(path="/v1/messages/count_tokens", body=b'{"input_tokens":77}'))
    history = ASK + [{"role": "assistant", "content": [FSTU, FRES]}, {"role": "user", "content": "go on"}]
    n = sdk(fetching).beta.messages.count_tokens(model="foundation", messages=history, tools=[FETCH])
    assert n.input_tokens == 77
    got = backend.received[0]
    assert got.path == "/v1/messages/count_tokens"
    assert got.json()["tools"] == [VLLM_FETCH_TOOL]
    assert [[b["type"] for b in m["content"]] for m in got.json()["messages"][1:3]] == [["tool_use"], ["tool_result", "text"]]


@pytest.mark.parametrize("stream", [False, True])
def test_client_leaving_mid_fetch_stops_the_loop(fetching, backend, site, stream):
    path = fresh("/stall")
    site.route(path, "late words", headers={"Content-Type": "text/plain"}, stall=1.5)
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.script(reply([W.tool_use("web_fetch", {"url": url})], stream), reply([W.text("never")], stream))
    s = post_raw(fetching, "/v1/messages", {"model": "foundation", "max_tokens": 9, "messages": ASK,
                                            "tools": [FETCH], "stream": stream})
    if stream:
        assert b"event: ping" in read_until(s, b"event: ping")  # the round has begun
    # The client leaves once the page server has the request: a fetch whose client left before it
    # connected is never sent at all, which would leave nothing here to count.
    deadline = time.monotonic() + 10
    while not site.requests:
        assert time.monotonic() < deadline, "the fetch never started"
        time.sleep(0.02)
    s.close()
    time.sleep(2.5)  # the page has come by now: a loop that went on would have asked vLLM again
    assert [r.path for r in site.requests] == [path] and len(turns(backend)) == 1


@pytest.mark.parametrize("body", [
    {"messages": ASK, "tools": [{**FETCH, "max_content_tokens": 0}]},
    {"messages": ASK, "tools": [{**FETCH, "allowed_domains": "a.example"}]},
    {"messages": ASK, "tools": [{**FETCH, "citations": "on"}]},
    {"messages": ASK + [{"role": "assistant", "content": [
        FSTU, {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_f", "content": "?"}, 5]}]},
    {"messages": ASK + [{"role": "assistant", "content": [{**FSTU, "input": "u"}, {**FRES, "content": None}]}],
     "tools": [FETCH]},
])
def test_malformed_fetch_requests_get_a_client_error_not_a_500(fetching, backend, body):
    backend.responder = lambda r: W.error_reply(400, "vLLM says no")
    status, _, raw = _raw_post(fetching, {"model": "foundation", "max_tokens": 5, **body})
    assert 400 <= status < 500, raw
    assert json.loads(raw)["type"] == "error"
