"""The proxy's pure rules, table by table, with no network: injection, tool-call parsing,
SearXNG answers, result formatting, headers, keys and error mapping.

Run: tests/run.sh tests/test_rules.py
"""
import gzip
import json

import pytest

from proxy.apis.chat import rules as chat_rules
from proxy.backends.search.search import Hit, SearchOutcome, filter_domains
from proxy.backends.search.searxng import outcome_from_response, search_url
from proxy.core.codec import data_of, event_and_data, iter_frame_batches, iter_frames
from proxy.core.config import Config
from proxy.http.app import outbound_headers
from proxy.http.team import key_ok, presented_key
from proxy.tools import registry
from proxy.tools.base import NOT_EXECUTED, Backends
from proxy.tools.session import ToolSession
from proxy.tools.web_search import format_for_model, parse_arguments
from proxy.transport.decoding import Decoder
from proxy.transport.http1 import end_to_end_headers
from proxy.transport.vllm import UpstreamError, gateway_status
from standins.searxng import default_results, page, result

USER = [{"role": "user", "content": "hi"}]
CLIENT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CLIENT_WEB_SEARCH = {"type": "function", "function": {"name": "web_search", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("body, enabled, expected", [
    ({"messages": USER}, True, True),
    ({"messages": USER, "tools": [CLIENT_TOOL]}, True, True),
    ({"messages": USER, "tool_choice": "auto"}, True, True),
    ({"messages": USER, "tool_choice": "required", "tools": [CLIENT_TOOL]}, True, True),
    ({"messages": USER, "tool_choice": "none"}, True, False),
    ({"messages": USER, "tools": [CLIENT_WEB_SEARCH]}, True, False),
    ({"messages": USER, "tools": [CLIENT_TOOL, CLIENT_WEB_SEARCH]}, True, False),
    ({"messages": USER, "n": 2}, True, False),
    ({"messages": USER, "n": 1}, True, True),
    ({"messages": USER}, False, False),
])
def test_web_search_is_injected(body, enabled, expected):
    assert ("web_search" in chat_rules.tools_to_inject(body, ("web_search",) if enabled else ())) is expected


def test_with_tools_keeps_every_other_field():
    body = {"messages": USER, "tools": [CLIENT_TOOL], "temperature": 0.3, "chat_template_kwargs": {"enable_thinking": False},
            "structured_outputs": {"regex": "x"}, "stream_options": {"include_usage": True}, "vendor_x": [1]}
    out = chat_rules.with_tools(body, ("web_search",))
    assert out["tools"] == [CLIENT_TOOL, chat_rules.chat_tool("web_search")]
    assert {k: v for k, v in out.items() if k != "tools"} == {k: v for k, v in body.items() if k != "tools"}
    assert body["tools"] == [CLIENT_TOOL]  # the client's request is not mutated
    fn = chat_rules.chat_tool("web_search")["function"]
    assert fn["parameters"]["required"] == ["query"] and fn["parameters"]["properties"]["query"]["type"] == "string"


@pytest.mark.parametrize("body, param", [
    ([], None),
    ("text", None),
    ({}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages"),
    ({"messages": USER, "tools": {"a": 1}}, "tools"),
    ({"messages": USER, "tools": ["x"]}, "tools"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "stream_options": []}, "stream_options"),
    ({"messages": USER, "tool_choice": 3}, "tool_choice"),
])
def test_validate_rejects(body, param):
    problem = chat_rules.validate(body)
    assert problem is not None and problem[1] == param


@pytest.mark.parametrize("body", [
    {"messages": USER}, {"messages": USER, "tools": None, "stream": None},
    {"messages": USER, "stream": True, "tools": [CLIENT_TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
])
def test_validate_accepts(body):
    assert chat_rules.validate(body) is None


@pytest.mark.parametrize("arguments, query, code", [
    ('{"query": "vllm docs"}', "vllm docs", None),
    ({"query": "  spaced   out  "}, "spaced out", None),
    ('{"query": "!!g python"}', "g python", None),  # the bang mark goes, the word stays
    ('{"query": "! wp  rust"}', "wp rust", None),
    ('{"query": ""}', None, "invalid_tool_input"),
    ('{"query": "!!"}', None, "invalid_tool_input"),
    ('{"q": "x"}', None, "invalid_tool_input"),
    ("{not json", None, "invalid_tool_input"),
    ("", None, "invalid_tool_input"),
    ('["query"]', None, "invalid_tool_input"),
    ('{"query": 5}', None, "invalid_tool_input"),
    (json.dumps({"query": "x" * 401}), None, "query_too_long"),
])
def test_parse_arguments(arguments, query, code):
    q, early = parse_arguments(arguments)
    assert q == query
    assert (early.error_code if early else None) == code
    if early:
        assert early.status == "failed" and early.message.startswith("Search failed")


def test_search_url_encodes_the_query():
    assert search_url("http://s:8080/", "a&b c") == "http://s:8080/search?q=a%26b+c&format=json"
    assert search_url("http://s", "x", "de").endswith("&language=de")


OK_PAGE = json.dumps(page("q", default_results("q"))).encode()


@pytest.mark.parametrize("status, body, expected_status, code, phrase", [
    (200, OK_PAGE, "ok", None, None),
    (200, json.dumps(page("q", [])).encode(), "empty", None, "No results"),
    (200, json.dumps(page("q", [], unresponsive=[("duckduckgo", "HTTP connection error")])).encode(), "failed",
     "unavailable", "duckduckgo (HTTP connection error)"),
    (403, b"<html>Forbidden</html>", "failed", "unavailable", "search.formats"),
    (429, b"Too Many Requests", "failed", "too_many_requests", "rate-limited"),
    (500, b'{"error": "search error"}', "failed", "unavailable", "HTTP 500"),
    (502, b"bad gateway", "failed", "unavailable", "HTTP 502"),
    (302, b"", "failed", "unavailable", "redirect"),
    (200, b"<html>not json</html>", "failed", "unavailable", "not answer with JSON"),
    (200, b"[1, 2]", "failed", "unavailable", "not an object"),
    # nested thousands deep: json's RecursionError is a failed search, not an error escaping the backend
    (200, b"[" * 100000, "failed", "unavailable", "not answer with JSON"),
    # a hostile engine list: control characters and non-string names are not passed on
    (200, json.dumps(page("q", [], unresponsive=[("ddg\x1b[2J", "x"), (7, "y"), ("brave", "CAPTCHA\r\nInjected")])).encode(),
     "failed", "unavailable", "every search engine behind http://searx failed: brave (CAPTCHA Injected)."),
], ids=["ok", "empty", "engines-failed", "403", "429", "500", "502", "302", "not-json", "not-object", "nested",
        "hostile-engines"])
def test_outcome_from_response(status, body, expected_status, code, phrase):
    o = outcome_from_response("q", "http://searx", status, body, 5)
    assert o.status == expected_status and o.error_code == code
    if phrase:
        assert phrase in o.message
    if status == 403 or status == 429:
        assert "http://searx" in o.message


def test_outcome_keeps_top_n_and_reads_dates_answers_infoboxes():
    results = [result(f"https://e.org/{i}", f"T{i}", "  lots \n of   space ", "2025-01-02T03:04:05") for i in range(9)]
    body = json.dumps(page("q", results, answers=["42"], infoboxes=[{"infobox": "Python", "content": "A language."}]))
    o = outcome_from_response("q", "u", 200, body.encode(), 3)
    assert [h.url for h in o.hits] == ["https://e.org/0", "https://e.org/1", "https://e.org/2"]
    assert o.hits[0].snippet == "lots of space" and o.hits[0].date == "2025-01-02"
    text = format_for_model(o)
    assert "Answer: 42" in text and "Infobox: Python: A language." in text
    assert "[1] T0\nURL: https://e.org/0\nDate: 2025-01-02\nSnippet: lots of space" in text


@pytest.mark.parametrize("failing, note", [
    ([], None),
    ([("startpage", "timeout"), ("duckduckgo", "CAPTCHA")],
     "Some search engines failed (duckduckgo: CAPTCHA, startpage: timeout); these results come from the others."),
    ([(f"e{i}", "timeout") for i in range(8)],
     "Some search engines failed (e0: timeout, e1: timeout, e2: timeout, e3: timeout, e4: timeout, e5: timeout and 2 "
     "more); these results come from the others."),
])
def test_results_from_only_some_engines_say_so_in_one_line(failing, note):
    o = outcome_from_response("q", "u", 200, json.dumps(page("q", default_results("q"), unresponsive=failing)).encode(), 5)
    assert o.ok and o.notes == ([note] if note else [])
    lines = format_for_model(o).splitlines()
    assert lines[1:2] == ([f"Note: {note}"] if note else [""])


def test_number_of_results_is_optional_and_missing_keys_tolerated():
    body = json.dumps({"query": "q", "number_of_results": 0, "results": [{"url": "https://a.b/", "title": "A"}]})
    o = outcome_from_response("q", "u", 200, body.encode(), 5)
    assert o.ok and o.hits == [Hit("A", "https://a.b/", "", None)]


# Named ids, and a fixed mtime: a test id that holds the gzip header's timestamp differs between two
# collections a second apart, and pytest-xdist refuses workers that collected different tests.
@pytest.mark.parametrize("encoding, body", [
    ("gzip", gzip.compress(OK_PAGE, mtime=0)), ("", OK_PAGE), ("identity", OK_PAGE)], ids=["gzip", "none", "identity"])
def test_a_searxng_answer_is_decoded_by_the_fetchers_bounded_decoder(encoding, body):
    assert Decoder(encoding).feed(body, len(OK_PAGE) + 1) == OK_PAGE


def test_format_for_model_failure_and_repeat():
    failed = SearchOutcome("q", "failed", message="Search failed: nope")
    assert format_for_model(failed) == "Search failed: nope"
    rep = SearchOutcome("q", "ok", hits=[Hit("t", "https://u")], repeated=True)
    assert format_for_model(rep).startswith("You already searched for exactly this")


@pytest.mark.parametrize("allowed, blocked, urls, status", [
    (["python.org"], None, ["https://docs.python.org/3/"], "ok"),
    (None, ["evil.com"], ["https://docs.python.org/3/", "https://x.org/", "https://notpython.org/"], "ok"),
    (["python.org"], ["docs.python.org"], [], "empty"),
    (["nowhere.org"], None, [], "empty"),
    (["https://docs.python.org/"], None, ["https://docs.python.org/3/"], "ok"),
])
def test_filter_domains(allowed, blocked, urls, status):
    o = SearchOutcome("q", "ok", hits=[Hit("a", "https://docs.python.org/3/"), Hit("b", "https://evil.com/x"),
                                       Hit("c", "https://x.org/"), Hit("d", "https://notpython.org/")])
    out = filter_domains(o, allowed, blocked)
    assert out.status == status and [h.url for h in out.hits] == urls


class FakeSearxng:
    """A search backend (proxy/backends/search/search.py's protocol) that counts calls; stands in for the HTTP side of
    SearXNG in session bookkeeping tests."""
    base_url = "http://s"
    results, timeout = 5, 1.0

    def __init__(self, status="ok"):
        self.calls = []
        self.status = status

    def search(self, query, language=None, limit=None, time_range=None, cancel=None):
        self.calls.append(query)
        return SearchOutcome(query, self.status, hits=[Hit("t", "https://u")] if self.status == "ok" else [],
                             message="No results" if self.status != "ok" else "")


def search(query: str):
    return registry.parse("web_search", {"query": query})


def test_session_repeats_are_not_searched_again_and_counts_add_up():
    s = FakeSearxng()
    session = ToolSession(Backends(s, None), max_rounds=3)
    first = session.run([search("rust"), search("Rust"), registry.parse("web_search", "{bad")])
    assert s.calls.count("rust") + s.calls.count("Rust") == 1 and session.rounds == 1
    assert sum(o.repeated for o in first) == 1 and first[2].status == "failed"
    again = session.run([search("rust")])
    assert again[0].repeated and len(s.calls) == 1
    assert not session.exhausted
    session.run([search("go")])
    assert session.exhausted and session.searches == 3 and session.failed == 1


@pytest.mark.parametrize("status, rounds, expected", [
    ("empty", [["a"], ["b"]], "2 of 2 search rounds used (2 searches, 0 repeated, 2 empty) — SearXNG returned no usable results"),
    ("ok", [["a"], ["b"]], "2 of 2 search rounds used (2 searches, 0 repeated, 0 empty)"),
    ("ok", [["a"], ["a"]], "2 of 2 search rounds used (1 search, 1 repeated, 0 empty)"),
    ("empty", [["a"]], "1 of 1 search round used (1 search, 0 repeated, 1 empty) — SearXNG returned no usable results"),
    ("ok", [["a", "b"], ["A", "b", "c"], []], "3 of 3 search rounds used (3 searches, 2 repeated, 0 empty)"),
])
def test_cap_message(status, rounds, expected):
    session = ToolSession(Backends(FakeSearxng(status), None), max_rounds=len(rounds))
    for queries in rounds:
        session.run([search(q) for q in queries])
    assert session.cap_message() == expected


def test_add_usage_sums_turns():
    a = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "completion_tokens_details": {"reasoning_tokens": 2}}
    b = {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37, "completion_tokens_details": {"reasoning_tokens": 1},
         "prompt_tokens_details": None}
    total = chat_rules.add_usage(chat_rules.add_usage(None, a), b)
    assert total == {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52,
                     "completion_tokens_details": {"reasoning_tokens": 3}, "prompt_tokens_details": None}
    assert chat_rules.add_usage(total, None) is total
    # The prefix cache's share adds up over the turns too (--enable-prompt-tokens-details).
    c = {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51, "prompt_tokens_details": {"cached_tokens": 32}}
    d = {**c, "prompt_tokens_details": {"cached_tokens": 48}}
    assert chat_rules.add_usage(chat_rules.add_usage(None, c), d)["prompt_tokens_details"] == {"cached_tokens": 80}


def test_tool_results_answer_every_call_in_order():
    calls = [{"id": "a", "function": {"name": "web_search", "arguments": "{}"}},
             {"id": "b", "function": {"name": "get_weather", "arguments": "{}"}},
             {"id": "c", "function": {"name": "web_search", "arguments": "{}"}}]
    outs = [SearchOutcome("x", "empty", message="none x"), SearchOutcome("y", "empty", message="none y")]
    msgs = chat_rules.tool_results(calls, outs)
    assert [m["tool_call_id"] for m in msgs] == ["a", "b", "c"]
    assert msgs[0]["content"] == "none x" and msgs[2]["content"] == "none y"
    assert msgs[1]["content"] == NOT_EXECUTED


def test_assistant_turn_keeps_reasoning_and_drops_response_only_fields():
    msg = {"role": "assistant", "content": None, "refusal": None, "annotations": None, "audio": None,
           "function_call": None, "reasoning": "think", "tool_calls": [
               {"id": "t1", "type": "function", "function": {"name": "web_search", "arguments": '{"query": "q"}'}}]}
    assert chat_rules.assistant_turn(msg) == {"role": "assistant", "content": None, "reasoning": "think", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "web_search", "arguments": '{"query": "q"}'}}]}


