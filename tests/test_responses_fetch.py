"""Reading pages through the hosted web_search tool on /v1/responses: the pure rules of proxy/responses_*.py
for open_page and find_in_page, then the real proxy driven by the openai SDK, seen from the client, the vLLM
stand-in, SearXNG's stand-in and the loopback web site. Run: tests/run.sh tests/test_responses_fetch.py
"""
from __future__ import annotations

import itertools
import json
import time

import pytest
from clients import openai
from test_chat_fetch import FACT, PAGE
from test_client_leaving import logged
from test_faults import access_lines, post_raw, read_until

from proxy.apis.responses.calls import tool_request
from proxy.apis.responses.output import call_action, pending_item, web_search_item
from proxy.apis.responses.request import (
    ResponsesPlan,
    first_request,
    hosted_functions,
    make_plan,
    replay,
    rewrite_tool_choice,
)
from proxy.backends.search.search import SearchOutcome
from proxy.tools.find_in_page import FIND_MATCHES, FIND_USAGE, FindRequest, FindResult, find_in_text
from proxy.tools.registry import text as tool_output
from proxy.tools.web_fetch import FetchOutcome, FetchRequest, Page
from proxy.tools.web_search import SearchRequest
from standins import pdf_files
from standins import responses_wire as w

HOSTED = {"type": "web_search"}
SHELL = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
OWN_WEB_FETCH = {"type": "function", "name": "web_fetch", "description": "The client's own fetch",
                 "parameters": {"type": "object", "properties": {"href": {"type": "string"}}}}
ASK = "What does the vLLM changelog say?"
ITEM_EVENTS = ["response.output_item.added", "response.web_search_call.in_progress",
               "response.web_search_call.searching", "response.web_search_call.completed", "response.output_item.done"]
_paths = itertools.count()


def fresh_path() -> str:
    """A path no earlier test used: the proxy's page cache outlives a test."""
    return f"/page-{next(_paths)}"


def plan(**kw) -> ResponsesPlan:
    base = dict(name="web_search", hosted=True, results=5, language=None, allowed=(), sources=False,
                client_tools=[HOSTED], client_tool_choice=None,
                functions={"web_search": "web_search", "web_fetch": "web_fetch", "find_in_page": "find_in_page"})
    return ResponsesPlan(**{**base, **kw})


def page(text="alpha beta", url="https://a.example/p", truncated=False) -> FetchOutcome:
    return FetchOutcome(url, page=Page(url, "T", text, "text/html", "2026-12-03T16:00:00Z", truncated))


def fn(name, args, ident="fc_00ab") -> dict:
    return {"type": "function_call", "id": ident, "call_id": "c1", "name": name,
            "arguments": args if isinstance(args, str) else json.dumps(args)}


# ---- pure rules ---------------------------------------------------------------------------

@pytest.mark.parametrize("tools,enabled,names", [
    ([HOSTED], True, ("web_fetch", "find_in_page")),
    ([SHELL, HOSTED], False, (None, None)),                                   # INJECT_WEB_FETCH=false
    ([OWN_WEB_FETCH, HOSTED], True, (None, "find_in_page")),                  # the client reads pages itself
    ([{"type": "custom", "name": "find_in_page"}, HOSTED], True, ("web_fetch", None)),
    ([{"type": "namespace", "name": "web", "tools": [{"type": "function", "name": "fetch"}]}, HOSTED], True,
     ("web_fetch", "find_in_page")),                                          # web__fetch is not web_fetch
])
def test_page_functions_are_offered_unless_the_client_has_them(tools, enabled, names):
    offered = {"web_search": "web_search"} | {n: n for n in names if n}
    assert hosted_functions(tools, enabled) == offered
    p = make_plan({"input": "x", "tools": tools}, 5, fetch=enabled)
    sent = first_request({"input": "x", "tools": tools}, p)["tools"]
    ours = [t["name"] for t in sent if t not in tools]
    assert ours == ["web_search", *[n for n in names if n]]
    assert all(t["type"] == "function" for t in sent if t["name"] in ours)


def test_replay_only_requests_offer_no_page_functions():
    p = make_plan({"input": [{"type": "web_search_call", "action": {"type": "open_page", "url": "https://a/"}}]}, 5)
    assert (p.hosted, p.functions) == (False, {})


@pytest.mark.parametrize("choice,expected", [
    ({"type": "web_search"}, {"type": "function", "name": "web_search"}),  # forcing the tool forces a search
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "web_search"}]},
     {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": n}
                                                              for n in ("web_search", "web_fetch", "find_in_page")]}),
])
def test_tool_choice_allows_the_page_functions(choice, expected):
    assert rewrite_tool_choice(choice, "web_search", ("web_fetch", "find_in_page")) == expected


