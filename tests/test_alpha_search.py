"""Tests for Codex's standalone web search, `POST /v1/alpha/search`: the pure request reading and
output writing (proxy/apis/alpha_search/rules.py), and the real proxy (proxy/apis/alpha_search/handler.py) under gunicorn against
the SearXNG stand-in and a loopback web site, table by table (request -> status -> body, and what SearXNG and
the site received). The end-to-end run with the real Codex is in tests/test_codex.py.

Run: tests/run.sh tests/test_alpha_search.py -q
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
import uuid

import pytest

from proxy.apis.alpha_search import rules as W
from proxy.apis.alpha_search.handler import PATH
from proxy.backends.pages.fetcher import Fetcher
from proxy.backends.search.search import Hit, SearchOutcome
from proxy.backends.search.searxng import SearXNG
from proxy.core.config import Config
from proxy.tools.web_fetch import FetchError, Page
from standins import pdf_files
from standins.searxng import result

# Pages on loopback may be fetched; no page cache, so each test sees its own downloads.
LOOPBACK = {"WEB_FETCH_ALLOWED_NETWORKS": "127.0.0.0/8", "WEB_FETCH_URLS": "any", "WEB_FETCH_CACHE_TTL": "0", "KEEPALIVE_INTERVAL": "0.2"}
DOC = ("<html><head><title>vLLM 0.32 notes</title></head><body><main><h1>vLLM 0.32</h1>"
       "<p>The Responses loop landed.</p><p>Speculative decoding got faster.</p>"
       "<p>The magic word is PELICAN-7731.</p></main></body></html>")


def page(text: str, truncated=False) -> Page:
    return Page(url="https://example.org/doc", title="Doc", text=text, content_type="text/html",
                retrieved_at="2026-12-03T16:20:00Z", truncated=truncated)


# ---- pure: reading the request -------------------------------------------------------------

def body(**commands) -> dict:
    """A request as Codex sends it; a thread id of its own, so ref ids start at turn 0."""
    return {"id": str(uuid.uuid4()), "model": "foundation", "commands": commands,
            "settings": {"allowed_callers": ["direct"], "external_web_access": False}, "max_output_tokens": 2500}


@pytest.mark.parametrize("request_body,param", [
    ([], None),
    ({"id": "t"}, "commands"),
    ({"commands": []}, "commands"),
    ({"commands": {}}, "commands"),
    ({"commands": {"bogus": []}}, "commands"),
    ({"commands": {"search_query": {"q": "x"}}}, "commands.search_query"),
    ({"commands": {"search_query": [{"query": "x"}]}}, "commands.search_query[0].q"),
    ({"commands": {"search_query": [{"q": 3}]}}, "commands.search_query[0].q"),
    ({"commands": {"search_query": [{"q": "x", "domains": "a.com"}]}}, "commands.search_query[0].domains"),
    ({"commands": {"search_query": [{"q": "x", "recency": -1}]}}, "commands.search_query[0].recency"),
    ({"commands": {"search_query": [{"q": "x"}] * 9}}, "commands.search_query"),
    ({"commands": {"open": [{"lineno": 3}]}}, "commands.open[0].ref_id"),
    ({"commands": {"open": [{"ref_id": "u", "lineno": "3"}]}}, "commands.open[0].lineno"),
    ({"commands": {"find": [{"ref_id": "u"}]}}, "commands.find[0].pattern"),
    ({"commands": {"search_query": [{"q": "x"}], "response_length": "huge"}}, "commands.response_length"),
    ({"commands": {"search_query": [{"q": "x"}]}, "settings": []}, "settings"),
    ({"commands": {"search_query": [{"q": "x"}]}, "max_output_tokens": True}, "max_output_tokens"),
])
def test_bad_requests_name_the_field(request_body, param):
    with pytest.raises(W.BadRequest) as e:
        W.parse_request(request_body)
    assert e.value.param == param


def test_the_captured_request_parses():
    """The body Codex 0.171.0 sent (tests/data/agent-wire/codex-0.171.0-alpha-search.json)."""
    from test_agent_wire import capture
    (sent,) = [r["body"] for r in capture("codex-0.171.0-alpha-search.json") if r["target"] == PATH]
    p = W.parse_request(sent)
    assert p.session == sent["id"] and p.output_tokens == 2500
    assert [q.q for q in p.queries] == [q["q"] for q in sent["commands"]["search_query"]]
    assert p.unsupported == () and p.allowed == ()


@pytest.mark.parametrize("commands,expected", [
    ({"search_query": [{"q": "a", "domains": ["x.org"], "recency": 7}]},
     {"queries": (W.Query("a", ("x.org",), 7),)}),
    ({"open": [{"ref_id": "turn0search1"}, {"ref_id": "https://a.b/", "lineno": 40}]},
     {"opens": (("turn0search1", 0), ("https://a.b/", 40))}),
    ({"find": [{"ref_id": "turn0view0", "pattern": "Annie"}]}, {"finds": (("turn0view0", "Annie"),)}),
    ({"finance": [{"ticker": "AMD", "type": "equity"}], "time": [{"utc_offset": "+03:00"}]},
     {"unsupported": ("finance", "time")}),
    ({"search_query": [{"q": "a"}], "teleport": [{"to": "mars"}]}, {"unsupported": ("teleport",)}),
    ({"search_query": [{"q": "a"}], "response_length": "long"}, {"results": 10}),
    ({"search_query": [{"q": "a"}]}, {"results": None, "output_tokens": 2500}),
])
def test_commands_are_read(commands, expected):
    p = W.parse_request(body(**commands))
    for key, value in expected.items():
        assert getattr(p, key) == value, key


@pytest.mark.parametrize("extra,expected", [
    ({"settings": {"search_context_size": "low"}}, {"results": 3}),
    ({"settings": {"filters": {"allowed_domains": ["docs.vllm.ai"], "blocked_domains": ["x.com"]}}},
     {"allowed": ("docs.vllm.ai",), "blocked": ("x.com",)}),
    ({"max_output_tokens": 10 ** 9}, {"output_tokens": W.MAX_OUTPUT_TOKENS}),
    ({"max_output_tokens": None}, {"output_tokens": W.DEFAULT_OUTPUT_TOKENS}),
    ({"id": 7}, {"session": ""}),
])
def test_settings_are_read(extra, expected):
    p = W.parse_request({**body(search_query=[{"q": "a"}]), **extra})
    for key, value in expected.items():
        assert getattr(p, key) == value, key


@pytest.mark.parametrize("days,expected", [(None, None), (0, None), (1, "day"), (2, "week"), (7, "week"),
                                           (30, "month"), (365, "year"), (5000, None)])
def test_recency_becomes_searxng_time_range(days, expected):
    assert W.time_range(days) == expected


@pytest.mark.parametrize("ref,refs,expected", [
    ("turn0search1", {"turn0search1": "https://a.b/1"}, "https://a.b/1"),
    (" turn0search1 ", {"turn0search1": "https://a.b/1"}, "https://a.b/1"),
    ("https://c.d/", {}, "https://c.d/"),
    ("turn9search9", {}, None),
    ("example.com", {}, None),
])
def test_resolve(ref, refs, expected):
    assert W.resolve(ref, refs) == expected


# ---- pure: writing the output -------------------------------------------------------------

def test_search_output_hands_out_ref_ids():
    outcome = SearchOutcome("q", "ok", hits=[Hit("T1", "https://a/1", "s1", "2026-11-01"), Hit("T2", "https://a/2")],
                            answers=["42"])
    text, refs = W.format_search(outcome, 3, 2)
    assert refs == {"turn3search2": "https://a/1", "turn3search3": "https://a/2"}
    assert text.splitlines() == ['## search_query "q"', "Answer: 42", "[turn3search2] T1", "URL: https://a/1",
                                 "Date: 2026-11-01", "s1", "[turn3search3] T2", "URL: https://a/2"]


def test_codex_reads_how_the_results_came_too():
    outcome = SearchOutcome("q", "ok", hits=[Hit("T1", "https://a/1")], notes=["From the Brave Search API."])
    assert W.format_search(outcome, 0, 0)[0].splitlines()[:2] == ['## search_query "q"', "Note: From the Brave Search API."]


def test_failed_search_output_is_the_message():
    outcome = SearchOutcome("q", "failed", message="Search failed: x answered 429.", error_code="too_many_requests")
    assert W.format_search(outcome, 0, 0) == ('## search_query "q"\nSearch failed: x answered 429.', {})


HEAD = "## open [turn0view0] Doc\nURL: https://example.org/doc\nRetrieved: 2026-12-03T16:20:00Z; text/html; 5 lines"


# budget: characters beyond the heading; each line "Ln: x" takes 6 with its newline.
@pytest.mark.parametrize("lineno,budget,first,last,tail", [
    (0, 10_000, "L0: a", "L4: e", None),
    (3, 10_000, "L3: d", "L4: e", None),
    (99, 10_000, "L4: e", "L4: e", None),
    (0, 13, "L0: a", "L1: b", '(lines 0-1 of 5; open with "lineno": 2 to read on)'),
    (1, 0, "L1: b", "L1: b", '(lines 1-1 of 5; open with "lineno": 2 to read on)'),  # one line at least
])
def test_open_output_numbers_lines_from_lineno(lineno, budget, first, last, tail):
    text = W.format_open("turn0view0", page("a\nb\nc\nd\ne"), lineno, len(HEAD) + budget)
    assert text.startswith(HEAD + "\n")
    lines = text.splitlines()
    assert lines[0] == "## open [turn0view0] Doc" and lines[1] == "URL: https://example.org/doc"
    numbered = [ln for ln in lines if ln.startswith("L")]
    assert (numbered[0], numbered[-1]) == (first, last)
    assert (lines[-1] if tail else None) == tail


def test_open_of_a_truncated_page_says_so():
    assert W.format_open("v", page("a", truncated=True), 0, 10_000).endswith("(the page was cut to the fetch limit here)")


@pytest.mark.parametrize("pattern,expected", [
    ("magic", ['## find "magic" in [turn0view0] https://example.org/doc: 1 match', "L2: The magic word."]),
    ("THE", ['## find "THE" in [turn0view0] https://example.org/doc: 2 matches', "L0: The start.", "L2: The magic word."]),
    ("absent", ['## find "absent" in [turn0view0] https://example.org/doc: 0 matches']),
])
def test_find_lists_matching_lines(pattern, expected):
    assert W.format_find("turn0view0", page("The start.\nmiddle\n  The magic word.  "), pattern, 10_000).splitlines() == expected


@pytest.mark.parametrize("failures,ok,status", [
    ([], 1, 200),
    ([W.Failure("unavailable", "Search failed: x did not answer within 15 s.", timed_out=True)], 0, 504),
    ([W.Failure("url_not_accessible", "https://a did not answer within 20 s.", timed_out=True),
      W.Failure("unavailable", "Search failed: x did not answer within 15 s.", timed_out=True)], 0, 504),
    ([W.Failure("unavailable", "Search failed: cannot reach SearXNG at x")], 0, 502),
    ([W.Failure("too_many_requests", "x answered 429"),
      W.Failure("unavailable", "y did not answer within 1 s.", timed_out=True)], 0, 502),
    ([W.Failure("unavailable", "Search failed: cannot reach SearXNG at x")], 1, 200),   # something else worked
    ([W.Failure("url_not_allowed", "Not fetched: private address")], 0, 200),           # a refusal the model reads
    ([W.Failure("invalid_tool_input", "Unknown ref_id")], 0, 200),
])
def test_answer_status(failures, ok, status):
    got, payload = W.answer(["section"], failures, ok, 10_000)
    assert got == status
    if status == 200:
        assert payload == {"output": "section", "encrypted_output": None}
    else:
        assert set(payload) == {"error"} and payload["error"]["code"] == status
        assert all(f.message in payload["error"]["message"] for f in failures)


def test_answer_is_cut_to_max_output_tokens():
    _, payload = W.answer(["x" * 50], [], 1, 20)
    assert payload["output"] == "x" * 20 + "\n(cut to max_output_tokens)"


def _parsed(opens, finds):
    return W.Parsed(session="", queries=(), opens=tuple((r, 0) for r in opens), finds=tuple((r, "p") for r in finds),
                    unsupported=(), results=None, output_tokens=100)


@pytest.mark.parametrize("cap,opens,finds,run,left", [
    (10, ["a", "b"], ["c"], (["a", "b"], ["c"]), []),
    (2, ["a", "b", "c"], ["d"], (["a", "b"], []), ["open c", 'find "p" in d']),
    (3, ["a"], ["b", "c", "d"], (["a"], ["b", "c"]), ['find "p" in d']),
    (0, ["a"], ["b"], ([], []), ["open a", 'find "p" in b']),
    (-1, ["a"], [], ([], []), ["open a"]),
])
def test_page_commands_over_the_cap_are_left_out(cap, opens, finds, run, left):
    kept, out = W.within_cap(_parsed(opens, finds), cap)
    assert ([r for r, _ in kept.opens], [r for r, _ in kept.finds]) == run and out == left


def test_the_note_names_what_was_left_out():
    note = W.over_cap_note([f"open u{i}" for i in range(12)], 3)
    assert note.startswith("## not run: 12 page commands\nThis server runs at most 3 open/find commands per call")
    assert "open u9; and 2 more." in note and "u10" not in note


def test_ref_store_is_bounded_and_counts_turns():
    store = W.RefStore(max_sessions=2, max_refs=3)
    assert store.begin("a") == (0, {})
    store.add("a", {"turn0search0": "https://u1/", "turn0search1": "https://u2/"})
    assert store.begin("a") == (1, {"turn0search0": "https://u1/", "turn0search1": "https://u2/"})
    store.add("a", {"turn1search0": "https://u3/", "turn1view0": "https://u4/"})  # the oldest turn's first goes
    assert store.begin("a")[1] == {"turn0search1": "https://u2/", "turn1search0": "https://u3/", "turn1view0": "https://u4/"}
    store.begin("b")
    store.begin("c")  # "a" is the least recently used of three: dropped
    assert store.begin("a") == (0, {})
    # No thread id: nothing is remembered.
    store.add("", {"turn0search0": "https://u/"})
    assert store.begin("") == (0, {}) and store.begin("") == (0, {})


def test_ref_store_marks_results_that_echoed_their_query():
    store = W.RefStore(max_sessions=2, max_refs=2)
    store.begin("a")
    store.add("a", {"turn0search0": "https://a.test/?q=k", "turn0search1": "https://u1/"}, echoes={"turn0search0"})
    assert store.thread("a") == W.Thread(1, {"turn0search0": "https://a.test/?q=k", "turn0search1": "https://u1/"},
                                         {"turn0search0"}, set())
    store.add("a", {"turn1search0": "https://u2/"}, read={"https://u3/", "javascript:x"})  # the oldest ref goes,
    found = store.thread("a")                                                           # and its mark with it
    assert (found.refs, found.echoes, found.read) == ({"turn0search1": "https://u1/", "turn1search0": "https://u2/"},
                                                      set(), {"https://u3/"})
    assert "!turn0search0" not in store.state.fields(W.REFS_USE, "a")


def test_both_cores_mark_the_timeouts_504_depends_on():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog and are never answered
    port = silent.getsockname()[1]
    try:
        slow = SearXNG(f"http://127.0.0.1:{port}", 5, 0.3).search("q")
        with pytest.raises(FetchError) as e:
            Fetcher(Config(web_fetch_allowed_networks=("127.0.0.0/8",), web_fetch_timeout=0.3)).fetch(
                f"http://127.0.0.1:{port}/slow")
    finally:
        silent.close()
    assert slow.timed_out and "did not answer within" in slow.message
    assert W.Failure(slow.error_code, slow.message, slow.timed_out).timeout
    assert e.value.timed_out and "did not answer within" in e.value.message
    assert W.Failure(e.value.code, e.value.message, e.value.timed_out).upstream


# ---- the real proxy under gunicorn ----------------------------------------------------------

@pytest.fixture
def pages(site):  # the web site stand-in of tests/conftest.py
    site.route("/doc", DOC)
    site.route("/plain", "line zero\nline one mentions Annie Case\nline two", headers={"Content-Type": "text/plain"})
    site.route("/paper.pdf", pdf_files.build([pdf_files.text_page("Abstract", "Pelicans read PDFs too.")],
                                             title="A paper"), headers={"Content-Type": "application/pdf"})
    return site


def post(proxy, payload, headers=None) -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    req = urllib.request.Request(proxy.url + PATH, data=data, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer sk-local",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# name: (request commands or raw bytes, status, strings the output holds, SearXNG queries)
SERVED = {
    "one query": ({"search_query": [{"q": "vllm 0.32 release notes"}]}, 200,
                  ["[turn0search0] vllm 0.32 release notes — result 1", "URL: https://example.org/vllm-0.32-release-notes/1",
                   "Snippet 1 about vllm 0.32 release notes."], ["vllm 0.32 release notes"]),
    "two queries, refs numbered across them": ({"search_query": [{"q": "alpha"}, {"q": "beta"}]}, 200,
                                               ["[turn0search0] alpha", "[turn0search3] beta", "[turn0search5]"], ["alpha", "beta"]),
    "domain filter on the results": ({"search_query": [{"q": "alpha", "domains": ["other.org"]}]}, 200,
                                     ['No results for "alpha" from the allowed domains'], ["alpha"]),
    "a bang is not sent": ({"search_query": [{"q": "!g alpha"}]}, 200, ['## search_query "g alpha"'], ["g alpha"]),
    "empty query, as web.run's text suggests for an accidental call": (
        {"search_query": [{"q": ""}]}, 200, ["Search failed: the query is empty"], []),
    "open a URL": ({"open": [{"ref_id": "{site}/doc"}]}, 200,
                   ["## open [turn0view0] vLLM 0.32 notes", "URL: {site}/doc", "The magic word is PELICAN-7731."], []),
    "open a PDF": ({"open": [{"ref_id": "{site}/paper.pdf"}]}, 200,
                   ["## open [turn0view0] A paper", "application/pdf", "L0: PDF, 1 page.", "Pelicans read PDFs too."], []),
    "open from a line": ({"open": [{"ref_id": "{site}/plain", "lineno": 2}]}, 200, ["L2: line two"], []),
    "find in a URL": ({"find": [{"ref_id": "{site}/plain", "pattern": "annie case"}]}, 200,
                      ['## find "annie case" in [{site}/plain] {site}/plain: 1 match', "L1: line one mentions Annie Case"], []),
    "a missing page fails, the search still answers": (
        {"search_query": [{"q": "alpha"}], "open": [{"ref_id": "{site}/gone"}]}, 200,
        ["[turn0search0] alpha", "## open {site}/gone\nFailed (url_not_accessible): {site}/gone answered HTTP 404"], ["alpha"]),
    "an unknown ref id": ({"open": [{"ref_id": "turn7search1"}]}, 200, ["Failed (invalid_tool_input): Unknown ref_id 'turn7search1'"], []),
    "unsupported commands only": ({"finance": [{"ticker": "AMD", "type": "equity"}]}, 200,
                                  ["## not available: finance"], []),
}


@pytest.mark.parametrize("name", SERVED)
def test_served(start_proxy, searxng, pages, name):
    commands, status, holds, queries = SERVED[name]
    proxy = start_proxy(**LOOPBACK)
    commands = json.loads(json.dumps(commands).replace("{site}", pages.url))
    got, payload = post(proxy, body(**commands))
    assert got == status, payload
    assert set(payload) == {"output", "encrypted_output"} and payload["encrypted_output"] is None
    for text in holds:
        assert text.replace("{site}", pages.url) in payload["output"], payload["output"]
    assert sorted(searxng.queries) == sorted(queries)  # a round's searches run concurrently
    assert all(r.params["format"] == "json" for r in searxng.requests)
    opened = [c["ref_id"] for c in commands.get("open", []) + commands.get("find", []) if c["ref_id"].startswith("http")]
    assert [pages.url + r.path for r in pages.requests] == opened


def test_page_commands_over_alpha_search_max_pages_are_not_run(start_proxy, searxng, pages):
    """A prompt-injected model asking for many pages in one call gets the first few and a note it reads."""
    proxy = start_proxy(ALPHA_SEARCH_MAX_PAGES="1", **LOOPBACK)
    got, payload = post(proxy, body(search_query=[{"q": "alpha"}], open=[{"ref_id": f"{pages.url}/doc"}],
                                    find=[{"ref_id": f"{pages.url}/plain", "pattern": "Annie"}]))
    assert got == 200, payload
    out = payload["output"]
    assert "PELICAN-7731" in out and "[turn0search0] alpha" in out
    assert (f'## not run: 1 page command\nThis server runs at most 1 open/find commands per call (ALPHA_SEARCH_MAX_PAGES); '
            f'these were not run: find "Annie" in {pages.url}/plain.') in out
    assert [r.path for r in pages.requests] == ["/doc"] and searxng.queries == ["alpha"]


def test_recency_reaches_searxng_as_time_range(start_proxy, searxng):
    proxy = start_proxy(**LOOPBACK)
    got, _ = post(proxy, body(search_query=[{"q": "vllm news", "recency": 7}, {"q": "plain"}]))
    assert got == 200
    assert {r.query: r.params.get("time_range") for r in searxng.requests} == {"vllm news": "week", "plain": None}


def test_refs_of_one_call_open_in_the_next(start_proxy, searxng, pages):
    """Codex sends its thread id as `id`: a search result's ref id opens in a later call."""
    proxy = start_proxy(**{**LOOPBACK, "WEB_FETCH_CACHE_TTL": "300"})
    searxng.behave("vllm notes", "results", results=[result(pages.url + "/doc", "The notes", "About 0.32.")])
    got, first = post(proxy, {**body(search_query=[{"q": "vllm notes"}]), "id": "thread-refs"})
    assert got == 200 and "[turn0search0] The notes" in first["output"]
    got, second = post(proxy, {**body(open=[{"ref_id": "turn0search0"}], find=[{"ref_id": "turn1view0", "pattern": "magic"}]),
                               "id": "thread-refs"})
    assert got == 200, second
    assert "## open [turn1view0] vLLM 0.32 notes" in second["output"]
    assert '## find "magic" in [turn1view0]' in second["output"] and "PELICAN-7731" in second["output"]
    # Another thread's ids are not this one's.
    got, other = post(proxy, {**body(open=[{"ref_id": "turn0search0"}]), "id": "thread-other"})
    assert got == 200 and "Unknown ref_id 'turn0search0'" in other["output"]
    # The fetch core's cache served the find: the page was downloaded once.
    assert [r.path for r in pages.requests] == ["/doc"]


