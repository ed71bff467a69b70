"""proxy/backends/search/failover.py against real stand-ins on loopback: several SearXNG instances (standins/searxng.py) asked
in order within one deadline, a failed one cooling down (on a fake clock, so nothing waits), a dead and a slow one,
the one retry of an all-engines-failed search, the keyed fallback against standins/brave.py, and the engine
bookkeeping and health view. Each test asserts what the search gave and what each stand-in received.

Run: tests/run.sh tests/test_search_failover.py
"""
import json
import logging
import socket
import threading
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.backends.search.brave import BraveSearch
from proxy.backends.search.failover import DEVELOPER_ENGINES, FailoverSearch
from proxy.backends.search.search_health import COOL_DOWN_FIRST
from proxy.backends.search.searxng import SearXNG
from proxy.runtime.cancel import Cancel
from standins.brave import KEY
from standins.rawhttp import raw_request
from standins.searxng import SearxngStandIn
from standins.vllm_wire import completion, json_reply, tool_call


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture(scope="module")
def _servers():
    servers = [SearxngStandIn() for _ in range(3)]
    yield servers
    for s in servers:
        s.close()


@pytest.fixture
def servers(_servers):
    for s in _servers:
        s.reset()
    yield _servers
    for s in _servers:
        s.reset()
        if s.server is None:
            s.start()  # a test closed it to play a dead instance


def failover(servers, timeout=10.0, clock=None, keyed=None, mode="fallback", seen=None):
    instances = [SearXNG(s.url, 5, timeout) for s in servers]
    return FailoverSearch(instances, timeout, keyed=keyed, keyed_mode=mode, clock=clock or Clock(),
                          on_engine_failure=(lambda e, r: seen.append((e, r))) if seen is not None else None)


def asked(servers):
    return [len(s.requests) for s in servers]


# ---- order and failover -----------------------------------------------------------------------------

@pytest.mark.parametrize("behaviours, answerer, requests, note", [
    ([("results", {}), ("results", {}), ("results", {})], 0, [1, 0, 0], None),
    ([("status", {"code": 500}), ("results", {}), ("results", {})], 1, [1, 1, 0],
     "a fallback: {0} it answered with an error."),
    ([("status", {"code": 429}), ("nonjson", {}), ("results", {})], 2, [1, 1, 1],
     "a fallback: {0} it is rate-limiting; {1} it answered with an error."),
    ([("dead", {}), ("results", {}), ("results", {})], 1, [1, 1, 0],
     "a fallback: {0} every engine behind it failed."),
    ([("redirect", {}), ("empty", {}), ("results", {})], 1, [1, 1, 0], None),  # an empty answer is an answer
], ids=["first-answers", "error-then-second", "two-fail", "engines-dead", "empty-is-an-answer"])
def test_instances_are_asked_in_order_until_one_answers(servers, behaviours, answerer, requests, note):
    for server, (mode, kw) in zip(servers, behaviours, strict=True):
        server.behave(None, mode, **kw)
    outcome = failover(servers).search("rust serde")
    assert asked(servers) == requests
    assert all(r.query == "rust serde" and "engines" not in r.params for s in servers for r in s.requests)
    if behaviours[answerer][0] == "results":
        assert outcome.status == "ok" and outcome.hits[0].url == "https://example.org/rust-serde/1"
    else:
        assert outcome.status == "empty"
    expected = [] if note is None else [
        f"Answered by the SearXNG instance at {servers[answerer].url}, " + note.format(*(s.url for s in servers))]
    assert [n for n in outcome.notes if n.startswith("Answered by")] == expected


def test_a_dead_instance_is_skipped(servers):
    servers[0].close()
    outcome = failover(servers).search("q")
    assert outcome.status == "ok" and asked(servers) == [0, 1, 0]
    assert outcome.notes == [f"Answered by the SearXNG instance at {servers[1].url}, a fallback: "
                             f"{servers[0].url} it is unreachable."]


def test_a_dead_and_a_slow_instance_leave_the_third_time_within_the_deadline(servers):
    servers[0].close()
    servers[1].behave(None, "slow", seconds=30)
    outcome = failover(servers, timeout=3.0, clock=None).search("q")  # the real clock: budgets are real time here
    assert outcome.status == "ok", outcome.message
    assert asked(servers) == [0, 1, 1]
    assert "it is unreachable" in outcome.notes[0] and f"{servers[1].url} it timed out" in outcome.notes[0]


def test_when_every_instance_fails_the_model_reads_each_reason(servers):
    servers[0].behave(None, "status", code=502)
    servers[1].behave(None, "status", code=429)
    servers[2].close()
    outcome = failover(servers).search("q")
    assert (outcome.status, outcome.error_code) == ("failed", "unavailable")
    assert outcome.message.startswith("Search failed everywhere it was tried: ")
    assert f"{servers[0].url} answered HTTP 502" in outcome.message
    assert f"{servers[1].url} answered 429" in outcome.message and f"SearXNG at {servers[2].url}" in outcome.message
    assert asked(servers) == [1, 1, 0]