@pytest.mark.parametrize("call,expected", [
    (fn("web_fetch", {"url": " https://a.example/p "}), FetchRequest("https://a.example/p", allowed_domains=("a.example",))),
    (fn("find_in_page", {"url": "https://a.example/p", "pattern": "x"}),
     FindRequest(FetchRequest("https://a.example/p", allowed_domains=("a.example",)), "x")),
    (fn("web_search", {"query": "q"}), SearchRequest("q", allowed_domains=("a.example",), results=5)),
])
def test_calls_become_what_the_session_runs(call, expected):
    assert tool_request(call, plan(allowed=("a.example",))) == expected


@pytest.mark.parametrize("args,phrase", [
    ({"url": "https://a.example/p"}, 'missing "pattern"'),
    ({"url": "https://a.example/p", "pattern": "  "}, 'missing "pattern"'),
    ({"pattern": "x"}, 'missing "url"'),
    ("{not json", "not valid JSON"),
])
def test_a_bad_find_call_is_refused_before_fetching(args, phrase):
    request = tool_request(fn("find_in_page", args), plan())
    assert request.early is not None and request.early.error_code == "invalid_tool_input"
    assert phrase in request.early.message and FIND_USAGE in request.early.message, request.early.message


@pytest.mark.parametrize("call,outcome,status,action", [
    (fn("web_fetch", {"url": "https://a.example/p"}), page(), "completed", {"type": "open_page", "url": "https://a.example/p"}),
    (fn("web_fetch", {"url": "https://a.example/p"}), FetchOutcome("https://a.example/p", error_code="url_not_accessible",
                                                                   message="Fetch failed: 404"),
     "failed", {"type": "open_page", "url": "https://a.example/p"}),
    (fn("web_fetch", "{not json"), FetchOutcome("{not json", error_code="invalid_tool_input"), "failed", {"type": "open_page"}),
    (fn("find_in_page", {"url": "https://a.example/p", "pattern": "beta"}), FindResult("beta", page()), "completed",
     {"type": "find_in_page", "url": "https://a.example/p", "pattern": "beta"}),
    (fn("find_in_page", {"url": "https://a.example/p", "pattern": "beta"}),
     FindResult("beta", FetchOutcome("https://a.example/p", error_code="url_not_allowed")), "failed",
     {"type": "find_in_page", "url": "https://a.example/p", "pattern": "beta"}),
    (fn("web_search", {"query": "q"}), SearchOutcome("q", "empty"), "completed", {"type": "search", "query": "q"}),
])
def test_web_search_call_items_for_page_reads(call, outcome, status, action):
    ws = openai.types.responses.response_function_web_search  # the SDK's own types
    p = plan(sources=False)
    assert pending_item(call, p) == {"id": "ws_00ab", "type": "web_search_call", "status": "in_progress",
                                       "action": call_action(call, p)}
    item = web_search_item(call, outcome, p)
    assert item == {"id": "ws_00ab", "type": "web_search_call", "status": status, "action": action}
    parsed = ws.ResponseFunctionWebSearch.model_validate(item)  # the SDK's own type takes it
    assert isinstance(parsed.action, {"search": ws.ActionSearch, "open_page": ws.ActionOpenPage, "find_in_page": ws.ActionFind}[action["type"]])


@pytest.mark.parametrize("text,pattern,excerpts,count", [
    ("alpha beta gamma", "BETA", ["alpha beta gamma"], 1),                       # case-insensitive
    ("a.b axb", ".", ["a.b axb"], 1),                                             # literal, not a regular expression
    ("x" * 500 + "needle" + "y" * 500, "needle", ["…" + "x" * 200 + "needle" + "y" * 200 + "…"], 1),
    ("needle needle", "needle", ["needle needle"], 2),                            # one excerpt for close matches
    ("\n".join(["needle" + " " * 500] * 15), "needle", None, 15),                 # at most FIND_MATCHES excerpts
    ("nothing here", "needle", [], 0),
])
def test_find_in_text(text, pattern, excerpts, count):
    got, n = find_in_text(text, pattern)
    assert n == count
    if excerpts is None:
        assert len(got) == FIND_MATCHES and all(e.startswith(("needle", "…needle")) for e in got)
    else:
        assert got == excerpts


