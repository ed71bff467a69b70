"""Two real proxies (gunicorn, standins/proxy_process.py) sharing one real redis-server through STATE_URL: Codex's
`open` by a ref id the other proxy gave, a repeated search answered from the shared cache once across both (the
SearXNG stand-in counts what reached it), a page downloaded once across both (the web site stand-in counts), the
store killed mid-run (both keep serving, say so in /proxy/metrics and one log line, and share again when it is back),
and one proxy with PROXY_WORKERS=2 whose workers share its caches and ref ids. The interface itself:
tests/test_state.py.

Run: tests/run.sh tests/test_state_shared.py -q
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from test_alpha_search import DOC, post
from test_metrics import scrape, value

from standins import anthropic_wire as aw
from standins import responses_wire as rw
from standins.proxy_process import ProxyProcess
from standins.rawhttp import raw_request
from standins.redis_server import RedisServer
from standins.scripted_backend import Reply
from standins.searxng import result
from standins.vllm_wire import completion, json_reply

pytestmark = [pytest.mark.redis, pytest.mark.xdist_group("state_shared")]

SHARED = {"SEARCH_CACHE_TTL": "600", "WEB_FETCH_CACHE_TTL": "300", "WEB_FETCH_ALLOWED_NETWORKS": "127.0.0.0/8",
          "STATE_TIMEOUT": "0.25", "WEB_FETCH_LINKS_PER_HOUR": "3"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("proxies")


def start(logs, name: str, store: RedisServer, backend, searxng, **env) -> ProxyProcess:
    return ProxyProcess({"BACKEND_URL": backend.url, "SEARXNG_URL": searxng.url, "STATE_URL": store.url,
                         **SHARED, **env}, logs / f"proxy-{name}.log")


@pytest.fixture(scope="module")
def pair(logs, store, _backend_server, _searxng_server):
    """Proxies A and B, one worker each, on the same store."""
    a = start(logs, "a", store, _backend_server, _searxng_server)
    try:
        b = start(logs, "b", store, _backend_server, _searxng_server)
    except BaseException:
        a.stop()
        raise
    yield a, b
    for p in (a, b):
        p.ask_to_stop()
    for p in (a, b):
        p.wait_stopped()


def thread(**commands) -> dict:
    return {"id": f"thread-{uuid.uuid4().hex}", "model": "foundation", "commands": commands,
            "settings": {"allowed_callers": ["direct"], "external_web_access": False}, "max_output_tokens": 2500}


def test_a_ref_id_one_proxy_gave_opens_on_the_other(pair, searxng, site):
    """With WEB_FETCH_URLS=given (the default): B may read the page because the thread's earlier answer listed it,
    which B learns from the shared ref ids."""
    a, b = pair
    site.route("/doc", DOC)
    searxng.behave("shared refs", "results", results=[result(site.url + "/doc", "The notes", "About 0.32.")])
    first = thread(search_query=[{"q": "shared refs"}])
    got, answer = post(a, first)
    assert got == 200 and "[turn0search0] The notes" in answer["output"], answer
    got, answer = post(b, {**thread(open=[{"ref_id": "turn0search0"}]), "id": first["id"]})
    assert got == 200, answer
    assert "## open [turn1view0] vLLM 0.32 notes" in answer["output"] and "PELICAN-7731" in answer["output"]
    # And back on A, the page B opened, by the id B gave it.
    got, answer = post(a, {**thread(find=[{"ref_id": "turn1view0", "pattern": "magic"}]), "id": first["id"]})
    assert got == 200 and '## find "magic" in [turn1view0]' in answer["output"], answer
    assert [r.path for r in site.requests] == ["/doc"]  # downloaded once, by B; A's find read the shared page


def linked_pages(site, tag: str) -> tuple[str, str, str]:
    """A page linking to notes, which link to a deeper page: (its URL, the notes', the deeper one's)."""
    root = f"/read-on-{tag}/"
    site.route(root, "<html><head><title>Index</title></head><body><article><h1>Index</h1><p>The release notes "
                     f'are on <a href="{root}notes">the notes page</a>, with what changed and why.</p></article>'
                     "</body></html>")
    site.route(root + "notes", "<html><head><title>Notes</title></head><body><article><h1>Notes</h1><p>PELICAN-7731 "
                               f'is the build. The details are on <a href="{root}deep">the details page</a>.</p>'
                               "</article></body></html>")
    site.route(root + "deep", DOC)
    return site.url + root, site.url + root + "notes", site.url + root + "deep"


def test_codex_reads_on_from_a_page_whichever_proxy_answers(pair, searxng, site):
    """Issue 50: a person's thread opens its own result (turn0search1) on one proxy, looks for a word in it on the
    other, follows a link it showed on the first and a link of that page on the second: each follow-up lands on the
    proxy that did not read the page, and what the thread's pages showed is in the store, not in a worker."""
    a, b = pair
    tag = uuid.uuid4().hex[:8]
    index, notes, deep = linked_pages(site, tag)
    query = f"notes {uuid.uuid4().hex[:8]}"  # not in the results' URLs: a result echoing its query is not given
    searxng.behave(query, "results", results=[result(site.url + "/other", "Other", "x"),
                                              result(index, "The index", "Where the notes are.")])
    client = {"Authorization": f"Bearer sk-{tag}"}
    first = thread(search_query=[{"q": query}])
    got, answer = post(a, first, client)
    assert got == 200 and "[turn0search1] The index" in answer["output"], answer
    steps = [(b, {"open": [{"ref_id": "turn0search1"}]}, "The release notes are on"),
             (a, {"find": [{"ref_id": "turn0search1", "pattern": "notes page"}]}, "1 match"),
             (b, {"open": [{"ref_id": notes}]}, "PELICAN-7731"),  # a link the index showed (on B, then A)
             (a, {"open": [{"ref_id": deep}]}, "magic")]          # a link the notes showed (on B)
    for proxy, commands, expected in steps:
        got, answer = post(proxy, {**thread(**commands), "id": first["id"]}, client)
        assert got == 200 and expected in answer["output"], (commands, answer)
        assert "did not appear in this conversation" not in answer["output"]