def test_one_instance_fails_as_it_always_did(servers):
    servers[0].behave(None, "status", code=502)
    outcome = failover(servers[:1]).search("q")
    assert outcome.message == f"Search failed: {servers[0].url} answered HTTP 502." and asked(servers) == [1, 0, 0]


# ---- cool-down --------------------------------------------------------------------------------------

def test_a_failed_instance_is_not_asked_first_until_its_cool_down_ends(servers):
    clock = Clock()
    search = failover(servers[:2], clock=clock)
    servers[0].behave(None, "status", code=500)
    search.search("one")
    assert asked(servers) == [1, 1, 0]
    clock.now += COOL_DOWN_FIRST - 1
    outcome = search.search("two")  # the first is cooling down: not asked at all while the second answers
    assert asked(servers) == [1, 2, 0] and f"{servers[0].url} failed lately" in outcome.notes[0]
    clock.now += 1
    search.search("three")  # cooled down: asked first again, fails again, now for twice as long
    assert asked(servers) == [2, 3, 0]
    assert search.instances.view()[0]["cooling_down_for_seconds"] == 2 * COOL_DOWN_FIRST
    clock.now += 2 * COOL_DOWN_FIRST - 1
    search.search("four")
    assert asked(servers) == [2, 4, 0]
    servers[0].behave(None, "results")
    clock.now += 1
    outcome = search.search("five")
    assert asked(servers) == [3, 4, 0] and outcome.notes == []
    assert search.instances.view()[0]["state"] == "up" and search.instances.view()[0]["failures_in_a_row"] == 0


def test_a_client_that_left_cools_nothing_down(servers):
    servers[0].behave(None, "slow", seconds=10)
    cancel = Cancel()
    threading.Timer(0.3, cancel.abort).start()
    search = failover(servers[:2])
    outcome = search.search("q", cancel=cancel)
    assert outcome.message == "Search failed: the client closed the request."
    assert asked(servers) == [1, 0, 0] and search.instances.view()[0]["state"] == "up"


# ---- the retry ----------------------------------------------------------------------------------------

def test_an_all_engines_failed_search_is_retried_once_on_engines_not_failing(servers):
    servers[0].behave(None, "blocked", failing=[("duckduckgo", "CAPTCHA"), ("github", "timeout")])
    seen = []
    outcome = failover(servers[:1], seen=seen).search("serde derive")
    first, retry = servers[0].requests
    assert "engines" not in first.params and "categories" not in first.params
    assert retry.params["engines"].split(",") == sorted(set(DEVELOPER_ENGINES) - {"github"})
    assert retry.query == "serde derive"
    assert outcome.status == "ok" and outcome.hits
    assert outcome.notes[0] == (
        "Every engine of the usual search failed: duckduckgo (CAPTCHA), github (timeout); these results come from a "
        f"retry on the engines not reported failing ({retry.params['engines'].replace(',', ', ')}), so general web "
        "pages may be missing.")
    assert sorted(seen) == [("duckduckgo", "captcha"), ("github", "timeout")]


def test_the_retry_asks_engines_seen_answering_and_else_the_developer_category(servers):
    search = failover(servers[:1])
    servers[0].behave(None, "results", engine="mojeek")
    search.search("first")  # mojeek seen giving results
    every_developer_engine = [(e, "Suspended: CAPTCHA") for e in DEVELOPER_ENGINES]
    servers[0].behave(None, "blocked", failing=[("duckduckgo", "CAPTCHA"), *every_developer_engine])
    outcome = search.search("second")
    assert servers[0].requests[-1].params["engines"] == "mojeek" and outcome.status == "ok"
    servers[0].behave(None, "blocked", failing=[("duckduckgo", "CAPTCHA"), ("mojeek", "timeout"),
                                                *every_developer_engine], it_engine="gitlab")
    outcome = search.search("third")
    assert servers[0].requests[-1].params.get("categories") == "it" and "engines" not in servers[0].requests[-1].params
    assert outcome.status == "ok" and "SearXNG's developer category ('it')" in outcome.notes[0]


def test_other_instances_come_before_the_retry_and_a_failed_retry_is_said(servers):
    servers[0].behave(None, "dead")
    servers[1].behave(None, "status", code=503)
    outcome = failover(servers[:2]).search("q")
    assert asked(servers) == [2, 1, 0]  # the first, the second, then the retry on the first
    assert "engines" in servers[0].requests[1].params
    assert outcome.status == "failed" and outcome.message.endswith("failed too.")
    assert "answered HTTP 503" in outcome.message