def test_next_request_forces_web_search_only_once():
    forced = {"type": "function", "function": {"name": "web_search"}}
    assert chat_rules.next_request({"messages": [], "tool_choice": forced}, USER)["tool_choice"] == "auto"
    assert chat_rules.next_request({"messages": [], "tool_choice": "required"}, USER)["tool_choice"] == "required"


@pytest.mark.parametrize("headers, expected", [
    ([("Connection", "keep-alive, X-Secret"), ("X-Secret", "1"), ("Keep-Alive", "5"), ("TE", "trailers"),
      ("Transfer-Encoding", "chunked"), ("Upgrade", "h2c"), ("Proxy-Authorization", "p"), ("X-Keep", "y")],
     [("X-Keep", "y")]),
    ([("Content-Type", "application/json"), ("Trailer", "x")], [("Content-Type", "application/json")]),
])
def test_end_to_end_headers(headers, expected):
    assert end_to_end_headers(headers) == expected


@pytest.mark.parametrize("cfg, expected_auth", [
    (Config(), [("Authorization", "Bearer client"), ("x-api-key", "ck")]),
    (Config(backend_api_key="vk"), [("Authorization", "Bearer vk")]),
    (Config(proxy_api_keys=("pk",)), []),
    (Config(proxy_api_keys=("pk",), backend_api_key="vk"), [("Authorization", "Bearer vk")]),
])
def test_outbound_headers_credentials(cfg, expected_auth):
    incoming = [("Host", "proxy:11433"), ("Authorization", "Bearer client"), ("x-api-key", "ck"),
                ("Content-Length", "5"), ("Connection", "close"), ("X-Request-Id", "r1")]
    out = outbound_headers(incoming, cfg)
    assert [h for h in out if h[0].lower() in ("authorization", "x-api-key")] == expected_auth
    assert ("X-Request-Id", "r1") in out
    assert not any(h[0].lower() in ("host", "content-length", "connection") for h in out)