def test_a_page_read_in_one_request_is_read_on_from_in_the_next_on_the_other_proxy(pair, backend, site):
    """The three APIs: request 1 (proxy A) reads the page the person gave and answers citing it; request 2 (proxy B)
    follows a link that page showed. The history B gets shows the page as read (a url_citation, a completed
    open_page, a web_fetch result); what the page linked to is in the store."""
    from test_exfiltration import SESSIONS, Chat, Messages, reply_for

    a, b = pair
    for session in SESSIONS:
        tag = uuid.uuid4().hex[:8]
        index, notes, _ = linked_pages(site, tag)
        script = iter([("web_fetch", index), ("text", "The notes are linked from the index [1]."),
                       ("web_fetch", notes), ("text", "done")])

        def respond(received, session=session, script=script):
            if not received.path.startswith(session.api.path):
                return None
            kind, value = next(script)
            body = received.json()
            if kind == "web_fetch":
                return reply_for(session.api, body, [("web_fetch", {"url": value})])
            if session.api is Chat:
                return json_reply(completion(content=value, finish_reason="stop"))
            if session.api is Messages:
                return aw.message_reply([aw.text(value)])
            return rw.answer(body, [rw.message(value)])
        backend.responder = respond
        body = session.start("You are a coding agent.", f"Read {index} please.")
        reply = session.send(a, f"sk-{tag}", body, False)
        body = answered(session, body, reply, "Now follow its link to the notes.")
        reply = session.send(b, f"sk-{tag}", body, False)
        assert "did not appear in this conversation" not in json.dumps(reply), (session.api, reply)
        assert [r.path for r in site.requests] == [f"/read-on-{tag}/", f"/read-on-{tag}/notes"], session.api
        site.requests.clear()


def answered(session, body: dict, reply, text: str) -> dict:
    """The next request of `session`'s client: its history with the answer it got, and the person's next words."""
    if "messages" in body and "system" not in body:  # chat: the assistant's message, annotations and all
        return {**body, "messages": body["messages"] + [{k: v for k, v in reply.items() if v is not None},
                                                        {"role": "user", "content": text}]}
    if "messages" in body:  # Messages: every block of the assistant's turn, the proxy's web_fetch result too
        return {**body, "messages": body["messages"] + [{"role": "assistant", "content": reply},
                                                        {"role": "user", "content": text}]}
    return session.user({**body, "input": body["input"] + reply}, text)


def test_a_repeated_search_goes_out_once_across_both(pair, searxng):
    a, b = pair
    query = f"shared cache {uuid.uuid4().hex[:8]}"
    for proxy in (a, b, a, b):
        got, answer = post(proxy, thread(search_query=[{"q": query}]))
        assert got == 200 and "[turn0search0]" in answer["output"], answer
    assert searxng.queries == [query]
    # B's first answer came from A's search: a cache hit in B's own metrics, with its age.
    assert value(scrape(b), "proxy_cache_lookups_total", cache="search", result="hit") >= 2