def test_no_retry_of_a_search_that_merely_found_nothing(servers):
    servers[0].behave(None, "empty")
    assert failover(servers[:1]).search("q").status == "empty" and asked(servers) == [1, 0, 0]


# ---- the keyed fallback ---------------------------------------------------------------------------------

def keyed(brave, timeout=10.0):
    return BraveSearch(KEY, 5, timeout, api_url=brave.api_url)


def test_the_key_gives_results_when_every_instance_failed(servers, brave):
    servers[0].behave(None, "status", code=502)
    servers[1].close()
    outcome = failover(servers[:2], keyed=keyed(brave)).search("vllm docs", time_range="week")
    assert outcome.status == "ok" and outcome.hits[0].url == "https://brave.example/vllm-docs/1"
    assert outcome.notes == ["From the Brave Search API, because every SearXNG instance failed."]
    assert asked(servers) == [1, 0, 0]
    [seen] = brave.requests
    assert seen.params == {"q": "vllm docs", "count": "5", "freshness": "pw"}
    assert seen.headers["x-subscription-token"] == KEY


def test_the_key_is_not_used_while_searxng_answers(servers, brave):
    outcome = failover(servers[:2], keyed=keyed(brave)).search("q")
    assert outcome.status == "ok" and outcome.notes == [] and brave.requests == [] and asked(servers) == [1, 0, 0]


@pytest.mark.parametrize("brave_mode, searxng_asked, note", [
    ("results", [0, 0, 0], "From the Brave Search API."),
    ("ratelimited", [1, 0, 0], None),
])
def test_always_asks_the_key_first_and_searxng_when_it_fails(servers, brave, brave_mode, searxng_asked, note):
    brave.behave(brave_mode)
    outcome = failover(servers[:2], keyed=keyed(brave), mode="always").search("q")
    assert outcome.status == "ok" and len(brave.requests) == 1 and asked(servers) == searxng_asked
    assert [n for n in outcome.notes if n.startswith("From")] == ([note] if note else [])


def test_a_failing_key_is_one_more_reason_never_the_key_itself(servers, brave, caplog):
    caplog.set_level(logging.DEBUG)
    servers[0].behave(None, "status", code=500)
    outcome = failover(servers[:1], keyed=BraveSearch("wrong-key", 5, 10.0, api_url=brave.api_url)).search("q")
    assert outcome.status == "failed" and "refused the key" in outcome.message
    assert brave.requests[0].headers["x-subscription-token"] == "wrong-key"
    assert "wrong-key" not in outcome.message and "wrong-key" not in caplog.text


# ---- engines: counted, logged, shown ------------------------------------------------------------------

def test_engine_failures_are_counted_and_noted_also_when_the_search_had_results(servers, caplog):
    caplog.set_level(logging.INFO, logger="proxy.search")
    seen = []
    search = failover(servers[:1], seen=seen)
    servers[0].behave(None, "results", unresponsive=[("duckduckgo", "CAPTCHA"), ("brave", "Suspended: too many requests")])
    outcome = search.search("q")
    assert outcome.status == "ok" and len(outcome.hits) == 3
    assert outcome.notes == ["Some search engines failed (brave: Suspended: too many requests, duckduckgo: CAPTCHA); "
                             "these results come from the others."]
    assert sorted(seen) == [("brave", "suspended"), ("duckduckgo", "captcha")]
    assert "search engine 'duckduckgo' on %s started failing: captcha" % servers[0].url in caplog.text
    servers[0].behave(None, "results", unresponsive=[("brave", "Suspended: too many requests")])
    search.search("again")
    assert "search engine 'duckduckgo' on %s answers again" % servers[0].url in caplog.text
    assert len(seen) == 3 and "'brave' on %s answers again" % servers[0].url not in caplog.text


def test_the_health_view_shows_instances_engines_and_the_key_without_it(servers, brave):
    clock = Clock()
    search = failover(servers[:2], clock=clock, keyed=keyed(brave))
    servers[0].behave(None, "status", code=500)
    servers[1].behave(None, "results", unresponsive=[("startpage", "timeout")])
    search.search("q")
    view = search.health()
    a, b = view["instances"]
    assert (a["url"], a["state"], a["failures_in_a_row"]) == (servers[0].url, "cooling down", 1)
    assert a["last_error"] == f"Search failed: {servers[0].url} answered HTTP 500." and a["engines_failing"] == []
    assert (b["state"], [(e["engine"], e["reason"]) for e in b["engines_failing"]]) == ("up", [("startpage", "timeout")])
    assert view["keyed_fallback"] == {"backend": "Brave Search API", "mode": "fallback", "last_used": None,
                                      "last_status": None, "last_error": None}
    assert KEY not in repr(view) and view["deadline_seconds"] == 10.0