@pytest.mark.parametrize("found,expected", [
    (FindResult("beta", page()), '"beta" occurs 1 time in https://a.example/p "T":\n[1] alpha beta'),
    (FindResult("zeta", page()), '"zeta" does not occur in https://a.example/p (10 characters searched).'),
    (FindResult("zeta", page(truncated=True)), '"zeta" does not occur in https://a.example/p (10 characters searched) '
                                            "(only the beginning of the page was searched: the rest is past the proxy's limit)."),
    (FindResult("beta", FetchOutcome("u", error_code="url_not_accessible", message="Fetch failed: u answered HTTP 404.")),
     "Fetch failed: u answered HTTP 404."),
])
def test_what_the_model_reads_for_find_in_page(found, expected):
    assert tool_output(found) == expected


OPENED = {"type": "web_search_call", "status": "completed", "action": {"type": "open_page", "url": "https://b.example/"}}
FOUND = {"type": "web_search_call", "status": "completed",
         "action": {"type": "find_in_page", "url": "https://c.example/", "pattern": "foo"}}


@pytest.mark.parametrize("item,names,function,arguments,output_has", [
    (OPENED, ("web_fetch", "find_in_page"), "web_fetch", {"url": "https://b.example/"}, "Opened https://b.example/ in an earlier turn"),
    ({**OPENED, "status": "failed"}, ("web_fetch", None), "web_fetch", {"url": "https://b.example/"}, "failed"),
    (FOUND, ("web_fetch", "find_in_page"), "find_in_page", {"url": "https://c.example/", "pattern": "foo"}, 'Looked for "foo"'),
    # Without the page functions in this request, the old wording: a search for the URL.
    (OPENED, (None, None), "web_search", {"query": "https://b.example/"}, "not kept"),
    (FOUND, ("web_fetch", None), "web_search", {"query": "foo https://c.example/"}, "not kept"),
    ({"type": "web_search_call", "status": "completed", "action": {"type": "open_page"}}, ("web_fetch", "find_in_page"),
     "web_search", {"query": ""}, "not kept"),
])
def test_replayed_page_actions(item, names, function, arguments, output_has):
    functions = {"web_search": "web_search"} | {n: n for n in names if n}
    call, result = replay([item], plan(functions=functions))
    assert call["name"] == function and json.loads(call["arguments"]) == arguments
    assert result["call_id"] == call["call_id"] and output_has in result["output"]


# ---- through the proxy --------------------------------------------------------------------