def test_a_page_is_downloaded_once_across_both(pair, searxng, site):
    a, b = pair
    path = f"/page-{uuid.uuid4().hex[:8]}"
    site.route(path, DOC)
    for proxy in (a, b, b):
        # The user named the page (URL provenance, WEB_FETCH_URLS=given), in the conversation Codex sends as `input`.
        got, answer = post(proxy, {**thread(open=[{"ref_id": site.url + path}]), "input": f"Read {site.url + path}"})
        assert got == 200 and "PELICAN-7731" in answer["output"], answer
    assert [r.path for r in site.requests] == [path]


def test_the_hourly_link_budget_holds_across_both(pair, site):
    """URL provenance's per-client budget (WEB_FETCH_LINKS_PER_HOUR=3 here) is one budget in the shared store, not
    one per proxy: one client reads four given pages, two through each proxy, and follows one link of each; three
    links are read in all, the fourth refused with the budget's sentence (per proxy it would have been four)."""
    a, b = pair
    tag = uuid.uuid4().hex[:8]
    client = {"Authorization": f"Bearer sk-{tag}"}  # a client of its own: its budget is untouched
    outputs = []
    for i, proxy in enumerate((a, b, a, b)):
        root = f"/links-{tag}-{i}/"
        site.route(root, "<html><head><title>Index</title></head><body><article><h1>Index</h1><p>The notes are "
                         f'on <a href="{root}notes">the notes page</a>, with what changed and why.</p></article>'
                         "</body></html>")
        site.route(root + "notes", DOC)
        body = {**thread(open=[{"ref_id": site.url + root}]), "input": f"Read {site.url + root}"}
        got, answer = post(proxy, body, client)
        assert got == 200 and "The notes are on" in answer["output"], answer
        got, answer = post(proxy, {**body, "commands": {"open": [{"ref_id": site.url + root + "notes"}]}}, client)
        assert got == 200, answer
        outputs.append(answer["output"])
    assert ["PELICAN-7731" in out for out in outputs] == [True, True, True, False], outputs
    assert "WEB_FETCH_LINKS_PER_HOUR" in outputs[3]
    assert sorted(r.path for r in site.requests if r.path.endswith("notes")) == [
        f"/links-{tag}-{i}/notes" for i in range(3)]


def state_up(proxy) -> float:
    return value(scrape(proxy), "proxy_state_up")


def test_the_store_dies_and_returns(pair, store, searxng, site):
    a, b = pair
    searxng.behave(None, "results")
    before = thread(search_query=[{"q": "before the outage"}])
    assert post(a, before)[0] == 200
    assert state_up(a) == 1 and state_up(b) == 1
    assert value(scrape(a), "proxy_state_up", store=store.url) == 1  # labelled by its STATE_URL
    store.stop()
    try:
        # Both keep serving: searches (each proxy's own cache still works), pages, and a ref id says it is unavailable.
        for proxy in (a, b):
            started = time.monotonic()
            got, answer = post(proxy, thread(search_query=[{"q": f"during the outage {proxy.url}"}]))
            assert got == 200 and "[turn0search0]" in answer["output"], answer
            got, answer = post(proxy, {**thread(open=[{"ref_id": "turn0search0"}]), "id": before["id"]})
            assert got == 200 and "Ref id 'turn0search0' is unavailable right now" in answer["output"], answer
            assert time.monotonic() - started < 5
        for proxy in (a, b):
            assert state_up(proxy) == 0
            assert value(scrape(proxy), "proxy_state_errors_total") > 0
            assert value(scrape(proxy), "proxy_state_errors_total", use="refs") > 0
            lines = re.findall(r"state store \S+ unreachable", proxy.log_once("unreachable"))
            assert len(lines) == 1, proxy.log()
    finally:
        store.start()
    # Back: within the circuit's wait (2 s, doubled per failed try, at most 30 s) each proxy shares again.
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not (state_up(a) == 1 and state_up(b) == 1):
        for proxy in (a, b):
            post(proxy, thread(search_query=[{"q": "after the outage"}]))
        time.sleep(0.5)
    assert state_up(a) == 1 and state_up(b) == 1
    for proxy in (a, b):
        assert "back after" in proxy.log_once("back after") and proxy.log().count("unreachable") == 1
    searxng.requests.clear()
    query = f"shared again {uuid.uuid4().hex[:8]}"
    assert post(a, thread(search_query=[{"q": query}]))[0] == 200
    assert post(b, thread(search_query=[{"q": query}]))[0] == 200
    assert searxng.queries == [query]