def test_settings_filters_apply_to_results_and_pages(start_proxy, searxng, pages):
    proxy = start_proxy(**LOOPBACK)
    payload = {**body(search_query=[{"q": "alpha"}], open=[{"ref_id": pages.url + "/doc"}]),
               "settings": {"filters": {"allowed_domains": ["docs.vllm.ai"]}}}
    got, answer = post(proxy, payload)
    assert got == 200, answer
    assert 'No results for "alpha" from the allowed domains' in answer["output"]
    assert "Failed (url_not_allowed)" in answer["output"] and pages.requests == []


def test_loopback_pages_are_refused_without_the_allow_list(start_proxy, searxng, pages):
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2")
    got, answer = post(proxy, body(open=[{"ref_id": pages.url + "/doc"}]))
    assert got == 200 and "Failed (url_not_allowed)" in answer["output"], answer
    assert pages.requests == []


# name: (proxy env, SearXNG behaviour, request body, status, error message holds)
FAILING = {
    "not JSON": ({}, None, b"{nope", 400, "not valid JSON"),
    "no commands": ({}, None, {"id": "t", "model": "m"}, 400, "`commands` must be an object"),
    "a query that is not a string": ({}, None, body(search_query=[{"q": 1}]), 400, "`commands.search_query[0].q`"),
    "SearXNG rate-limits": ({}, ("status", {"code": 429}), body(search_query=[{"q": "alpha"}]), 502, "429 Too Many Requests"),
    "SearXNG is down": ({"SEARXNG_URL": "http://127.0.0.1:9"}, None, body(search_query=[{"q": "alpha"}]), 502,
                        "cannot reach SearXNG at http://127.0.0.1:9"),
    "SearXNG times out": ({"SEARXNG_TIMEOUT": "0.3"}, ("slow", {"seconds": 1.5}), body(search_query=[{"q": "alpha"}]), 504,
                          "did not answer within 0.3 s"),
}