# ---- through the proxy: the list, the metrics, the health view, the key ---------------------------------

def closed_url() -> str:
    """An address where nothing listens: a search there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def chat_search(proxy, backend, query: str) -> str:
    """One chat request whose model searches once; what the model read for it."""
    backend.script(json_reply(completion(tool_calls=[tool_call("web_search", {"query": query})])),
                   json_reply(completion(content="done")))
    status, _, raw = raw_request(proxy.url, "POST", "/v1/chat/completions", json.dumps(
        {"model": "foundation", "messages": [{"role": "user", "content": "look it up"}]}).encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer k1"})
    assert status == 200, raw[:300]
    turn = [r.json() for r in backend.received if r.path == "/v1/chat/completions"][-1]
    return [m for m in turn["messages"] if m["role"] == "tool"][-1]["content"]


def health(proxy, headers=None) -> tuple[int, dict]:
    status, _, body = raw_request(proxy.url, "GET", "/proxy/search/health", headers=headers)
    return status, json.loads(body)


def sample(proxy, name: str, **labels) -> float:
    """One series' value from a scrape (0 before its first use)."""
    _, _, body = raw_request(proxy.url, "GET", "/proxy/metrics", headers={"Authorization": "Bearer k1"})
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def engine_failures_total(proxy, engine: str, reason: str) -> float:
    # The exact name and labels the agents dashboard queries (monitoring/grafana/dashboards/agents.json).
    return sample(proxy, "proxy_search_engine_failures_total", engine=engine, reason=reason)


def test_the_proxy_asks_the_next_instance_and_shows_why_in_its_health_view(start_proxy, backend, searxng):
    dead = closed_url()
    p = start_proxy(SEARXNG_URL=f"{dead}, {searxng.url}", PROXY_API_KEY="k1")
    before = sample(p, "proxy_search_fallbacks_total", kind="instance")
    text = chat_search(p, backend, "failover works")
    assert sample(p, "proxy_search_fallbacks_total", kind="instance") - before == 1
    assert f"Note: Answered by the SearXNG instance at {searxng.url}, a fallback: {dead} it is unreachable." in text
    assert "https://example.org/failover-works/1" in text and searxng.queries == ["failover works"]
    assert health(p)[0] == 401  # behind PROXY_API_KEY like /proxy/metrics
    status, view = health(p, {"Authorization": "Bearer k1"})
    assert status == 200
    first, second = view["instances"]
    assert (first["url"], first["state"], second["url"], second["state"]) == (dead, "cooling down", searxng.url, "up")
    assert "cannot reach SearXNG" in first["last_error"] and view["keyed_fallback"] is None


def test_engine_failures_reach_the_metrics_health_view_and_model_when_the_search_had_results(start_proxy, backend,
                                                                                              searxng):
    p = start_proxy(PROXY_API_KEY="k1")
    q = f"partial {uuid.uuid4().hex[:8]}"
    searxng.behave(q, "results", unresponsive=[("duckduckgo", "CAPTCHA"), ("qwant", "Suspended: access denied")])
    before = (engine_failures_total(p, "duckduckgo", "captcha"), engine_failures_total(p, "qwant", "suspended"))
    text = chat_search(p, backend, q)
    after = (engine_failures_total(p, "duckduckgo", "captcha"), engine_failures_total(p, "qwant", "suspended"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    assert ("Note: Some search engines failed (duckduckgo: CAPTCHA, qwant: Suspended: access denied); these results "
            "come from the others.") in text and "[1]" in text
    _, view = health(p, {"Authorization": "Bearer k1"})
    failing = {e["engine"]: e["reason"] for e in view["instances"][0]["engines_failing"]}
    assert failing == {"duckduckgo": "captcha", "qwant": "suspended"}


def test_the_key_answers_through_the_proxy_and_is_never_logged_or_shown(start_proxy, backend, searxng, brave):
    p = start_proxy(SEARXNG_URL=closed_url(), BRAVE_SEARCH_API_KEY=KEY, BRAVE_SEARCH_URL=brave.api_url,
                    PROXY_API_KEY="k1", LOG_LEVEL="debug")
    text = chat_search(p, backend, "brave only")
    assert "Note: From the Brave Search API, because every SearXNG instance failed." in text
    assert "https://brave.example/brave-only/1" in text
    assert [r.headers["x-subscription-token"] for r in brave.requests] == [KEY]
    _, view = health(p, {"Authorization": "Bearer k1"})
    assert view["keyed_fallback"]["backend"] == "Brave Search API" and view["keyed_fallback"]["last_status"] == "ok"
    assert KEY not in json.dumps(view) and KEY not in text
    assert KEY not in p.log_path.read_text()