@pytest.mark.parametrize("headers, key", [
    ({"Authorization": "Bearer abc"}, "abc"), ({"Authorization": "bearer abc "}, "abc"),
    ({"x-api-key": "xyz"}, "xyz"), ({"Authorization": "Basic abc"}, None), ({}, None)])
def test_presented_key(headers, key):
    assert presented_key(headers) == key


@pytest.mark.parametrize("key, keys, ok", [
    ("a", ("a",), True), ("b", ("a", "b"), True), ("c", ("a", "b"), False), (None, ("a",), False), ("", ("a",), False)])
def test_key_ok(key, keys, ok):
    assert key_ok(key, keys) is ok


@pytest.mark.parametrize("error, status, phrase", [
    (UpstreamError("timeout", "t"), 504, "timed out"),
    (UpstreamError("unreachable", "x", refused=True), 502, "still be loading"),
    (UpstreamError("unreachable", "x"), 502, "unreachable"),
])
def test_gateway_status(error, status, phrase):
    got, msg = gateway_status(error)
    assert got == status and phrase in msg


def test_iter_frames_reassembles_events_split_across_reads():
    stream = b"data: {\"a\":1}\n\ndata: [DONE]\n\n"
    pieces = [stream[i:i + 3] for i in range(0, len(stream), 3)]
    assert list(iter_frames(pieces)) == [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]
    assert list(iter_frames([b"data: x\n\ndata: cut"])) == [b"data: x\n\n", b"data: cut"]
    assert data_of(b"data: [DONE]\n\n") == b"[DONE]" and data_of(b": keep-alive\n\n") is None
    assert event_and_data(b"event: ping\ndata: {\"type\":\"ping\"}\n\n") == ("ping", b'{"type":"ping"}')