@pytest.mark.parametrize("name", FAILING)
def test_failing(start_proxy, searxng, name):
    env, behaviour, payload, status, holds = FAILING[name]
    proxy = start_proxy(**{**LOOPBACK, **env})
    if behaviour:
        searxng.behave(None, behaviour[0], **behaviour[1])
    got, answer = post(proxy, payload)
    assert got == status, answer
    assert set(answer) == {"error"} and answer["error"]["code"] == status and holds in answer["error"]["message"]
    assert answer["error"]["type"] == {400: "invalid_request_error", 502: "bad_gateway", 504: "gateway_timeout"}[status]
    expected = [] if status == 400 or "SEARXNG_URL" in env else ["alpha"]
    assert searxng.queries == expected


def test_the_proxy_key_guards_it(start_proxy, searxng):
    proxy = start_proxy(PROXY_API_KEY="sk-local", **LOOPBACK)
    got, answer = post(proxy, body(search_query=[{"q": "alpha"}]), headers={"Authorization": "Bearer wrong"})
    assert got == 401 and answer["error"]["type"] == "authentication_error"
    assert searxng.queries == []
    got, _ = post(proxy, body(search_query=[{"q": "alpha"}]))
    assert got == 200 and searxng.queries == ["alpha"]


def test_access_log_counts_the_searches(start_proxy, searxng):
    proxy = start_proxy(**LOOPBACK)

    def lines():
        return [ln for ln in proxy.log().splitlines() if "POST /v1/alpha/search 200" in ln]

    before = len(lines())
    got, _ = post(proxy, body(search_query=[{"q": "one"}, {"q": "two"}, {"q": "three"}]))
    assert got == 200
    # The line is written when the body has been sent, which may be just after the client read it.
    deadline = time.monotonic() + 5
    while len(lines()) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines()) == before + 1 and "searches=3" in lines()[-1], lines()[before:]