def test_two_workers_of_one_proxy_share_caches_and_refs(logs, store, searxng, site, _backend_server, _searxng_server):
    """PROXY_WORKERS=2: gunicorn hands each connection to either worker; with STATE_URL both see one cache and one
    set of ref ids. Requests go on until both workers have answered some (their metric files say which did)."""
    proxy = start(logs, "workers", store, _backend_server, _searxng_server, PROXY_WORKERS="2")
    try:
        site.route("/doc", DOC)
        query = f"workers {uuid.uuid4().hex[:8]}"
        searxng.behave(query, "results", results=[result(site.url + "/doc", "The notes", "About 0.32.")])
        first = thread(search_query=[{"q": query}])
        assert post(proxy, first)[0] == 200
        for i in range(40):
            got, answer = post(proxy, {**thread(search_query=[{"q": query}], open=[{"ref_id": "turn0search0"}]),
                                       "id": first["id"]})
            assert got == 200 and f"[turn{i + 1}search0]" in answer["output"], answer
            assert "PELICAN-7731" in answer["output"], answer
            served = {f.name.rsplit("_", 1)[1] for f in proxy.metrics_dir.glob("counter_*.db")}
            if len(served) >= 2 and i >= 3:
                break
        assert len(served) == 2, served
        assert searxng.queries == [query] and [r.path for r in site.requests] == ["/doc"]
    finally:
        proxy.stop()


def test_replicas_without_a_secret_agree_on_session_keys_through_the_store(backend, logs, tmp_path, _backend_server,
                                                                        _searxng_server):
    """No SESSION_ID_SECRET and no shared key file (replicas on other hosts): A, B and a two-worker C take one HMAC
    key from their store, so one Codex session gets one X-Session-ID from all of them, and two sessions two. (A store
    of its own: one that restarted empty under running replicas gets their key back within a minute, not at once.)"""
    backend.responder = lambda received: json_reply(completion("ok"))
    body = json.dumps({"model": "foundation", "tool_choice": "none",
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    with RedisServer(tmp_path / "redis") as server:
        proxies = [start(logs, name, server, _backend_server, _searxng_server, **env)
                   for name, env in (("key-a", {}), ("key-b", {}), ("key-c", {"PROXY_WORKERS": "2"}))]
        try:
            sent = []
            for proxy, session in [(p, s) for s in ("s1", "s2") for p in (*proxies, proxies[2], proxies[2])]:
                req = urllib.request.Request(proxy.url + "/v1/chat/completions", data=body, method="POST", headers={
                    "Content-Type": "application/json", "session-id": session})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    assert resp.status == 200
                sent.append((session, backend.received[-1].headers["x-session-id"]))
        finally:
            for p in proxies:
                p.stop()
    keys = {session: {key for s, key in sent if s == session} for session in ("s1", "s2")}
    assert len(keys["s1"]) == len(keys["s2"]) == 1 and keys["s1"] != keys["s2"], sent


WIRE = Path(__file__).parent / "data" / "agent-wire"


def captured_first(name: str) -> tuple[str, dict, dict]:
    """(target, headers, body) of a captured agent's first request, its tools dropped (relayed as they are)."""
    request = json.loads((WIRE / name).read_text())[0]
    body = request["body"] if isinstance(request["body"], dict) else json.loads(request["body"])
    keep = ("content-type", "x-claude-code-session-id", "session-id", "anthropic-version")
    return request["target"], {n: v for n, v in request["headers"] if n.lower() in keep}, {**body, "tools": [],
                                                                                          "stream": False}


def twelve_sessions() -> list[list[tuple[str, dict, dict]]]:
    """Four sessions each of Claude Code and Codex (their captured first request, the session id each its own; every
    Codex session from one folder, so one environment context) and of plain chat (no session header), two turns
    each: [(target, headers, body), ...] per session."""
    sessions = []
    for name, header in (("claude-code-2.1.332-webfetch.json", "x-claude-code-session-id"),
                         ("codex-0.171.0-websearch.json", "session-id")):
        target, headers, body = captured_first(name)
        for _ in range(4):
            own = {**{n: v for n, v in headers.items() if n.lower() != header}, header: str(uuid.uuid4())}
            later = json.loads(json.dumps(body))
            later.setdefault("messages" if "messages" in body else "input", []).append(
                {"role": "user", "content": "And then?"})
            sessions.append([(target, own, body), (target, own, later)])
    for i in range(4):
        first = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"Question {i}?"}]
        later = first + [{"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Why?"}]
        sessions.append([("/v1/chat/completions", {"Content-Type": "application/json"},
                          {"model": "foundation", "tool_choice": "none", "messages": m}) for m in (first, later)])
    return sessions