@pytest.fixture
def fetching(start_proxy):
    """A proxy that may fetch from loopback, as a LAN allow-list would let it."""
    return start_proxy(KEEPALIVE_INTERVAL="0.2", WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", WEB_FETCH_URLS="any")


def client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def vllm_requests(backend) -> list[dict]:
    return [r.json() for r in backend.received if r.path == "/v1/responses"]


def ask(proxy, stream: bool, tool=HOSTED, **kw):
    """(the final response, every event) as the SDK parsed them; no events without streaming."""
    body = {"model": "foundation", "input": ASK, "tools": [SHELL, tool], **kw}
    if not stream:
        return client(proxy).responses.create(**body), []
    events = list(client(proxy).responses.create(stream=True, **body))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    return events[-1].response, events


def item_events(events, item_id: str) -> list:
    """The events of one output item, in order."""
    return [e for e in events if getattr(e, "item_id", None) == item_id or getattr(getattr(e, "item", None), "id", None) == item_id]


def outputs(request: dict) -> dict:
    return {i["call_id"]: i["output"] for i in request["input"] if i.get("type") == "function_call_output"}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_search_then_open_the_page_then_answer(fetching, backend, searxng, site, stream):
    ws = openai.types.responses.response_function_web_search  # the SDK's own types
    path = fresh_path()
    site.route(path, PAGE)
    url = f"http://127.0.0.1:{site.port}{path}"
    search, fetch = w.call("web_search", {"query": "vllm changelog"}), w.call("web_fetch", {"url": url})
    backend.responder = w.model([search], [w.reasoning("read it"), fetch], [w.message("It adds prefix caching.")])
    final, events = ask(fetching, stream, include=["web_search_call.action.sources"])

    # The client's view: a search, then a page opened, as OpenAI's hosted tool reports them.
    assert [o.type for o in final.output] == ["web_search_call", "reasoning", "web_search_call", "message"]
    searched, opened = final.output[0], final.output[2]
    assert isinstance(searched.action, ws.ActionSearch) and searched.action.query == "vllm changelog"
    assert isinstance(opened.action, ws.ActionOpenPage) and opened.action.url == url
    assert opened.status == "completed" and opened.id == "ws_" + fetch.id[3:]
    assert final.output_text == "It adds prefix caching."
    assert [t.type for t in final.tools] == ["function", "web_search"]  # the client's tools, not the proxy's
    if stream:
        shown = item_events(events, opened.id)
        assert [e.type for e in shown] == ITEM_EVENTS
        assert shown[0].item.status == "in_progress" and shown[0].item.action == opened.action
        assert shown[-1].item == opened and {e.output_index for e in shown} == {2}
        assert not any("function_call" in e.type for e in events)
    # vLLM's: the three functions, then the page's main text as the fetch call's output.
    sent = vllm_requests(backend)
    assert len(sent) == 3
    assert [t["name"] for t in sent[0]["tools"]] == ["shell", "web_search", "web_fetch", "find_in_page"]
    text = outputs(sent[2])[fetch.call_id]
    # Numbered after the search's three results, for citing (issue 29).
    assert text.startswith(f'[4] Page {url} "Changelog"') and FACT in text and "Sponsors" not in text
    # SearXNG's and the site's: one search, one GET of the page.
    assert searxng.queries == ["vllm changelog"]
    assert [r.path for r in site.requests] == [path]
    assert site.requests[0].headers["user-agent"].startswith("coding-stack-proxy/")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_find_in_an_opened_page_reads_it_from_the_cache(fetching, backend, searxng, site, stream):
    ws = openai.types.responses.response_function_web_search  # the SDK's own types
    path = fresh_path()
    site.route(path, PAGE)
    url = f"http://127.0.0.1:{site.port}{path}"
    fetch, find = w.call("web_fetch", {"url": url}), w.call("find_in_page", {"url": url, "pattern": "marlin kernel"})
    backend.responder = w.model([fetch], [find], [w.message("Faster Marlin.")])
    final, events = ask(fetching, stream)

    found = final.output[1]
    assert isinstance(found.action, ws.ActionFind) and (found.action.url, found.action.pattern) == (url, "marlin kernel")
    assert found.status == "completed"
    if stream:
        assert [e.type for e in item_events(events, found.id)] == ITEM_EVENTS
    text = outputs(vllm_requests(backend)[2])[find.call_id]
    assert text.startswith(f'"marlin kernel" occurs 1 time in {url} "Changelog":\n[1] ') and "faster Marlin kernel" in text
    assert [r.path for r in site.requests] == [path]  # the second read came from the page cache
    assert searxng.queries == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("allow_loopback,route,tool,phrase,fetched", [
    (False, {"body": PAGE}, HOSTED, "only reads public addresses", False),
    # A PDF is read now; one that is not a PDF inside (as one with a password) is still refused.
    (True, {"body": b"%PDF-1.4", "headers": {"Content-Type": "application/pdf"}}, HOSTED,
     "the file is not a PDF the proxy can read", True),
    (True, None, HOSTED, "answered HTTP 404 Not Found", True),
    (True, {"body": PAGE}, {"type": "web_search", "filters": {"allowed_domains": ["docs.vllm.ai"]}},
     "127.0.0.1 is not in the allowed domains of this request", False),
], ids=["loopback", "pdf", "404", "allowed_domains"])
def test_a_refused_page_is_a_failed_item_and_a_result_the_model_reads(start_proxy, backend, searxng, site, stream,
                                                                     allow_loopback, route, tool, phrase, fetched):
    ws = openai.types.responses.response_function_web_search  # the SDK's own types
    env = {"WEB_FETCH_ALLOWED_NETWORKS": "127.0.0.0/8"} if allow_loopback else {}
    env["WEB_FETCH_URLS"] = "any"  # the fetcher's own refusals; which URLs may be read is tests/test_exfiltration.py's
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2", **env)
    path = fresh_path()
    if route is not None:
        site.route(path, **route)
    url = f"http://127.0.0.1:{site.port}{path}"
    fetch = w.call("web_fetch", {"url": url})
    backend.responder = w.model([fetch], [w.message("I could not read it.")])
    final, events = ask(proxy, stream, tool=tool)  # a completed response, never a 5xx

    assert final.status == "completed" and final.output_text == "I could not read it."
    opened = final.output[0]
    assert opened.type == "web_search_call" and opened.status == "failed"
    assert isinstance(opened.action, ws.ActionOpenPage) and opened.action.url == url
    if stream:
        assert [e.type for e in item_events(events, opened.id)] == [k for k in ITEM_EVENTS if not k.endswith(".completed")]
    text = outputs(vllm_requests(backend)[1])[fetch.call_id]
    assert text.startswith("Fetch failed:") and phrase in text, text
    assert [r.path for r in site.requests] == ([path] if fetched else [])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("env,names", [
    ({}, ["web_search", "web_fetch", "find_in_page"]),
    ({"INJECT_WEB_FETCH": "false"}, ["web_search", "web_search", "web_search"]),
], ids=["fetch-on", "fetch-off"])
def test_replayed_page_actions_reach_vllm_as_calls_it_reads(start_proxy, backend, searxng, site, stream, env, names):
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2", **env)
    url = f"http://127.0.0.1:{site.port}/old"
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]},
        {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "vllm changelog"}},
        {"type": "web_search_call", "status": "completed", "action": {"type": "open_page", "url": url}},
        {"type": "web_search_call", "status": "completed", "action": {"type": "find_in_page", "url": url, "pattern": "INT4"}},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It adds prefix caching."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And what else?"}]},
    ]
    backend.responder = w.model([w.message("A faster kernel.")])
    final, _ = ask(proxy, stream, input=history)
    assert final.output_text == "A faster kernel." and [o.type for o in final.output] == ["message"]

    got = vllm_requests(backend)[0]
    assert [t["name"] for t in got["tools"]][1:] == list(dict.fromkeys(names))
    calls = [i for i in got["input"] if i.get("type") == "function_call"]
    assert [c["name"] for c in calls] == names
    assert not any(i.get("type") == "web_search_call" for i in got["input"])
    said = outputs(got)
    if names[1] == "web_fetch":
        assert json.loads(calls[1]["arguments"]) == {"url": url} and said[calls[1]["call_id"]].startswith(f"Opened {url}")
        assert json.loads(calls[2]["arguments"]) == {"url": url, "pattern": "INT4"}
    else:
        assert json.loads(calls[1]["arguments"]) == {"query": url}
    assert site.requests == [] and searxng.queries == []  # nothing replayed runs again


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_client_web_fetch_of_its_own_keeps_its_calls(fetching, backend, searxng, site, stream):
    own = w.call("web_fetch", {"href": "https://example.org/"})
    backend.responder = w.model([own])
    final, _ = ask(fetching, stream, tools=[OWN_WEB_FETCH, HOSTED])
    assert [o.type for o in final.output] == ["function_call"]
    assert final.output[0].name == "web_fetch" and final.output[0].call_id == own.call_id
    sent = vllm_requests(backend)[0]["tools"]
    assert sent[0] == OWN_WEB_FETCH and [t["name"] for t in sent[1:]] == ["web_search", "find_in_page"]
    assert site.requests == []