@pytest.mark.parametrize("opener, known", [("alice", True), ("bob", False)])
def test_a_threads_refs_are_its_keys_alone(start_proxy, searxng, pages, tmp_path, opener, known):
    """With people's keys (issue 51), a member who learns another's Codex thread id opens none of its refs."""
    from test_team import ADMIN_KEY, add_key
    keys_file = tmp_path / "keys.json"
    keys = {name: add_key(keys_file, name) for name in ("alice", "bob")}
    proxy = start_proxy(**{**LOOPBACK, "PROXY_KEYS_FILE": str(keys_file), "PROXY_API_KEY": ADMIN_KEY,
                           "PROXY_STATE_DB": str(tmp_path / "state.sqlite3")})
    searxng.behave("private plans", "results", results=[result(pages.url + "/doc", "The notes", "About 0.32.")])
    got, first = post(proxy, {**body(search_query=[{"q": "private plans"}]), "id": "thread-alice"},
                      {"Authorization": f"Bearer {keys['alice']}"})
    assert got == 200 and "[turn0search0] The notes" in first["output"]
    got, second = post(proxy, {**body(open=[{"ref_id": "turn0search0"}]), "id": "thread-alice"},
                       {"Authorization": f"Bearer {keys[opener]}"})
    assert got == 200, second
    assert ("PELICAN-7731" in second["output"]) == known, second["output"]
    assert ("Unknown ref_id 'turn0search0'" in second["output"]) != known
    assert [r.path for r in pages.requests] == (["/doc"] if known else [])