def test_twelve_sessions_over_three_replicas_get_twelve_keys(backend, logs, tmp_path, _backend_server,
                                                             _searxng_server):
    """Issue 50's check: Claude Code, Codex and plain chat sessions, each turn on another replica (one of them with
    two workers) sharing one store and no SESSION_ID_SECRET: one X-Session-ID per session, twelve in all."""
    backend.responder = lambda received: Reply(body=b"{}")
    with RedisServer(tmp_path / "redis") as server:
        proxies = [start(logs, name, server, _backend_server, _searxng_server, **env)
                   for name, env in (("s-a", {}), ("s-b", {}), ("s-c", {"PROXY_WORKERS": "2"}))]
        try:
            keys = []
            for n, session in enumerate(twelve_sessions()):
                seen = set()
                for turn, (target, headers, body) in enumerate(session):
                    status, _, data = raw_request(proxies[(n + turn) % 3].url, "POST", target,
                                                  json.dumps(body).encode(), headers)
                    assert status == 200, data
                    seen.add(backend.received[-1].headers["x-session-id"])
                assert len(seen) == 1, (n, seen)
                keys.append(seen.pop())
        finally:
            for p in proxies:
                p.stop()
    assert len(set(keys)) == 12, keys


def test_without_state_url_there_is_no_store_to_report(proxy):
    """No series at all (an unlabelled gauge's 0 would read as a store that is down)."""
    assert post(proxy, thread(search_query=[{"q": "no store"}]))[0] == 200
    assert not [name for name, _ in scrape(proxy) if name.startswith("proxy_state")]


def chat_completion(proxy, text: str) -> tuple[int, dict]:
    req = urllib.request.Request(proxy.url + "/v1/chat/completions", method="POST", data=json.dumps({
        "model": "foundation", "messages": [{"role": "user", "content": text}]}).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-local"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_fair_queue_serves_while_its_store_is_down(logs, tmp_path, backend, _backend_server, _searxng_server):
    """The scale overlay's replicas run the fair queue (MAX_NUM_SEQS) in the same Valkey: with it gone a generation
    request is still answered, straight to vLLM (as MAX_NUM_SEQS=0 would), one log line says so, the state metrics
    count it, and the queue is used again once the store is back."""
    backend.responder = lambda received: json_reply(completion("ok"))
    with RedisServer(tmp_path / "redis") as server:
        proxy = start(logs, "queue", server, _backend_server, _searxng_server, MAX_NUM_SEQS="1",
                      PROXY_METRICS="true")
        try:
            assert chat_completion(proxy, "before")[0] == 200
            server.stop()
            for i in range(3):
                started = time.monotonic()
                got, body = chat_completion(proxy, f"during {i}")
                assert got == 200, body
                assert time.monotonic() - started < 5
            assert value(scrape(proxy), "proxy_state_errors_total", use="queue") > 0
            assert len(re.findall(r"fair queue.*store", proxy.log_once("fair queue"))) == 1, proxy.log()
            server.start()
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and "fair queue back" not in proxy.log():
                assert chat_completion(proxy, "after")[0] == 200
                time.sleep(0.5)
            assert "fair queue back" in proxy.log()
        finally:
            proxy.stop()


def test_the_mcp_servers_unsourced_budget_and_reads_hold_across_replicas(logs, store, _backend_server,
                                                                          _searxng_server, site):
    """MCP_UNSOURCED_PER_HOUR is per client and hour over every replica (the store counts it, as it counts link
    fetches), and a page one replica read is given on the other: an MCP client behind a load balancer gets one
    budget, not one a replica."""
    from test_mcp import ARTICLE, session, text  # noqa: PLC0415 (the SDK's client, only this test needs it)

    for path in ("/typed", "/built"):
        site.route(path, ARTICLE)
    base = f"http://127.0.0.1:{site.port}"
    a = start(logs, "mcp-a", store, _backend_server, _searxng_server, MCP_UNSOURCED_PER_HOUR="1",
              WEB_FETCH_CACHE_TTL="0")
    try:
        b = start(logs, "mcp-b", store, _backend_server, _searxng_server, MCP_UNSOURCED_PER_HOUR="1",
                  WEB_FETCH_CACHE_TTL="0")
        try:
            _, _, (first,) = session(a, ("web_fetch", {"url": base + "/typed"}))  # the hour's one, on A
            _, _, (over, again) = session(b, ("web_fetch", {"url": base + "/built"}),  # B knows it is spent
                                          ("web_fetch", {"url": base + "/typed"}))    # and that A read this
            assert (first.is_error, over.is_error, again.is_error) == (False, True, False), text(over)
            assert "MCP_UNSOURCED_PER_HOUR" in text(over)
            assert [r.path for r in site.requests] == ["/typed", "/typed"]
        finally:
            b.stop()
    finally:
        a.stop()
