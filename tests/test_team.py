"""A stack shared by a team (docs/operations.md, "Sharing the stack"): people's keys from PROXY_KEYS_FILE made by scripts/keys.py,
their quotas, usage per key and day, and the fair queue, through the real proxy under gunicorn with two workers
in front of the paced vLLM stand-in (standins/paced_backend.py), which serves one sequence at a time where a test
says so, as vLLM does with --max-num-seqs 1.

Run: tests/run.sh tests/test_team.py
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from clients import anthropic, openai

from standins.proxy_process import ProxyProcess
from standins.rawhttp import raw_request
from standins.redis_server import RedisServer
from standins.scripted_backend import Reply
from standins.vllm_wire import completion, json_reply, sse_reply, stream_frames, tool_call

ROOT = Path(__file__).resolve().parent.parent
KEYS = ROOT / "scripts" / "keys.py"
PACED = ROOT / "standins" / "paced_backend.py"
ADMIN_KEY = "admin-key-for-the-tests"


# ---- helpers ------------------------------------------------------------------------------------

def keys(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(KEYS), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})


def add_key(path: Path, name: str, *limits: str) -> str:
    proc = keys("add", name, *limits, "--file", str(path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sk-cs-"), proc.stdout
    return lines[0]


def chat(key: str | None, *, stream: bool = False, tokens: int = 3, user: str = "", include_usage: bool = True,
         **extra) -> dict:
    body = {"model": "foundation", "messages": [{"role": "user", "content": "say three words"}],
            "max_tokens": tokens, "ignore_eos": True, "stream": stream, "user": user, **extra}
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    return {"body": json.dumps(body).encode(),
            "headers": {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}}


def post(proxy, path: str, request: dict, timeout: float = 60) -> tuple[int, dict, bytes]:
    return raw_request(proxy.url, "POST", path, request["body"], request["headers"], timeout=timeout)


def usage(proxy) -> dict:
    status, _, raw = raw_request(proxy.url, "GET", "/proxy/usage", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert status == 200, raw
    return json.loads(raw)


def today(proxy, name: str) -> dict:
    days = usage(proxy)["keys"].get(name, {})
    return next(iter(days.values())) if days else {}


def stream_usage(raw: bytes) -> dict:
    """The usage a streamed chat answer ended with, as the client read it."""
    found = {}
    for line in raw.decode().splitlines():
        if line.startswith("data: {") and '"usage"' in line:
            found = json.loads(line[6:])["usage"] or found
    return found


@pytest.fixture
def paced(tmp_path):
    """paced(*flags) -> the base URL of a paced vLLM stand-in (stopped by its pid at the end)."""
    procs = []

    def start(*flags: str) -> str:
        proc = subprocess.Popen([sys.executable, str(PACED), "--port", "0", *flags], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), "the paced stand-in did not start"
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def team(tmp_path, paced):
    """team(**env) -> a proxy under gunicorn with two workers, a keys file and a state file of the test's own."""
    running: list[ProxyProcess] = []
    keys_file = tmp_path / "keys.json"

    def start(backend: str | None = None, **env) -> ProxyProcess:
        full = {"BACKEND_URL": backend or paced("--gap", "0.001"), "SEARXNG_URL": "http://127.0.0.1:9",
                "PROXY_WORKERS": "2", "PROXY_API_KEY": ADMIN_KEY, "PROXY_KEYS_FILE": str(keys_file),
                "PROXY_STATE_DB": str(tmp_path / "state" / "state.sqlite3"), "KEEPALIVE_INTERVAL": "0.2",
                **{k: str(v) for k, v in env.items()}}
        proxy = ProxyProcess(full, tmp_path / f"proxy-{len(running)}.log")
        running.append(proxy)
        # Both workers up (each reads the keys file as it starts), so a test's requests may land on either.
        deadline = time.monotonic() + 30
        while proxy.log().count("PROXY_KEYS_FILE") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return proxy

    start.keys_file = keys_file  # type: ignore[attr-defined]
    yield start
    for p in running:
        p.stop()


# ---- scripts/keys.py ------------------------------------------------------------------------------

def test_keys_script_adds_lists_and_revokes_writing_the_file_whole_and_private(tmp_path):
    path = tmp_path / "keys.json"
    key = add_key(path, "alice", "--rpm", "60", "--concurrent", "2")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert key not in path.read_text() and [p.name for p in tmp_path.iterdir()] == ["keys.json"]  # no temp file left
    listed = keys("list", env={"PROXY_KEYS_FILE": str(path)})  # the default file is $PROXY_KEYS_FILE
    assert listed.returncode == 0 and "alice" in listed.stdout and key not in listed.stdout
    assert listed.stdout.split("\n")[1].split()[:4] == ["alice", "60", "-", "2"]
    inode = path.stat().st_ino
    assert keys("revoke", "alice", "--file", str(path)).returncode == 0
    assert path.stat().st_ino != inode, "rewritten in place: a reader could see half a file"
    assert "alice" not in keys("list", "--file", str(path)).stdout