STALL = 1.5  # seconds the site holds the page's body back


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_client_leaving_mid_fetch_stops_the_loop(fetching, backend, searxng, site, stream):
    path = fresh_path()
    site.route(path, PAGE, stall=STALL)
    url = f"http://127.0.0.1:{site.port}{path}"
    backend.responder = w.model([w.call("web_fetch", {"url": url})], [w.message("too late")])
    seen = len(access_lines(fetching.log()))
    s = post_raw(fetching, "/v1/responses", {"model": "foundation", "input": ASK, "tools": [HOSTED], "stream": stream})
    if stream:
        shown = read_until(s, b"response.web_search_call.searching")
        assert b'"type":"open_page"' in shown
    deadline = time.monotonic() + 10
    while not site.requests:
        assert time.monotonic() < deadline, "the fetch never started"
        time.sleep(0.02)
    s.close()
    time.sleep(STALL + 0.7)  # the fetch is over: a loop that went on would have asked vLLM by now
    assert len(vllm_requests(backend)) == 1, "no turn may start for a client that left"
    assert backend.hangups == []
    assert logged(fetching, seen, 1) == [("/v1/responses", "200" if stream else "499")]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_pdf_is_opened_as_its_text(start_proxy, backend, searxng, site, stream):
    """open_page on a PDF: a completed web_search_call, and the model reads the document's text."""
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2", WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8")
    path = fresh_path() + ".pdf"
    site.route(path, pdf_files.build([pdf_files.text_page("Pelicans fly in V formations.")], title="Pelicans"),
               headers={"Content-Type": "application/pdf"})
    url = f"http://127.0.0.1:{site.port}{path}"
    fetch = w.call("web_fetch", {"url": url})
    backend.responder = w.model([fetch], [w.message("In V formations.")])
    final, _ = ask(proxy, stream, input=f"What does {url} say?")  # the user gives it, as provenance needs
    assert final.status == "completed" and final.output_text == "In V formations."
    assert final.output[0].type == "web_search_call" and final.output[0].status == "completed"
    text = outputs(vllm_requests(backend)[1])[fetch.call_id]
    assert "Content-Type: application/pdf" in text and "Pelicans fly in V formations." in text, text