def test_iter_frame_batches_keeps_each_reads_events_together():
    reads = [b"data: 1\n\ndata: 2\n\ndata: ", b"3\n", b"\ndata: 4\n\n", b"data: cut"]
    assert list(iter_frame_batches(reads)) == [
        [b"data: 1\n\n", b"data: 2\n\n"], [], [b"data: 3\n\n", b"data: 4\n\n"], [], [b"data: cut"]]



class Pages:
    """A fetcher stand-in that records the URLs it was asked for: a refused URL must never reach it."""

    def __init__(self, text: str = "[next](/next)"):
        self.asked: list[str] = []
        self.text = text

    def fetch(self, url, **kw):
        from proxy.backends.pages.fetcher import Page
        self.asked.append(url)
        return Page(url, "T", self.text, "text/html", "2026-12-04T20:00:00Z", False)


@pytest.mark.parametrize("tool, args", [("web_fetch", {}), ("find_in_page", {"pattern": "next"})])
def test_session_refuses_an_ungiven_url_before_the_tool_runs_and_learns_links_and_hits(tool, args):
    from proxy.tools.provenance import Given, Ledger
    pages, refused = Pages(), []
    session = ToolSession(Backends(FakeSearxng(), pages), max_rounds=5, max_pages_per_turn=9, max_pages_per_request=9,
                          ledger=Ledger(given=[Given("user", "read https://docs.test/a")]), on_refused=refused.append)

    def call(url: str):
        return registry.parse(tool, {"url": url, **args})

    first = session.run([call("https://docs.test/a"), call("https://evil.test/?k=secret"), search("q")])
    assert [o.status for o in first] == ["ok", "failed", "ok"] and pages.asked == ["https://docs.test/a"]
    assert first[1].error_code == "url_not_allowed" and "did not appear" in first[1].message
    assert refused == ["not_given"]
    # The search's hit and, when the tool showed the page, its links are now given.
    second = session.run([call("https://u"), call("https://docs.test/next")])
    learned_links = tool == "web_fetch"  # find_in_page shows excerpts, not the page: its links are not learned
    assert [o.status for o in second] == ["ok", "ok" if learned_links else "failed"]
