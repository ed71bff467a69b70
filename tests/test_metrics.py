"""The proxy's /proxy/metrics and its search cache, through the real proxy under gunicorn: the
exposition parses (prometheus_client's own parser), the counters move per API, PROXY_API_KEY
guards it, two workers sum into one scrape, and the cache answers a repeat once, never keeps a
failure, waits for an identical search in flight, filters domains per request and shows its age.

Run: tests/run.sh tests/test_metrics.py
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from standins import anthropic_wire as W
from standins import responses_wire as R
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply
from standins.searxng import result
from standins.vllm_wire import completion, json_reply, tool_call

CACHE_ON = {"SEARCH_CACHE_TTL": "600"}


# ---- helpers ------------------------------------------------------------------------------------

def scrape(proxy, key: str | None = None) -> dict:
    """{(sample name, sorted label pairs): value} from one scrape, parsed by prometheus_client."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    status, head, body = raw_request(proxy.url, "GET", "/proxy/metrics", headers=headers)
    assert status == 200 and head["content-type"].startswith("text/plain"), body[:200]
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    """The sum of `name` over every series whose labels include `labels` (0 when none)."""
    want = {k: str(v) for k, v in labels.items()}
    return sum(v for (n, ls), v in samples.items() if n == name and want.items() <= dict(ls).items())