@pytest.mark.parametrize("second, downloads", [("alice", 1), ("bob", 2)])
def test_one_members_searches_and_pages_are_no_cache_hit_for_another(start_proxy, searxng, pages, tmp_path, second,
                                                                     downloads):
    """With people's keys (issue 51), the search and page caches are each person's: a hit (its speed, its
    "(cached, 4 s old)", a page's Retrieved time) would tell bob what alice searched and read, and when."""
    from test_team import ADMIN_KEY, add_key
    keys_file = tmp_path / "keys.json"
    keys = {name: add_key(keys_file, name) for name in ("alice", "bob")}
    proxy = start_proxy(**{**LOOPBACK, "WEB_FETCH_CACHE_TTL": "300", "SEARCH_CACHE_TTL": "300", "PROXY_WORKERS": "1",
                           "PROXY_KEYS_FILE": str(keys_file), "PROXY_API_KEY": ADMIN_KEY,
                           "PROXY_STATE_DB": str(tmp_path / "state.sqlite3")})
    commands = body(search_query=[{"q": "private plans"}], open=[{"ref_id": pages.url + "/doc"}])
    outputs = []
    for who in ("alice", second):
        got, answer = post(proxy, {**commands, "id": str(uuid.uuid4())}, {"Authorization": f"Bearer {keys[who]}"})
        assert got == 200 and "PELICAN-7731" in answer["output"], answer
        outputs.append(answer["output"])
    assert searxng.queries == ["private plans"] * downloads
    assert [r.path for r in pages.requests] == ["/doc"] * downloads
    assert ("(cached" in outputs[1]) == (downloads == 1)
