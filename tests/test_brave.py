"""proxy/backends/search/brave.py, the keyed fallback: its request and answer reading without a network, then real searches
against standins/brave.py (built from Brave's documented Web Search API), asserting what the proxy's backend got and
what the stand-in received; the key is checked to reach that one header and no message, log line or repr.

Run: tests/run.sh tests/test_brave.py
"""
import json
import logging
import urllib.parse

import pytest

from proxy.backends.search.brave import SOURCE, BraveSearch, outcome_from_response, request_url
from standins.brave import KEY, BraveStandIn, error, web_result

API = "https://api.search.brave.com/res/v1/web/search"


@pytest.mark.parametrize("language, count, time_range, params", [
    (None, 5, None, {"q": "rust serde", "count": "5"}),
    ("en-US", 5, "week", {"q": "rust serde", "count": "5", "search_lang": "en", "freshness": "pw"}),
    ("de", 50, "day", {"q": "rust serde", "count": "20", "search_lang": "de", "freshness": "pd"}),
    ("auto", 0, "decade", {"q": "rust serde", "count": "1"}),
    ("zh-Hans", 3, "year", {"q": "rust serde", "count": "3", "search_lang": "zh", "freshness": "py"}),
])
def test_request_sends_only_what_brave_documents(language, count, time_range, params):
    url = request_url(API, "rust serde", language, count, time_range)
    parts = urllib.parse.urlsplit(url)
    assert url.startswith(API + "?") and dict(urllib.parse.parse_qsl(parts.query)) == params


def body(results) -> bytes:
    return json.dumps({"type": "search", "web": {"type": "search", "results": results}}).encode()


@pytest.mark.parametrize("status, raw, expected", [
    (200, body([web_result("https://a.example/x", "<strong>Serde</strong> &amp; you", "A <em>fast</em>  framework",
                           page_age="2026-03-01T10:00:00")]),
     ("ok", [("Serde & you", "https://a.example/x", "A fast framework", "2026-03-01")])),
    (200, body([web_result("https://a.example/y", "", "", age="3 days ago")]),
     ("ok", [("https://a.example/y", "https://a.example/y", "", "3 days ago")])),
    # hostile or broken shapes: skipped, never trusted
    (200, body([{"url": "javascript:alert(1)", "title": "x"}, {"url": 7}, "x", None,
                {"url": "https://b.example", "title": {"a": 1}, "description": ["x"], "page_age": 5, "age": 9}]),
     ("ok", [("https://b.example", "https://b.example", "", None)])),
    (200, b'{"type": "search", "web": {"results": "none"}}', ("empty", [])),
    (200, b'{"type": "search", "web": []}', ("empty", [])),
    (200, b"[1, 2]", ("failed", [])),
    (200, b"<html>", ("failed", [])),
    (200, b"[" * 100000, ("failed", [])),
], ids=["marked-up", "age-only", "hostile-items", "results-not-a-list", "web-not-an-object", "not-an-object",
        "not-json", "nested-too-deep"])
def test_answers_of_any_shape_become_outcomes(status, raw, expected):
    outcome = outcome_from_response("serde", status, raw, 5)
    assert (outcome.status, [(h.title, h.url, h.snippet, h.date) for h in outcome.hits]) == expected


def test_a_long_description_is_cut_and_the_limit_holds():
    results = [web_result(f"https://a.example/{i}", "t", "word " * 500) for i in range(10)]
    outcome = outcome_from_response("q", 200, body(results), 4)
    assert len(outcome.hits) == 4 and all(len(h.snippet) <= 403 for h in outcome.hits)


# ---- against the stand-in ----------------------------------------------------------------------

def backend(server, key=KEY, timeout=10.0, max_bytes=4 * 1024 * 1024):
    return BraveSearch(key, results=5, timeout=timeout, max_bytes=max_bytes, api_url=server.api_url)


def test_a_search_sends_the_key_in_its_header_and_reads_the_results(brave):
    outcome = backend(brave).search("vllm release notes", language="en-US", limit=2, time_range="month")
    assert outcome.status == "ok"
    assert [(h.title, h.url, h.snippet, h.date) for h in outcome.hits] == [
        ("vllm release notes & more 1", "https://brave.example/vllm-release-notes/1", "About vllm release notes, result 1.",
         "2026-10-01"),
        ("vllm release notes & more 2", "https://brave.example/vllm-release-notes/2", "About vllm release notes, result 2.",
         "2 days ago")]
    [seen] = brave.requests
    assert seen.path == "/res/v1/web/search"
    assert seen.params == {"q": "vllm release notes", "count": "2", "search_lang": "en", "freshness": "pm"}
    assert seen.headers["x-subscription-token"] == KEY and seen.headers["accept"] == "application/json"
    assert "x-forwarded-for" not in seen.headers


@pytest.mark.parametrize("mode, kw, key, status, code, words", [
    ("results", {}, "wrong-key", "failed", "unavailable", ["refused the key", "SUBSCRIPTION_TOKEN_INVALID", "BRAVE_SEARCH_API_KEY"]),
    ("ratelimited", {}, KEY, "failed", "too_many_requests", ["HTTP 429, RATE_LIMITED", "quota"]),
    ("status", {"code": 500}, KEY, "failed", "unavailable", ["HTTP 500, INTERNAL"]),
    ("status", {"code": 503, "body": b"<html>down</html>"}, KEY, "failed", "unavailable", ["HTTP 503."]),
    ("status", {"code": 401, "body": error(401, "x" * 80, "y")}, KEY, "failed", "unavailable", ["refused the key (HTTP 401)"]),
    ("nonjson", {}, KEY, "failed", "unavailable", ["did not answer with JSON"]),
    ("empty", {}, KEY, "empty", None, ["No results", SOURCE]),
    ("gzip", {}, KEY, "ok", None, ["Search results"]),
    ("raw", {"body": b'{"web": {"results": [{"url": "https://c.example", "title": "C"}]}}'}, KEY, "ok", None, []),
])
def test_each_answer_becomes_an_outcome_the_model_can_read(brave, caplog, mode, kw, key, status, code, words):
    brave.behave(mode, **kw)
    caplog.set_level(logging.DEBUG)
    bk = backend(brave, key=key)
    outcome = bk.search("serde json")
    text = outcome.message if status != "ok" else "Search results"
    assert (outcome.status, outcome.error_code) == (status, code)
    assert all(w in text for w in words), text
    assert len(brave.requests) == 1 and brave.requests[0].headers["x-subscription-token"] == key
    # the key is in the request header only
    assert key not in outcome.message and key not in caplog.text and key not in repr(bk)


@pytest.mark.parametrize("how", ["slow", "too big", "refused"])
def test_a_slow_big_or_missing_api_is_a_failed_search(brave, how):
    if how == "slow":
        brave.behave("slow", seconds=5)
        outcome = backend(brave, timeout=0.3).search("q")
        words = "did not answer within 0.3 s"
    elif how == "too big":
        outcome = backend(brave, max_bytes=100).search("q")
        words = "more than 100 bytes"
    else:
        gone = BraveStandIn()
        gone.close()
        outcome = backend(gone).search("q")
        words = "cannot reach the Brave Search API"
    assert outcome.status == "failed" and words in outcome.message, outcome.message
    assert len(brave.requests) == (0 if how == "refused" else 1)