def delta(before: dict, after: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def post(proxy, path: str, body: dict, headers=None) -> tuple[int, dict]:
    status, _, raw = raw_request(proxy.url, "POST", path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json", **(headers or {})})
    return status, json.loads(raw) if raw else {}


def chat_search(backend, *queries: str) -> dict:
    """Script one chat search turn and the answer; the request body to send."""
    backend.script(json_reply(completion(tool_calls=[tool_call("web_search", {"query": q}) for q in queries])),
                   json_reply(completion(content="done")))
    return {"model": "foundation", "messages": [{"role": "user", "content": "look it up"}]}


def chat_tool_text(backend, turn: int = 1, index: int = 0) -> str:
    """What the model read for a chat tool call: the tool message vLLM got on `turn`."""
    chats = [r.json() for r in backend.received if r.path == "/v1/chat/completions"]
    return [m for m in chats[turn]["messages"] if m["role"] == "tool"][index]["content"]


# ---- one search through each API ------------------------------------------------------------------

def _chat(proxy, backend, q):
    return post(proxy, "/v1/chat/completions", chat_search(backend, q))


def _messages(proxy, backend, q):
    backend.script(W.message_reply([W.tool_use("web_search", {"query": q})]), W.message_reply([W.text("done")]))
    return post(proxy, "/v1/messages", {"model": "foundation", "max_tokens": 100,
                                        "messages": [{"role": "user", "content": "look it up"}],
                                        "tools": [{"type": "web_search_20250305", "name": "web_search"}]})


def _responses(proxy, backend, q):
    backend.responder = R.model([R.call("web_search", {"query": q})], [R.message("done")])
    return post(proxy, "/v1/responses", {"model": "foundation", "input": "look it up", "tools": [{"type": "web_search"}]})


def _alpha(proxy, backend, q):
    return post(proxy, "/v1/alpha/search", {"id": str(uuid.uuid4()), "model": "foundation",
                                            "commands": {"search_query": [{"q": q}]}, "max_output_tokens": 2500})


@pytest.mark.parametrize("api, run", [("chat", _chat), ("messages", _messages), ("responses", _responses),
                                      ("alpha_search", _alpha)])
def test_a_search_moves_its_apis_counters(proxy, backend, searxng, api, run):
    before = scrape(proxy)
    status, body = run(proxy, backend, f"metrics {api}")
    assert status == 200
    after = scrape(proxy)
    assert searxng.queries == [f"metrics {api}"]
    assert delta(before, after, "proxy_requests_total", api=api, status=200) == 1
    assert delta(before, after, "proxy_request_duration_seconds_count", api=api) == 1
    assert delta(before, after, "proxy_time_to_first_byte_seconds_count", api=api) == 1
    assert delta(before, after, "proxy_tool_calls_total", api=api, tool="web_search", outcome="ok") == 1
    assert delta(before, after, "proxy_tool_calls_total") == 1
    assert delta(before, after, "proxy_searxng_request_duration_seconds_count", outcome="ok") == 1
    # Every vLLM turn's prompt tokens, as the usage the client got sums them (alpha search asks no model).
    prompt = {"chat": lambda u: u["prompt_tokens"], "messages": lambda u: u["input_tokens"],
              "responses": lambda u: u["input_tokens"], "alpha_search": lambda u: 0}[api](body.get("usage") or {})
    assert (api == "alpha_search") == (prompt == 0)
    assert delta(before, after, "proxy_prompt_tokens_total", api=api) == prompt
    # The scrape before this one counted itself under its own label, never as an API's request.
    assert delta(before, after, "proxy_requests_total", api="proxy") == 1
    # The cache is off in the shared proxies (tests/conftest.py): no lookups counted.
    assert delta(before, after, "proxy_cache_lookups_total") == 0


CHAT_USAGE = {"prompt_tokens": 1200, "completion_tokens": 7, "total_tokens": 1207,
              "prompt_tokens_details": {"cached_tokens": 1152}}


@pytest.mark.parametrize("path,reply,api,counts", [
    # vLLM's usage with --enable-prompt-tokens-details, relayed byte for byte and read on the way.
    ("/v1/chat/completions", json_reply(completion(content="hi") | {"usage": CHAT_USAGE}), "chat", (1200, 1152)),
    ("/v1/chat/completions", Reply(headers=[("Content-Type", "text/event-stream")], chunks=[
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":900,"completion_tokens":2,"prompt_tokens_d',
        b'etails":{"cached_tokens":896}}}\n\ndata: [DONE]\n\n']), "chat", (900, 896)),
    # Anthropic's input_tokens are the ones the cache did not serve.
    ("/v1/messages", json_reply({"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
                                 "usage": {"input_tokens": 48, "cache_read_input_tokens": 512, "output_tokens": 3}}),
     "messages", (560, 512)),
    ("/v1/completions", json_reply({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}),
     "relay", (5, 0)),
])
def test_cached_prompt_tokens_are_counted_and_logged(proxy, backend, path, reply, api, counts):
    backend.script(reply)
    before = scrape(proxy)
    # tool_choice none: nothing for the proxy to add, so every one of these is relayed.
    body = b'{"model": "foundation", "prompt": "x", "messages": [], "tool_choice": "none", "stream": true}'
    status, _, raw = raw_request(proxy.url, "POST", path, body, {"Content-Type": "application/json"})
    assert status == 200 and raw == (reply.body or b"".join(reply.chunks))  # read, never changed
    after = scrape(proxy)
    assert delta(before, after, "proxy_prompt_tokens_total", api=api) == counts[0]
    assert delta(before, after, "proxy_cached_prompt_tokens_total", api=api) == counts[1]
    assert f"{path} 200" in proxy.log_once(f"prompt={counts[0]} cached={counts[1]}")


def test_no_usage_logs_dashes_and_counts_nothing(proxy, backend):
    before = scrape(proxy)
    text = '{"choices":[{"message":{"content":"\\"prompt_tokens\\": 5"}}]}'  # model text that looks like usage
    backend.script(json_reply(json.loads(text)))
    body = b'{"model": "foundation", "messages": [], "tool_choice": "none"}'
    assert raw_request(proxy.url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})[0] == 200
    assert delta(before, scrape(proxy), "proxy_prompt_tokens_total") == 0
    assert "prompt=- cached=-" in proxy.log_once("prompt=- cached=-")


def test_the_exposition_parses_and_names_every_metric_with_help(proxy, backend):
    backend.script(json_reply({"object": "list", "data": []}))
    assert raw_request(proxy.url, "GET", "/v1/models")[0] == 200
    status, head, body = raw_request(proxy.url, "GET", "/proxy/metrics")
    families = list(text_string_to_metric_families(body.decode()))
    names = {f.name for f in families}
    assert {"proxy_requests", "proxy_request_duration_seconds", "proxy_time_to_first_byte_seconds"} <= names
    assert all(f.name.startswith("proxy_") and f.documentation for f in families)
    assert b"# TYPE proxy_requests_total counter" in body or b"# TYPE proxy_requests counter" in body
    # vLLM's own /metrics is still vLLM's: relayed, not answered here.
    backend.script(json_reply({"vllm": True}))
    assert raw_request(proxy.url, "GET", "/metrics")[2] == b'{"vllm":true}'


def test_searxng_failures_and_relay_statuses_are_labelled(proxy, backend, searxng):
    searxng.behave("slow", "slow", seconds=2)
    searxng.behave("gone", "status", code=500)
    searxng.behave("nothing", "empty")
    before = scrape(proxy)
    assert _chat(proxy, backend, "gone")[0] == 200
    assert _chat(proxy, backend, "nothing")[0] == 200
    assert raw_request(proxy.url, "GET", "/v1/unscripted")[0] == 500  # the stand-in's own 500, relayed
    after = scrape(proxy)
    assert delta(before, after, "proxy_tool_calls_total", api="chat", outcome="failed") == 1
    assert delta(before, after, "proxy_tool_calls_total", api="chat", outcome="empty") == 1
    assert delta(before, after, "proxy_searxng_request_duration_seconds_count", outcome="failed") == 1
    assert delta(before, after, "proxy_searxng_request_duration_seconds_count", outcome="empty") == 1
    assert delta(before, after, "proxy_requests_total", api="relay", status=500) == 1


def test_search_timeout_and_the_round_cap(start_proxy, backend, searxng):
    p = start_proxy(SEARXNG_TIMEOUT="0.3", MAX_SEARCH_ITER="1")
    searxng.behave(None, "slow", seconds=1)
    backend.script(json_reply(completion(tool_calls=[tool_call("web_search", {"query": "a"})])),
                   json_reply(completion(tool_calls=[tool_call("web_search", {"query": "b"})])))
    before = scrape(p)
    status, body = post(p, "/v1/chat/completions", {"model": "foundation", "messages": [{"role": "user", "content": "x"}]})
    after = scrape(p)
    assert status == 422 and "search round" in body["error"]["message"]
    assert delta(before, after, "proxy_tool_calls_total", api="chat", tool="web_search", outcome="timeout") == 1
    assert delta(before, after, "proxy_searxng_request_duration_seconds_count", outcome="timeout") == 1
    assert delta(before, after, "proxy_cap_hits_total", api="chat", cap="search_rounds") == 1
    assert delta(before, after, "proxy_requests_total", api="chat", status=422) == 1


def test_page_fetches_count_time_bytes_the_page_cache_and_refusals(start_proxy, backend, site):
    p = start_proxy(WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", WEB_FETCH_URLS="any")
    page = "<html><head><title>T</title></head><body><article><p>" + "Words here. " * 200 + "</p></article></body></html>"
    site.route("/doc", page)
    url = f"http://127.0.0.1:{site.port}/doc"
    before = scrape(p)
    for _ in range(2):
        backend.script(json_reply(completion(tool_calls=[tool_call("web_fetch", {"url": url}),
                                                         tool_call("web_fetch", {"url": "ftp://x.example/"})])),
                       json_reply(completion(content="done")))
        assert post(p, "/v1/chat/completions", {"model": "foundation", "messages": [{"role": "user", "content": "x"}]})[0] == 200
    after = scrape(p)
    assert len([r for r in site.requests if r.path == "/doc"]) == 1, "the second read comes from the page cache"
    assert delta(before, after, "proxy_tool_calls_total", api="chat", tool="web_fetch", outcome="ok") == 2
    assert delta(before, after, "proxy_tool_calls_total", api="chat", tool="web_fetch", outcome="refused") == 2
    assert delta(before, after, "proxy_page_fetch_duration_seconds_count", outcome="ok") == 1
    assert delta(before, after, "proxy_page_fetch_bytes_total") == len(page.encode())
    assert delta(before, after, "proxy_cache_lookups_total", cache="page", result="miss") == 1
    assert delta(before, after, "proxy_cache_lookups_total", cache="page", result="hit") == 1
    assert delta(before, after, "proxy_cache_hit_age_seconds_count", cache="page") == 1


def test_a_client_that_leaves_counts_a_disconnect_and_the_abort(proxy, backend):
    reply = json_reply(completion(content="too late"))
    reply.delay = 10  # vLLM still "prefilling" when the client hangs up
    backend.script(reply)
    before = scrape(proxy)
    s = socket.create_connection((proxy.url.split("//")[1].split(":")[0], int(proxy.url.rsplit(":", 1)[1])))
    body = b'{"model": "foundation", "prompt": "x"}'
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert backend.wait_for(lambda b: len(b.received) == 1, 10)
    s.close()
    assert backend.wait_for(lambda b: b.hangups == [0], 10), "the proxy must cut vLLM's call"
    deadline = time.monotonic() + 10
    while delta(before, after := scrape(proxy), "proxy_client_disconnects_total", api="relay") < 1:
        assert time.monotonic() < deadline, "no disconnect counted"
        time.sleep(0.05)
    assert delta(before, after, "proxy_client_disconnects_total", api="relay") == 1
    assert delta(before, after, "proxy_backend_aborts_total", api="relay") == 1
    assert delta(before, after, "proxy_requests_total", api="relay", status=499) == 1


# ---- the key and the switch ------------------------------------------------------------------------

@pytest.mark.parametrize("headers, status", [
    ({}, 401),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": "Bearer k2"}, 200),
    ({"x-api-key": "k1"}, 200),
])
def test_the_key_guards_the_metrics(start_proxy, headers, status):
    p = start_proxy(PROXY_API_KEY="k1,k2")
    got, head, body = raw_request(p.url, "GET", "/proxy/metrics", headers=headers)
    assert got == status
    if status == 401:
        assert json.loads(body)["error"]["type"] == "authentication_error" and b"proxy_" not in body
    else:
        assert b"# HELP proxy_" in body
    assert raw_request(p.url, "GET", "/proxy/health")[0] == 200  # the health check stays open


def test_metrics_off_records_nothing_and_says_so(start_proxy, backend):
    p = start_proxy(PROXY_METRICS="off")
    backend.script(json_reply({"object": "list", "data": []}))
    assert raw_request(p.url, "GET", "/v1/models")[0] == 200
    status, _, body = raw_request(p.url, "GET", "/proxy/metrics")
    assert status == 404 and "PROXY_METRICS" in json.loads(body)["error"]["message"]
    assert not list(p.metrics_dir.glob("histogram_*.db")), "nothing was recorded"


# ---- several workers ----------------------------------------------------------------------------

def _pids_with(directory: Path, kind: str) -> set[int]:
    return {int(m.group(1)) for f in directory.iterdir() if (m := re.fullmatch(kind + r"_(\d+)\.db", f.name))}


def spread_over_workers(p, metrics_dir: Path) -> int:
    """Relayed GETs on fresh connections until both workers have served some (which one accepts is the kernel's
    choice); how many were sent."""
    sent = 0
    for _ in range(40):
        threads = [threading.Thread(target=lambda: raw_request(p.url, "GET", "/v1/models")) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        sent += len(threads)
        if len(_pids_with(metrics_dir, "histogram")) >= 2:
            break
    assert len(_pids_with(metrics_dir, "histogram")) >= 2, "one worker served every request"
    return sent


def counted_relays(p, before, sent: int) -> float:
    """The relayed requests a scrape counts once it counts all `sent` (or after 10 s, what it counts then): a
    request is counted when its body is closed, just after the client has read its answer."""
    deadline = time.monotonic() + 10
    while True:
        got = delta(before, scrape(p), "proxy_requests_total", api="relay", status=200)
        if got >= sent or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_two_workers_sum_into_one_scrape(start_proxy, backend):
    p = start_proxy(PROXY_WORKERS="2", **CACHE_ON)
    backend.responder = lambda received: json_reply({"object": "list", "data": []})
    before = scrape(p)
    sent = spread_over_workers(p, p.metrics_dir)
    assert counted_relays(p, before, sent) == sent


def test_several_workers_without_a_metrics_folder_still_sum_into_every_scrape(start_proxy, backend):
    """Outside the image nobody sets PROMETHEUS_MULTIPROC_DIR; with two workers the server makes a private folder,
    so every scrape, whichever worker answers it, counts every worker's requests; the folder goes with the server."""
    p = start_proxy(PROXY_WORKERS="2", PROMETHEUS_MULTIPROC_DIR="", **CACHE_ON)
    found = re.search(r"sum their metrics through (\S+),", p.log())
    assert found, p.log()
    private = Path(found.group(1))
    backend.responder = lambda received: json_reply({"object": "list", "data": []})
    before = scrape(p)
    sent = spread_over_workers(p, private)
    assert counted_relays(p, before, sent) == sent
    scrapes = [scrape(p) for _ in range(6)]  # answered by either worker: each must show the whole count
    assert {delta(before, after, "proxy_requests_total", api="relay", status=200) for after in scrapes} == {sent}
    p.stop()
    assert not private.exists(), "the private metrics folder outlived the server"


def test_a_dead_workers_live_gauges_leave_the_sum(start_proxy, backend, searxng):
    p = start_proxy(PROXY_WORKERS="2", **CACHE_ON)
    assert _chat(p, backend, f"gauge {uuid.uuid4().hex}")[0] == 200
    pids = _pids_with(p.metrics_dir, "gauge_livesum")
    assert pids, "the search cache's size gauge was not written"
    assert value(scrape(p), "proxy_cache_entries", cache="search") >= 1
    counted = value(scrape(p), "proxy_requests_total")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)  # a worker of this test's own proxy; gunicorn starts another
    deadline = time.monotonic() + 10
    while _pids_with(p.metrics_dir, "gauge_livesum") & pids:
        assert time.monotonic() < deadline, "gunicorn's child_exit did not mark the worker dead"
        time.sleep(0.05)
    for _ in range(100):  # the new worker must be up before it can answer the scrape
        try:
            after = scrape(p)
            break
        except (OSError, AssertionError):
            time.sleep(0.1)
    assert value(after, "proxy_cache_entries", cache="search") == 0
    assert value(after, "proxy_requests_total") >= counted  # counters of the dead stay in the sum


# ---- the search cache ----------------------------------------------------------------------------

def test_a_repeated_search_reaches_searxng_once_and_shows_its_age(start_proxy, backend, searxng):
    p = start_proxy(**CACHE_ON)
    q = f"cache {uuid.uuid4().hex[:8]}"
    before = scrape(p)
    assert post(p, "/v1/chat/completions", chat_search(backend, q))[0] == 200
    time.sleep(1.1)
    assert post(p, "/v1/chat/completions", chat_search(backend, q.upper()))[0] == 200
    after = scrape(p)
    assert searxng.queries == [q], "the repeat must come from the cache"
    first, second = chat_tool_text(backend, 1), chat_tool_text(backend, 3)
    assert first.startswith(f'Search results for "{q}":')
    assert re.match(rf'Search results for "{q.upper()}" \(cached, [12] s old\):', second), second
    assert first.split("\n", 1)[1] == second.split("\n", 1)[1], "the same results"
    assert delta(before, after, "proxy_cache_lookups_total", cache="search", result="miss") == 1
    assert delta(before, after, "proxy_cache_lookups_total", cache="search", result="hit") == 1
    assert delta(before, after, "proxy_cache_hit_age_seconds_count", cache="search") == 1
    assert 1 <= delta(before, after, "proxy_cache_hit_age_seconds_sum", cache="search") < 3
    assert delta(before, after, "proxy_searxng_request_duration_seconds_count") == 1
    assert delta(before, after, "proxy_tool_calls_total", api="chat", outcome="ok") == 2


# asks: SearXNG requests per search; an answer with every engine failed is retried once on other engines.
@pytest.mark.parametrize("mode, kw, asks", [("empty", {}, 1), ("status", {"code": 500}, 1), ("dead", {}, 2),
                                            ("status", {"code": 429}, 1)])
def test_empty_and_failed_answers_are_not_kept(start_proxy, backend, searxng, mode, kw, asks):
    p = start_proxy(**CACHE_ON)
    q = f"{mode} {uuid.uuid4().hex[:8]}"
    searxng.behave(q, mode, **kw)
    for _ in range(2):
        assert post(p, "/v1/chat/completions", chat_search(backend, q))[0] == 200
    assert searxng.queries == [q] * 2 * asks
    assert "cached" not in chat_tool_text(backend, 3)


@pytest.mark.parametrize("off", [{"SEARCH_CACHE_TTL": "0"}, {**CACHE_ON, "SEARCH_CACHE_ENTRIES": "0"},
                                 {**CACHE_ON, "SEARCH_CACHE_BYTES": "0"}])
def test_zero_turns_the_search_cache_off(start_proxy, backend, searxng, off):
    p = start_proxy(**off)
    before = scrape(p)
    for _ in range(2):
        assert post(p, "/v1/chat/completions", chat_search(backend, "same again"))[0] == 200
    assert searxng.queries == ["same again"] * 2
    assert "cached" not in chat_tool_text(backend, 3)
    assert delta(before, scrape(p), "proxy_cache_lookups_total") == 0


def test_identical_searches_at_once_go_out_once(start_proxy, backend, searxng):
    p = start_proxy(**CACHE_ON)
    q = f"at once {uuid.uuid4().hex[:8]}"
    searxng.behave(q, "slow", seconds=1.5)
    turn = json_reply(completion(tool_calls=[tool_call("web_search", {"query": q})]))
    backend.script(turn, turn, json_reply(completion(content="one")), json_reply(completion(content="two")))
    before = scrape(p)
    body = {"model": "foundation", "messages": [{"role": "user", "content": "x"}]}
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(post(p, "/v1/chat/completions", body))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    after = scrape(p)
    assert sorted(r[1]["choices"][0]["message"]["content"] for r in out) == ["one", "two"]
    assert searxng.queries == [q], "the second search must wait for the first"
    assert delta(before, after, "proxy_cache_lookups_total", cache="search", result="shared") == 1
    assert delta(before, after, "proxy_cache_lookups_total", cache="search", result="miss") == 1
    for turn_index in (2, 3):  # both requests' models read the results
        assert f'Search results for "{q}":' in chat_tool_text(backend, turn_index)


def test_domain_filters_apply_to_a_cached_answer(start_proxy, backend, searxng):
    p = start_proxy(**CACHE_ON)
    q = f"filters {uuid.uuid4().hex[:8]}"
    searxng.behave(q, "results", results=[result("https://example.org/a", "Open page"),
                                          result("https://docs.internal.example/b", "Internal page")])

    def ask(tool: dict) -> tuple[list[str], str]:
        backend.script(W.message_reply([W.tool_use("web_search", {"query": q})]), W.message_reply([W.text("done")]))
        status, msg = post(p, "/v1/messages", {"model": "foundation", "max_tokens": 100, "tools": [tool],
                                              "messages": [{"role": "user", "content": "look it up"}]})
        assert status == 200
        block = next(b for b in msg["content"] if b["type"] == "web_search_tool_result")
        model_read = json.dumps([r.json() for r in backend.received if r.path == "/v1/messages"][-1]["messages"])
        return [r["url"] for r in block["content"]], model_read

    tool = {"type": "web_search_20250305", "name": "web_search"}
    urls, _ = ask(tool)
    assert urls == ["https://example.org/a", "https://docs.internal.example/b"]
    urls, read = ask({**tool, "allowed_domains": ["example.org"]})
    assert urls == ["https://example.org/a"] and "internal.example" not in read and "(cached, " in read
    urls, read = ask({**tool, "blocked_domains": ["example.org"]})
    assert urls == ["https://docs.internal.example/b"] and "example.org/a" not in read
    assert searxng.queries == [q], "every answer after the first came from the cache"
    # The cached answer itself was never narrowed: a request without filters gets both again.
    assert ask(tool)[0] == ["https://example.org/a", "https://docs.internal.example/b"]


def test_in_process_without_gunicorn_or_a_metrics_folder():
    """The app built in this process (no PROMETHEUS_MULTIPROC_DIR here): its own registry answers."""
    from proxy.core.config import Config
    from proxy.http.app import create_app
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    app = create_app(Config(backend_url="http://127.0.0.1:9", searxng_url="http://127.0.0.1:9"))
    client = app.test_client()

    def get(path: str) -> str:
        r = client.get(path)
        r.close()  # a WSGI server closes the body when it is sent: that is when a request is counted
        return r.get_data(as_text=True)

    def served() -> float:
        return sum(s.value for f in text_string_to_metric_families(get("/proxy/metrics"))
                   for s in f.samples if s.name == "proxy_requests_total" and s.labels["api"] == "proxy")
    before = served()
    assert get("/proxy/health") == '{"status":"ok"}'
    assert served() == before + 2  # the health check, and the scrape between