@pytest.mark.parametrize("args, message", [
    (["add", "bad name"], "a key's name is 1-64 letters"),
    (["add", "admin"], "'admin' is the name of PROXY_API_KEY's keys"),
    (["add", "Admin"], "'admin' is the name of PROXY_API_KEY's keys"),
    (["add", "ADMIN"], "'admin' is the name of PROXY_API_KEY's keys"),
    (["add", "bob", "--rpm", "0"], "--rpm: must be above 0"),
    (["add", "bob", "--tokens-per-day", "many"], "must be a whole number"),
    (["revoke", "nobody"], "no key named 'nobody'"),
    (["frobnicate"], "invalid choice"),
])
def test_keys_script_errors_are_one_line_and_non_zero(tmp_path, args, message):
    proc = keys(*args, "--file", str(tmp_path / "keys.json"))
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_keys_script_refuses_a_broken_file_and_a_missing_path(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text("{not json")
    proc = keys("add", "carol", "--file", str(path))
    assert proc.returncode == 1 and proc.stderr.startswith("keys.py: ") and path.read_text() == "{not json"
    proc = keys("list", env={"PROXY_KEYS_FILE": ""})
    assert proc.returncode == 2 and "PROXY_KEYS_FILE" in proc.stderr and proc.stderr.count("\n") == 1
    assert keys("-h").returncode == 0 and "revoke NAME" in keys("-h").stdout


# ---- keys per person -------------------------------------------------------------------------------

def test_each_person_has_a_key_revoked_alone_at_the_next_request(team):
    alice = add_key(team.keys_file, "alice")
    bob = add_key(team.keys_file, "bob")
    proxy = team()
    for key in (alice, bob, ADMIN_KEY):
        for _ in range(4):  # both workers
            assert post(proxy, "/v1/chat/completions", chat(key))[0] == 200
    assert keys("revoke", "alice", "--file", str(team.keys_file)).returncode == 0
    for _ in range(4):
        status, head, raw = post(proxy, "/v1/chat/completions", chat(alice))
        assert status == 401 and json.loads(raw)["error"]["type"] == "authentication_error", raw
        assert post(proxy, "/v1/chat/completions", chat(bob))[0] == 200
    # Anthropic's shape on /v1/messages, for a key nobody holds.
    status, _, raw = raw_request(proxy.url, "POST", "/v1/messages", b"{}", {"x-api-key": "sk-cs-nobody"})
    assert status == 401 and json.loads(raw)["error"]["type"] == "authentication_error" and json.loads(raw)["type"] == "error"
    # People read no one's usage; the admin reads everyone's, by name.
    assert raw_request(proxy.url, "GET", "/proxy/usage", headers={"Authorization": f"Bearer {bob}"})[0] == 403
    assert {"alice", "bob", "admin"} <= set(usage(proxy)["keys"])
    _, _, metrics = raw_request(proxy.url, "GET", "/proxy/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert b'key="bob"' in metrics
    time.sleep(0.3)  # the last access lines
    for key in (alice, bob, ADMIN_KEY):
        assert key.encode() not in metrics and key not in proxy.log(), "a key reached the metrics or the log"
    assert proxy.log().count(" key=bob") >= 8


def test_a_broken_keys_file_keeps_the_keys_read_before(team):
    alice = add_key(team.keys_file, "alice")
    proxy = team()
    assert post(proxy, "/v1/chat/completions", chat(alice))[0] == 200
    team.keys_file.write_text('{"keys": [{"name": "alice"')  # a hand edit, half saved
    for _ in range(4):
        assert post(proxy, "/v1/chat/completions", chat(alice))[0] == 200
    assert "keeping the 1 keys read before" in proxy.log()


# ---- quotas -------------------------------------------------------------------------------------------

def test_requests_per_minute_hold_exactly_across_two_workers(team):
    burst = add_key(team.keys_file, "burst", "--rpm", "7")
    other = add_key(team.keys_file, "other", "--rpm", "7")
    proxy = team()
    assert len(proxy.workers()) == 2
    with ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(lambda _: post(proxy, "/v1/chat/completions", chat(burst))[0], range(24)))
    assert sorted(statuses) == [200] * 7 + [429] * 17, statuses
    assert post(proxy, "/v1/chat/completions", chat(other))[0] == 200, "one key's limit is not another's"
    day = today(proxy, "burst")
    assert (day["requests"], day["limited"]) == (7, 17)
    _, _, metrics = raw_request(proxy.url, "GET", "/proxy/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert b'proxy_key_limited_total{key="burst",limit="rpm"} 17.0' in metrics


def test_the_429_loads_in_the_openai_and_anthropic_sdks(team):
    key = add_key(team.keys_file, "sdk", "--rpm", "1")
    proxy = team()
    assert post(proxy, "/v1/chat/completions", chat(key))[0] == 200
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="foundation", messages=[{"role": "user", "content": "hi"}])
    err = caught.value
    assert err.status_code == 429 and "requests per minute" in err.message and err.type == "rate_limit_exceeded"
    headers = err.response.headers
    assert 1 <= int(headers["retry-after"]) <= 60 and headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-limit-requests"] == "1"
    waits = client._parse_retry_after_header(headers)  # the SDK's own reading of the retry headers
    assert waits is not None and 0 < waits <= 60
    aclient = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as acaught:
        aclient.messages.create(model="foundation", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    aerr = acaught.value
    assert aerr.status_code == 429 and aerr.body["error"]["type"] == "rate_limit_error"
    assert aerr.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert 0 < aclient._parse_retry_after_header(aerr.response.headers) <= 60


def test_tokens_per_day_are_counted_from_real_usage_streamed_and_not(team):
    key = add_key(team.keys_file, "tokens", "--tokens-per-day", "60")
    proxy = team()
    status, _, raw = post(proxy, "/v1/chat/completions", chat(key, tokens=7))
    assert status == 200
    plain = json.loads(raw)["usage"]
    status, _, raw = post(proxy, "/v1/chat/completions", chat(key, stream=True, tokens=9))
    streamed = stream_usage(raw)
    assert status == 200 and streamed["completion_tokens"] == 9
    # A stream that does not ask for usage gets none, and is counted all the same.
    status, _, raw = post(proxy, "/v1/chat/completions", chat(key, stream=True, tokens=5, include_usage=False))
    assert status == 200 and b'"usage"' not in raw and raw.rstrip().endswith(b"data: [DONE]")
    time.sleep(0.3)  # usage is recorded when the answer's last byte has gone
    day = today(proxy, "tokens")
    assert day["prompt_tokens"] == plain["prompt_tokens"] + 2 * streamed["prompt_tokens"]
    assert day["completion_tokens"] == 7 + 9 + 5
    spent = day["prompt_tokens"] + day["completion_tokens"]
    while spent < 60:  # up to the limit; the request that crosses it is served, the next is not
        status, _, raw = post(proxy, "/v1/chat/completions", chat(key, tokens=9))
        assert status == 200
        spent += json.loads(raw)["usage"]["total_tokens"]
    time.sleep(0.3)
    status, head, raw = post(proxy, "/v1/chat/completions", chat(key))
    assert status == 429 and "tokens per day" in json.loads(raw)["error"]["message"]
    assert head["x-ratelimit-limit-tokens"] == "60" and int(head["retry-after"]) <= 86400


def test_concurrent_requests_are_limited_and_freed_when_they_end(team, paced):
    key = add_key(team.keys_file, "solo", "--concurrent", "1")
    events = team.keys_file.parent / "events.jsonl"
    # 5 s of answer: the second request's 1 s of waiting for a slot ends well inside it, however loaded the machine.
    proxy = team(paced("--gap", "0.05", "--events", str(events)))
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(post, proxy, "/v1/chat/completions", chat(key, tokens=100))
        until(lambda: events.exists() and '"start' in events.read_text())  # the first is generating, not just sent
        status, _, raw = post(proxy, "/v1/chat/completions", chat(key))
        assert status == 429 and "1 requests at once" in json.loads(raw)["error"]["message"]
        assert slow.result()[0] == 200
    assert post(proxy, "/v1/chat/completions", chat(key))[0] == 200


def test_usage_survives_a_restart(team):
    key = add_key(team.keys_file, "keeper")
    proxy = team()
    for _ in range(3):
        assert post(proxy, "/v1/chat/completions", chat(key, tokens=4))[0] == 200
    time.sleep(0.3)
    before = today(proxy, "keeper")
    assert before["requests"] == 3 and before["completion_tokens"] == 12
    proxy.stop()
    again = team()
    assert today(again, "keeper") == before


# ---- usage per key --------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_usage_counts_searches_page_reads_refused_fetches_and_the_tokens_the_client_got(
        start_proxy, backend, searxng, site, tmp_path, stream):
    keys_file = tmp_path / "keys.json"
    key = add_key(keys_file, "reader")
    proxy = start_proxy(PROXY_KEYS_FILE=str(keys_file), PROXY_STATE_DB=str(tmp_path / "state.sqlite3"),
                        PROXY_API_KEY=ADMIN_KEY, WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", KEEPALIVE_INTERVAL="0.2")
    path = f"/notes-{stream}"
    site.route(path, "<html><head><title>Notes</title></head><body><article><h1>Notes</h1><p>"
               + "The release adds prefix caching. " * 20 + "</p></article></body></html>")
    given = f"http://127.0.0.1:{site.port}{path}"

    def turn(calls):
        if stream:
            return sse_reply(stream_frames(tool_calls=calls, finish_reason="tool_calls", include_usage=True,
                                           completion_tokens=11))
        return json_reply(completion(tool_calls=calls, completion_tokens=11))

    backend.script(turn([tool_call("web_search", {"query": "release notes"})]),
                   turn([tool_call("web_fetch", {"url": given}),
                         tool_call("web_fetch", {"url": "http://127.0.0.1:9/never-given"})]),
                   sse_reply(stream_frames(content=["Done."], finish_reason="stop", include_usage=True,
                                           completion_tokens=5)) if stream
                   else json_reply(completion(content="Done.", completion_tokens=5)))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": f"Search, then read {given}"}]
    if stream:
        chunks = list(client.chat.completions.create(model="foundation", messages=messages, stream=True,
                                                     stream_options={"include_usage": True}))
        got = next(c.usage for c in chunks if c.usage is not None)
    else:
        got = client.chat.completions.create(model="foundation", messages=messages).usage
    assert got.completion_tokens == 11 + 11 + 5
    time.sleep(0.3)
    day = today(proxy, "reader")
    assert {k: day[k] for k in ("requests", "searches", "page_reads", "refused_fetches")} == {
        "requests": 1, "searches": 1, "page_reads": 1, "refused_fetches": 1}, day
    assert (day["prompt_tokens"], day["completion_tokens"]) == (got.prompt_tokens, got.completion_tokens)
    _, _, metrics = raw_request(proxy.url, "GET", "/proxy/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert b'proxy_key_usage_total{figure="searches",key="reader"}' in metrics


SPLITS = [1, 7, 64, 10_000]


def feed(scan, raw: bytes, size: int) -> dict:
    for i in range(0, len(raw), size):
        scan.feed(raw[i:i + size])
    return scan.result()


@pytest.mark.parametrize("size", SPLITS)
@pytest.mark.parametrize("kind, raw, want", [
    ("text/event-stream", b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\ndata: {"choices":[],"usage":'
     b'{"prompt_tokens":40,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":32}}}\n\ndata: [DONE]\n\n',
     (40, 9, 32)),
    ("text/event-stream; charset=utf-8", b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
     b'{"input_tokens":10,"cache_read_input_tokens":30,"output_tokens":1}}}\n\nevent: ping\ndata: {"type":"ping"}\n\n'
     b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":12}}\n\n', (40, 12, 30)),
    ("text/event-stream", b'event: response.completed\ndata: {"type":"response.completed","response":{"usage":'
     b'{"input_tokens":50,"output_tokens":6,"input_tokens_details":{"cached_tokens":48}}}}\n\n', (50, 6, 48)),
    ("application/json", b'{"id":"x","usage":{"prompt_tokens":17,"completion_tokens":20}}', (17, 20, 0)),
    ("application/json", b'{"type":"message","usage":{"input_tokens":8,"output_tokens":3}}', (8, 3, 0)),
    ("application/json", b'{"error":{"message":"no"}}', (0, 0, 0)),
    ("text/event-stream", b'data: {"usage": "not an object"}\n\ndata: {broken "usage"\n\n', (0, 0, 0)),
])
def test_usage_is_read_from_every_apis_answer_however_it_is_cut(kind, raw, want, size):
    from proxy.observe.usage import UsageScan
    scan = UsageScan()
    scan.headers([("Content-Type", kind)])
    found = feed(scan, raw, size)
    assert (found["prompt_tokens"], found["completion_tokens"], found["cached_tokens"]) == want


@pytest.fixture
def redis_url(tmp_path):
    """A real Redis (Debian's redis-server, tests/run.sh's redis tier) on a free loopback port, stopped by its pid."""
    with RedisServer(tmp_path / "redis") as server:
        yield server.url


# ---- the fair queue: the store's choices ------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def admitted_order(store, tickets: dict[str, str], seats: int = 1) -> list[str]:
    """Release whatever runs, one at a time, and say which ticket each free seat went to."""
    order = []
    by_id = {v: k for k, v in tickets.items()}
    while by_id:
        running = [t for t in by_id if store.admitted(t, seats)]
        assert len(running) <= seats
        for t in running:
            order.append(by_id.pop(t))
            store.release(t)
    return order


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def stores(request, tmp_path):
    """stores(clock) -> a new handle on one shared store (each a worker's), SQLite's or Redis's."""
    from proxy.backends.state.teamstore import TeamStore
    from proxy.backends.state.teamstore_redis import RedisTeamStore
    made: list = []
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""

    def make(clock=time.time):
        store = TeamStore(str(tmp_path / "state.sqlite3"), clock=clock) if not url else RedisTeamStore(url, clock=clock)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()  # its lease renewal must not outlive the test (nor its Redis)


def test_the_queue_goes_round_robin_across_keys_and_a_resumed_turn_keeps_its_place(stores):
    store = stores()
    tickets = {}
    for label, name in [("x1", "x"), ("x2", "x"), ("x3", "x"), ("y1", "y"), ("z1", "z"), ("x4", "x")]:
        tickets[label] = store.enqueue(name, resumed=False)
        time.sleep(0.002)
    assert admitted_order(store, tickets) == ["x1", "y1", "z1", "x2", "x3", "x4"]
    # A request back from its search round goes ahead of its own key's first turns, not ahead of other keys: four
    # search loops of one key must not starve another's short question (issue 51).
    first = store.enqueue("x", resumed=False)
    assert store.admitted(first, 1)
    waiting = {"x-new": store.enqueue("x", resumed=False)}
    time.sleep(0.002)
    for i in range(4):
        waiting[f"x-resumed{i}"] = store.enqueue("x", resumed=True)
        time.sleep(0.002)
    waiting["y"] = store.enqueue("y", resumed=False)
    store.release(first)
    assert admitted_order(store, waiting) == ["y", "x-resumed0", "x-resumed1", "x-resumed2", "x-resumed3", "x-new"]


def test_with_queue_policy_tokens_the_key_that_used_fewest_tokens_today_goes_first(stores):
    store = stores()
    store.add("heavy", {"prompt_tokens": 900, "completion_tokens": 100})
    store.add("light", {"prompt_tokens": 90, "completion_tokens": 10})
    running = store.enqueue("other", resumed=False)
    assert store.admitted(running, 1, "tokens")
    waiting = {name: store.enqueue(name, resumed=False) for name in ("heavy", "light", "fresh")}
    store.release(running)
    order = []
    while waiting:
        for name, t in list(waiting.items()):
            if store.admitted(t, 1, "tokens"):
                order.append(name)
                store.release(waiting.pop(name))
    assert order == ["fresh", "light", "heavy"]


def test_a_dead_workers_seat_is_reclaimed_when_its_lease_runs_out(stores):
    from proxy.backends.state.teamstore import LEASE
    clock = Clock()
    dead, alive = stores(clock), stores(clock)
    held = dead.enqueue("x", resumed=False)
    assert dead.admitted(held, 1)
    clock.now += LEASE - 1
    mine = alive.enqueue("y", resumed=False)
    assert alive.admitted(mine, 1) is False
    clock.now += 2  # the dead worker never renewed its lease; ours is fresh
    assert alive.admitted(mine, 1) is True and dead.admitted(held, 1) is None


# ---- the fair queue, end to end ----------------------------------------------------------------------------

def ends(events: Path) -> list[str]:
    """The users whose requests the stand-in finished, in order."""
    return [e["user"] for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "end"]


def starts(events: Path) -> list[str]:
    if not events.exists():
        return []
    return [e["user"] for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "start"]


def until(predicate, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def one_run(team, paced, tmp_path, seats: int, keys: dict[str, str]) -> dict[str, tuple[int, float]]:
    """Six long streamed requests of one key, then one short request from each of two others: for each short
    one, the long requests finished after it arrived and before it was done, and its seconds from arrival to answer."""
    events = tmp_path / f"events-{seats}.jsonl"
    proxy = team(paced("--max-num-seqs", "1", "--gap", "0.02", "--events", str(events)), MAX_NUM_SEQS=seats,
                 PROXY_STATE_DB=tmp_path / f"state-{seats}.sqlite3")
    out = {}
    with ThreadPoolExecutor(8) as pool:
        longs = [pool.submit(post, proxy, "/v1/chat/completions", chat(keys["agent"], stream=True, tokens=50,
                                                                       user=f"long{i}")) for i in range(6)]
        until(lambda: len(starts(events)) >= 1)
        time.sleep(0.4)  # the other five are waiting: in vLLM's queue (FIFO) or the proxy's (fair)
        done_before = len(ends(events))
        arrived = time.monotonic()

        def short(name: str) -> float:
            status, _, raw = post(proxy, "/v1/chat/completions", chat(keys[name], tokens=2, user=name,
                                                                     stream=name == "ben"))
            assert status == 200, raw
            return time.monotonic() - arrived

        shorts = {name: pool.submit(short, name) for name in ("ann", "ben")}
        for name, future in shorts.items():
            seconds = future.result(timeout=60)
            order = ends(events)
            out[name] = (sum(1 for u in order[done_before:order.index(name)] if u.startswith("long")), seconds)
        assert all(f.result(timeout=60)[0] == 200 for f in longs)
    if seats:
        until(lambda: today(proxy, "agent").get("requests") == 6)
        assert today(proxy, "agent")["queued_seconds"] > 1.0  # five of its six waited behind each other
        assert "key=agent" in proxy.log() and " queued=" in proxy.log()
    proxy.stop()
    return out


@pytest.mark.slow  # two runs of six one-second generations on a one-at-a-time stand-in: about 15 s
def test_a_short_request_waits_behind_at_most_one_long_request_of_another_key(team, paced, tmp_path):
    keys = {name: add_key(team.keys_file, name) for name in ("agent", "ann", "ben")}
    fifo = one_run(team, paced, tmp_path, 0, keys)
    fair = one_run(team, paced, tmp_path, 1, keys)
    print("\nlong requests finished ahead of each short one, and its seconds to answer (6 long ones of 1 s queued):")
    for name in ("ann", "ben"):
        print(f"  {name}: vLLM's FIFO {fifo[name][0]} long, {fifo[name][1]:.1f} s; "
              f"fair queue {fair[name][0]} long, {fair[name][1]:.1f} s")
    assert all(ahead <= 1 for ahead, _ in fair.values()), fair
    assert all(ahead >= 5 for ahead, _ in fifo.values()), fifo  # the baseline really was first come, first served


def search_loops(rounds: int, seconds: float):
    """The backend's part for test_search_loops...: a request whose `user` starts with "loop" searches `rounds`
    times and then answers; anything else answers at once. Each turn takes `seconds`, as a generation would."""
    def respond(received):
        body = received.json()
        searched = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        if str(body.get("user", "")).startswith("loop") and searched < rounds:
            return Reply(body=json.dumps(completion(tool_calls=[tool_call("web_search", {"query": f"q{searched}"})],
                                                    finish_reason="tool_calls")).encode(), delay=seconds)
        return Reply(body=json.dumps(completion("done", finish_reason="stop")).encode(), delay=seconds)
    return respond


@pytest.mark.parametrize("store", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_search_loops_of_one_member_do_not_starve_anothers_question(request, team, backend, searxng, store):
    """Issue 51, finding 10, through the proxy: four requests of one member, nine search rounds each, and another
    member's question sent while they run. Each round is a turn in the fair queue; the question is admitted as soon as
    the turn running ends (its key served least), not after the loops' resumed turns."""
    loop_key, bob = add_key(team.keys_file, "loops"), add_key(team.keys_file, "bob")
    backend.responder = search_loops(rounds=9, seconds=0.1)
    shared = {"STATE_URL": request.getfixturevalue("redis_url")} if store == "redis" else {}
    proxy = team(backend.url, MAX_NUM_SEQS=1, SEARXNG_URL=searxng.url, MAX_SEARCH_ITER=9, **shared)
    with ThreadPoolExecutor(5) as pool:
        loops = [pool.submit(post, proxy, "/v1/chat/completions", chat(loop_key, user=f"loop{i}")) for i in range(4)]
        until(lambda: len(backend.received) >= 8)  # every loop is past its first round: resumed turns are queued
        sent = len(backend.received)
        status, _, raw = post(proxy, "/v1/chat/completions", chat(bob, user="bob"))
        assert status == 200, raw
        assert all(f.result(timeout=120)[0] == 200 for f in loops)
    users = [r.json().get("user") for r in backend.received]
    assert len(users) == 4 * 10 + 1, users  # nine rounds and an answer each, and the question
    ahead = users.index("bob") - sent
    # The turn running when the question came, and one admitted in the same instant: at most two.
    assert ahead <= 2, (ahead, users[sent:])


@pytest.mark.parametrize("store", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_while_queued_gives_up_its_place(request, team, paced, tmp_path, stream, store):
    keys = {name: add_key(team.keys_file, name) for name in ("busy", "leaver", "next")}
    events = tmp_path / "events.jsonl"
    shared = {"STATE_URL": request.getfixturevalue("redis_url")} if store == "redis" else {}
    proxy = team(paced("--max-num-seqs", "1", "--gap", "0.02", "--events", str(events)), MAX_NUM_SEQS=1, **shared)
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(post, proxy, "/v1/chat/completions", chat(keys["busy"], tokens=50, user="busy"))
        until(lambda: starts(events) == ["busy"])
        sock = socket.create_connection((proxy.url.split("//")[1].split(":")[0], int(proxy.url.rsplit(":", 1)[1])))
        request = chat(keys["leaver"], stream=stream, tokens=50, user="leaver")
        head = "".join(f"{k}: {v}\r\n" for k, v in request["headers"].items())
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{head}Content-Length: "
                     f"{len(request['body'])}\r\n\r\n".encode() + request["body"])
        if stream:
            # A queued stream answers at once and keeps the client alive while it waits.
            sock.settimeout(5)
            got = b""
            while b"queued for the model" not in got:
                got += sock.recv(4096)
            assert got.startswith(b"HTTP/1.1 200")
        else:
            until(lambda: usage(proxy)["queue"]["waiting"] == 1)
        sock.close()  # the client gives up while the card is busy
        until(lambda: usage(proxy)["queue"]["waiting"] == 0, seconds=5)
        assert post(proxy, "/v1/chat/completions", chat(keys["next"], tokens=2, user="next"))[0] == 200
        assert busy.result(timeout=30)[0] == 200
    assert starts(events) == ["busy", "next"], "the request of a client that had left went to vLLM"


# ---- replicas sharing Redis (STATE_URL) ---------------------------------------------------------------------

@pytest.mark.redis
def test_two_replicas_on_one_redis_share_quotas_and_usage_exactly(team, paced, redis_url, tmp_path):
    key = add_key(team.keys_file, "everywhere", "--rpm", "9")
    backend = paced("--gap", "0.001")
    replicas = [team(backend, STATE_URL=redis_url, PROXY_STATE_DB=tmp_path / f"unused-{i}.sqlite3") for i in range(2)]
    with ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(lambda i: post(replicas[i % 2], "/v1/chat/completions", chat(key, tokens=4))[0],
                                 range(24)))
    assert sorted(statuses) == [200] * 9 + [429] * 15, statuses
    time.sleep(0.3)
    for proxy in replicas:  # either replica answers for both
        day = today(proxy, "everywhere")
        assert (day["requests"], day["limited"], day["completion_tokens"]) == (9, 15, 36), day
    assert not list(tmp_path.glob("unused-*.sqlite3")), "the SQLite store was used beside STATE_URL"
    time.sleep(0.3)
    assert all(redis_url not in p.log() for p in replicas)


def read_stream(sock: socket.socket, until_bytes: bytes, seconds: float = 20.0) -> bytes:
    sock.settimeout(seconds)
    got = b""
    while until_bytes not in got:
        piece = sock.recv(65536)
        if not piece:
            break
        got += piece
    return got


@pytest.mark.parametrize("path, body, keepalive, end", [
    # tool_choice "none": nothing for the proxy to add, so vLLM's stream is relayed byte for byte once served.
    ("/v1/chat/completions", {"model": "foundation", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                              "max_tokens": 3, "ignore_eos": True, "tool_choice": "none", "user": "relayed"},
     b": queued for the model", b"data: [DONE]"),
    # No server tools: relayed too; the stand-in has no /v1/messages, and its 404 arrives as Anthropic's error event.
    ("/v1/messages", {"model": "foundation", "max_tokens": 3, "stream": True,
                      "messages": [{"role": "user", "content": "hi"}]},
     b'event: ping\ndata: {"type": "ping"}', b"event: error\ndata: {\"type\":\"error\""),
])
def test_a_relayed_stream_that_waits_gets_the_apis_keep_alives_then_vllms_answer(team, paced, tmp_path, path,
                                                                                  body, keepalive, end):
    keys = {name: add_key(team.keys_file, name) for name in ("busy", "waiter")}
    events = tmp_path / "events.jsonl"
    proxy = team(paced("--max-num-seqs", "1", "--gap", "0.03", "--events", str(events)), MAX_NUM_SEQS=1)
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(post, proxy, "/v1/chat/completions", chat(keys["busy"], tokens=50, user="busy"))
        until(lambda: starts(events) == ["busy"])
        host, port = proxy.url.split("//")[1].split(":")
        sock = socket.create_connection((host, int(port)))
        raw = json.dumps(body).encode()
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-api-key: {keys['waiter']}"
                     f"\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw)
        got = read_stream(sock, keepalive)
        assert got.startswith(b"HTTP/1.1 200") and keepalive in got, got
        assert not busy.done(), "the keep-alive came only after the card was free"
        got += read_stream(sock, end)
        sock.close()
        assert end in got, got
        assert busy.result(timeout=30)[0] == 200
    if path == "/v1/chat/completions":
        assert starts(events) == ["busy", "relayed"] and b'"finish_reason":"length"' in got


def card_time(events: Path) -> dict[str, float]:
    """Seconds the stand-in spent generating for each key (the user label's part before '-')."""
    began: dict[str, float] = {}
    spent: dict[str, float] = {}
    for e in map(json.loads, events.read_text().splitlines()):
        if e["event"] == "start":
            began[e["user"]] = e["t"]
        elif e["user"] in began:
            key = e["user"].split("-")[0]
            spent[key] = spent.get(key, 0.0) + e["t"] - began.pop(e["user"])
    return spent


def busy_run(team, paced, tmp_path, policy: str, keys: dict[str, str], seconds: float = 6.0) -> dict[str, float]:
    """Two keys that always have three requests waiting, one of long requests and one of short: each key's share
    of the card's time."""
    events = tmp_path / f"events-{policy}.jsonl"
    proxy = team(paced("--max-num-seqs", "1", "--gap", "0.02", "--events", str(events)), MAX_NUM_SEQS=1,
                 QUEUE_POLICY=policy, PROXY_STATE_DB=tmp_path / f"state-{policy}.sqlite3")
    stop = time.monotonic() + seconds

    def agent(name: str, tokens: int, i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            status = post(proxy, "/v1/chat/completions", chat(keys[name], tokens=tokens, user=f"{name}-{i}-{n}"))[0]
            assert status == 200

    with ThreadPoolExecutor(6) as pool:
        for f in [pool.submit(agent, "heavy", 40, i) for i in range(3)] + [pool.submit(agent, "light", 4, i)
                                                                             for i in range(3)]:
            f.result(timeout=60)
    proxy.stop()
    spent = card_time(events)
    return {k: v / sum(spent.values()) for k, v in spent.items()}


@pytest.mark.slow  # two 6 s runs of two always-busy keys on a one-at-a-time stand-in
def test_round_robin_against_token_weighting_with_two_busy_keys(team, paced, tmp_path):
    keys = {name: add_key(team.keys_file, name) for name in ("heavy", "light")}
    rr = busy_run(team, paced, tmp_path, "round_robin", keys)
    tokens = busy_run(team, paced, tmp_path, "tokens", keys)
    print("\nshare of the card's time, two keys always waiting (0.8 s requests against 0.1 s ones):")
    for name in ("heavy", "light"):
        print(f"  {name}: round_robin {rr.get(name, 0):.0%}, tokens {tokens.get(name, 0):.0%}")
    # Each policy does what it says: turns alike (so the long requests take most of the time), or tokens alike. How
    # much more the light key gets by tokens depends on the timing of the runs (14-16 points in most, 9 in one of
    # seven on the development machine: its usage is added when its answer has gone, a moment after its seat is
    # free); a tokens policy that did nothing gives the same share as round robin.
    assert rr["heavy"] > 0.7 and tokens["light"] > rr["light"] + 0.05, (rr, tokens)
    assert min(rr.values()) > 0 and min(tokens.values()) > 0, "a key never got the card"


# ---- a member who pushes (issue 51) -----------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/%63hat/completions", "/v1/%63ompletions", "/invocations",
                                  "/inference/v1/generate", "//v1/chat/completions"])
def test_no_path_to_vllm_skips_the_fair_queue(team, paced, tmp_path, path):
    keys = {name: add_key(team.keys_file, name) for name in ("busy", "pusher")}
    events = tmp_path / "events.jsonl"
    proxy = team(paced("--max-num-seqs", "1", "--gap", "0.02", "--events", str(events)), MAX_NUM_SEQS=1)
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(post, proxy, "/v1/chat/completions", chat(keys["busy"], tokens=100, user="busy"))
        until(lambda: starts(events) == ["busy"])
        # tool_choice "none": the chat route relays vLLM's answer as it is, to the path as the client wrote it.
        status, _, raw = post(proxy, path, chat(keys["pusher"], tokens=2, user="pusher", tool_choice="none"))
        assert busy.done(), f"{path} reached vLLM while the card's one seat was taken: {status} {raw[:200]!r}"
        assert busy.result()[0] == 200
    # Not counted as work on the card: the same path's tokenize answers at once, queue or not.
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(post, proxy, "/v1/chat/completions", chat(keys["busy"], tokens=100, user="busy2"))
        until(lambda: "busy2" in starts(events))
        post(proxy, "/%74okenize", chat(keys["pusher"]))
        assert not busy.done(), "tokenize waited for the card"
        busy.result()


# ---- faults of the store (issue 51) --------------------------------------------------------------------------

def limit_file_size(pids: list[int], size: int | None) -> None:
    """A real write fault in the workers' SQLite file: with RLIMIT_FSIZE at 1 byte every write past its first
    byte fails (EFBIG; Python ignores SIGXFSZ), as a full disk makes them fail; None lifts it."""
    import resource
    for pid in pids:
        _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY if size is None else size, hard))


def test_a_release_the_sqlite_store_could_not_write_frees_the_seat_and_the_slot_within_the_lease(team, paced, tmp_path):
    from proxy.backends.state.teamstore import LEASE
    from proxy.engine.admission import RETRY
    keys = {"owner": add_key(team.keys_file, "owner", "--concurrent", "1"), "other": add_key(team.keys_file, "other")}
    events = tmp_path / "events.jsonl"
    proxy = team(paced("--max-num-seqs", "1", "--gap", "0.02", "--events", str(events)), MAX_NUM_SEQS=1)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(post, proxy, "/v1/chat/completions", chat(keys["owner"], tokens=40, user="owner"))
        until(lambda: starts(events) == ["owner"])
        limit_file_size(proxy.workers(), 1)  # the disk fills while it generates: its release cannot be written
        try:
            held.result(timeout=30)
            time.sleep(1.0)
        finally:
            limit_file_size(proxy.workers(), None)  # a second later the disk has room again
    fault_over = time.monotonic()
    time.sleep(RETRY + 0.5)  # the queue, which failed open while its store did not answer, asks the store again
    status, _, raw = post(proxy, "/v1/chat/completions", chat(keys["other"], tokens=2, user="other"), timeout=60)
    assert status == 200, raw
    seat_back = time.monotonic() - fault_over
    assert seat_back < LEASE + 8, f"the seat came back {seat_back:.0f} s after the fault"
    while (status := post(proxy, "/v1/chat/completions", chat(keys["owner"], tokens=2, user="owner-again"))[0]) == 429:
        assert time.monotonic() - fault_over < LEASE + 8, "the key's one request at once is still taken"
        time.sleep(0.5)
    assert status == 200
    slot_back = time.monotonic() - fault_over
    print(f"\nafter a full disk lost a release: the seat was back {seat_back:.1f} s and the key's slot {slot_back:.1f} s "
          f"after the disk had room (LEASE {LEASE:.0f} s)")


@pytest.mark.parametrize("who, status", [("admin", 200), ("bob", 403), (None, 401)])
def test_the_metrics_name_every_persons_usage_so_only_the_admin_reads_them(team, who, status):
    bob = add_key(team.keys_file, "bob")
    proxy = team()
    assert post(proxy, "/v1/chat/completions", chat(bob))[0] == 200
    # The request's usage is recorded when it ends, a moment after the client has its answer: wait for that end.
    proxy.log_once(" key=bob")
    until(lambda: "bob" in usage(proxy)["keys"])
    key = {"admin": ADMIN_KEY, "bob": bob, None: None}[who]
    for path in ("/proxy/metrics", "/proxy/%6detrics", "/proxy/usage"):
        got, _, raw = raw_request(proxy.url, "GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        assert got == status, (path, raw[:300])
        assert (b'key="bob"' in raw or b'"bob"' in raw) == (status == 200), path


def replace_keys_file(path: Path, how: str) -> None:
    """The keys file turns missing or unreadable (as root, permissions alone cannot make it so)."""
    path.unlink()
    if how == "a directory":
        path.mkdir()
    elif how == "a symlink loop":
        path.symlink_to(path)


@pytest.mark.parametrize("admin_key", ["", ADMIN_KEY])
@pytest.mark.parametrize("how, member_status, log_line", [
    ("deleted", 200, "is gone: keeping the 2 keys read before"),
    ("a directory", 503, "cannot be read"),
    ("a symlink loop", 503, "cannot be read"),
])
def test_a_keys_file_that_goes_missing_or_unreadable_never_opens_the_stack(team, admin_key, how, member_status,
                                                                         log_line):
    alice = add_key(team.keys_file, "alice")
    add_key(team.keys_file, "bob")
    proxy = team(PROXY_API_KEY=admin_key)
    assert post(proxy, "/v1/chat/completions", chat(alice))[0] == 200
    replace_keys_file(team.keys_file, how)
    for _ in range(4):  # both workers
        status, _, raw = post(proxy, "/v1/chat/completions", chat(None))
        assert status == 401, raw
        assert raw_request(proxy.url, "GET", "/proxy/metrics")[0] == 401
        status, _, raw = post(proxy, "/v1/chat/completions", chat(alice))
        assert status == member_status, raw
        if admin_key:
            assert post(proxy, "/v1/chat/completions", chat(ADMIN_KEY))[0] == 200
    assert log_line in proxy.log()


def test_a_stream_nobody_reads_gives_its_seat_back_after_client_write_timeout(team, paced, tmp_path):
    keys = {name: add_key(team.keys_file, name) for name in ("staller", "other")}
    events = tmp_path / "events.jsonl"
    # 20,000 tokens at 1 ms: 20 s of stream, far more than the sockets' buffers between the proxy and the client hold.
    proxy = team(paced("--max-num-seqs", "1", "--gap", "0.001", "--events", str(events)), MAX_NUM_SEQS=1,
                 CLIENT_WRITE_TIMEOUT=1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((proxy.url.split("//")[1].split(":")[0], int(proxy.url.rsplit(":", 1)[1])))
    request = chat(keys["staller"], stream=True, tokens=20000, user="staller")
    head = "".join(f"{k}: {v}\r\n" for k, v in request["headers"].items())
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{head}Content-Length: "
                 f"{len(request['body'])}\r\n\r\n".encode() + request["body"])
    try:
        until(lambda: starts(events) == ["staller"])  # it has the card, and reads nothing from here on
        began = time.monotonic()
        status, _, raw = post(proxy, "/v1/chat/completions", chat(keys["other"], tokens=2, user="other"), timeout=60)
        waited = time.monotonic() - began
        assert status == 200, raw
        assert waited < 10, f"a stream nobody read held the card {waited:.1f} s"
        assert "client read nothing of its answer for 1 s" in proxy.log_once("CLIENT_WRITE_TIMEOUT")
    finally:
        sock.close()
    print(f"\na stream nobody read gave its seat back {waited:.1f} s after another key asked (CLIENT_WRITE_TIMEOUT=1)")


def completions_frames(pieces: int, choices: int = 1) -> list[bytes]:
    """A /v1/completions stream (or a chat stream of `choices` choices when choices > 1), as vLLM writes it,
    without the usage chunk: what a client that did not ask for usage gets."""
    frames = []
    for i in range(pieces):
        for c in range(choices):
            if choices == 1:
                event = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "foundation",
                         "choices": [{"index": 0, "text": " word", "logprobs": None, "finish_reason": None}]}
            else:
                event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "foundation",
                         "choices": [{"index": c, "delta": {"content": f" w{i}"}, "logprobs": None,
                                      "finish_reason": None}]}
            frames.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    return frames + [b"data: [DONE]\n\n"]


@pytest.mark.parametrize("case, path, body, streamed", [
    # Relayed byte for byte (tool_choice "none": no tools for the proxy to add), usage not asked for.
    ("tool_choice none", "/v1/chat/completions", {"tool_choice": "none", "max_tokens": 30}, 30),
    ("completions", "/v1/completions", {"prompt": "say three words " * 10, "max_tokens": 40}, 40),
    ("n 2", "/v1/chat/completions", {"n": 2, "max_tokens": 25}, 50),
])
def test_a_stream_that_does_not_ask_for_usage_is_charged_every_token_it_carried(team, backend, case, path, body,
                                                                             streamed):
    key = add_key(team.keys_file, "reader")
    proxy = team(backend.url)
    if case == "tool_choice none":
        backend.script(sse_reply(stream_frames(content=[" word"] * streamed, finish_reason="length")))
    else:
        backend.script(sse_reply(completions_frames(streamed // (2 if case == "n 2" else 1),
                                                    2 if case == "n 2" else 1)))
    full = {"model": "foundation", "stream": True, "messages": [{"role": "user", "content": "say three words"}],
            **body}
    raw = json.dumps(full).encode()
    status, _, answer = raw_request(proxy.url, "POST", path, raw, {"Authorization": f"Bearer {key}",
                                                                  "Content-Type": "application/json"})
    assert status == 200 and b'"usage"' not in answer and answer.count(b"data: {") >= streamed
    time.sleep(0.3)
    day = today(proxy, "reader")
    assert day["completion_tokens"] >= streamed, day
    assert day["prompt_tokens"] >= len(raw) // 4, day


def test_a_stream_its_client_hangs_up_on_is_charged_its_prompt_and_what_it_read(team, paced, tmp_path):
    key = add_key(team.keys_file, "quitter")
    proxy = team(paced("--gap", "0.01"))
    sock = socket.create_connection((proxy.url.split("//")[1].split(":")[0], int(proxy.url.rsplit(":", 1)[1])))
    request = chat(key, stream=True, tokens=400, user="quitter")  # asks for usage, which comes at the end
    head = "".join(f"{k}: {v}\r\n" for k, v in request["headers"].items())
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{head}Content-Length: "
                 f"{len(request['body'])}\r\n\r\n".encode() + request["body"])
    got = b""
    sock.settimeout(20)
    while got.count(b'"content":" ') + got.count(b'"content":"') < 21:
        got += sock.recv(4096)
    sock.close()  # read 20 tokens, hang up
    until(lambda: today(proxy, "quitter").get("completion_tokens", 0) > 0, seconds=10)
    day = today(proxy, "quitter")
    assert 20 <= day["completion_tokens"] < 400, day
    assert day["prompt_tokens"] >= len(request["body"]) // 4, day


def overlay_valkey_args(maxmemory: str) -> tuple[str, ...]:
    """The flags compose.scale.yaml gives its Valkey, with a small maxmemory, for a real redis-server."""
    import yaml

    class Overlay(yaml.SafeLoader):  # Compose's !reset and !override tags; the valkey service has neither
        pass
    Overlay.add_multi_constructor("!", lambda _loader, _tag, _node: None)
    command = yaml.load((ROOT / "compose.scale.yaml").read_text(), Overlay)["services"]["valkey"]["command"]
    assert command[0] == "valkey-server"
    return tuple(a.replace("${VALKEY_MAXMEMORY:-512mb}", maxmemory) for a in command[1:])


@pytest.mark.redis
def test_the_overlays_valkey_keeps_the_teams_usage_under_memory_pressure_and_through_a_restart(team, tmp_path):
    keys = {name: add_key(team.keys_file, name, "--tokens-per-day", "1000") for name in ("light", "heavy")}
    with RedisServer(tmp_path / "valkey", args=overlay_valkey_args("8mb")) as server:
        proxy = team(STATE_URL=server.url)
        for name in ("light", "light", "heavy"):
            assert post(proxy, "/v1/chat/completions", chat(keys[name], tokens=5))[0] == 200
        time.sleep(0.3)
        before = today(proxy, "light")
        assert before["requests"] == 2 and before["completion_tokens"] == 10
        # One member's page reads fill the store: the caches' entries, each with its TTL, three times its memory.
        client = server.client()
        for i in range(1500):
            client.set(f"coding-stack:cache:page:{i}", os.urandom(16384), px=300_000)
        assert client.info("stats")["evicted_keys"] > 0
        assert today(proxy, "light") == before, "the store evicted a member's usage"
        time.sleep(1.5)  # the append-only file is flushed every second
        server.stop()
        # While the store is down, the usage page says so in its error shape.
        status, _, raw = raw_request(proxy.url, "GET", "/proxy/usage", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert status == 503 and "usage store" in json.loads(raw)["error"]["message"], raw
        server.start()
        assert today(proxy, "light") == before, "a restart of the store zeroed the day's usage"


@pytest.mark.parametrize("path, extra", [
    ("/v1/chat/completions", {}),                          # the search loop's request, which the proxy writes
    ("/v1/chat/completions", {"tool_choice": "none"}),     # relayed as sent, the salt added at its end
    ("/v1/completions", {"prompt": "say three words"}),
    ("/v1/chat/completions", {"cache_salt": "chosen-by-the-client"}),  # a client cannot pick a salt
])
def test_each_key_gets_a_prefix_cache_salt_of_its_own(team, backend, path, extra):
    keys = {name: add_key(team.keys_file, name) for name in ("alice", "bob")}
    proxy = team(backend.url)
    salts = []
    for who in ("alice", "alice", "bob", "admin"):
        backend.script(json_reply(completion(content="hi")))
        body = {"model": "foundation", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **extra}
        raw = json.dumps(body).encode()
        key = ADMIN_KEY if who == "admin" else keys[who]
        status, _, answer = raw_request(proxy.url, "POST", path, raw, {"Authorization": f"Bearer {key}",
                                                                       "Content-Type": "application/json"})
        assert status == 200, answer
        sent = backend.received[-1]
        if extra.get("tool_choice") == "none":
            assert sent.body.startswith(raw[:-1]), "the relayed body changed before its salt"
        salts.append(sent.json()["cache_salt"])
    assert salts[0] == salts[1] and len({salts[0], salts[2], salts[3]}) == 3, salts
    assert all(re.fullmatch(r"[0-9a-f]{32}", s) for s in salts)


def test_without_a_keys_file_nothing_is_salted(start_proxy, backend):
    proxy = start_proxy(PROXY_API_KEY=ADMIN_KEY)
    backend.script(json_reply(completion(content="hi")))
    status, _, _ = post(proxy, "/v1/chat/completions", chat(ADMIN_KEY))
    assert status == 200 and "cache_salt" not in backend.received[-1].json()


def test_keys_script_keeps_names_apart_ignoring_case_and_writes_through_a_symlink(tmp_path):
    real = tmp_path / "secrets" / "keys.json"
    real.parent.mkdir()
    link = tmp_path / "keys.json"
    link.symlink_to(real)
    add_key(link, "bob")
    proc = keys("add", "Bob", "--file", str(link))
    assert proc.returncode == 1 and "'Bob' already has a key" in proc.stderr, proc.stderr
    assert link.is_symlink() and "bob" in real.read_text(), "the link was replaced by a plain file"
    from proxy.backends.state.keys import parse
    entry = json.loads(real.read_text())["keys"][0]
    with pytest.raises(ValueError, match="appears twice"):
        parse(json.dumps({"version": 1, "keys": [entry, {**entry, "name": "BOB"}]}))


def test_a_state_file_deleted_while_the_proxy_runs_never_splits_the_workers(team, tmp_path):
    import signal
    keys = {"warm": add_key(team.keys_file, "warm"), "limited": add_key(team.keys_file, "limited", "--rpm", "4")}
    proxy = team()
    for _ in range(8):  # both workers have the file open
        assert post(proxy, "/v1/chat/completions", chat(keys["warm"]))[0] == 200
    for path in (tmp_path / "state").glob("state.sqlite3*"):  # the file, its -wal and its -shm
        path.unlink()
    before = set(proxy.workers())
    os.kill(sorted(before)[0], signal.SIGKILL)  # gunicorn starts a worker in its place, which opens the path afresh
    until(lambda: len(set(proxy.workers()) - before) == 1 and len(proxy.workers()) == 2)
    time.sleep(1.0)  # the new worker is serving
    statuses = [post(proxy, "/v1/chat/completions", chat(keys["limited"]))[0] for _ in range(16)]
    assert statuses.count(200) <= 4, statuses  # one view of the key's 4 requests a minute, never one per file
    assert set(statuses) <= {200, 429, 503}, statuses
    assert "was deleted or replaced while the proxy ran: restart the proxy" in proxy.log_once("deleted or replaced")


@pytest.mark.redis
def test_a_request_refused_while_redis_stalled_is_not_counted_and_holds_no_slot(team, tmp_path):
    import signal
    key = add_key(team.keys_file, "stalled", "--concurrent", "1")
    with RedisServer(tmp_path / "redis") as server:
        proxy = team(STATE_URL=server.url)
        assert post(proxy, "/v1/chat/completions", chat(key))[0] == 200
        time.sleep(0.5)  # its usage recorded: nothing of it is left in flight
        os.kill(server.proc.pid, signal.SIGSTOP)  # the store stalls: it takes the request's script and sits on it
        try:
            status, _, raw = post(proxy, "/v1/chat/completions", chat(key), timeout=30)
            assert status == 503, raw  # the client's 5 s socket timeout: the store does not answer
            time.sleep(3)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)  # 8 s later it runs the script after all
        woke = time.monotonic()
        answered = 1
        while (status := post(proxy, "/v1/chat/completions", chat(key))[0]) != 200:
            assert status == 429 and time.monotonic() - woke < 8, "a phantom request holds the key's one slot"
            time.sleep(0.2)
        answered += 1
        time.sleep(0.3)
        assert today(proxy, "stalled")["requests"] == answered, "the request refused with a 503 was counted"
