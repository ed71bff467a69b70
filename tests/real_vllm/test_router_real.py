"""compose.scale.yaml for real: vllm-router 0.1.17 (the PyPI wheel of router/requirements.txt, in a venv of its own
under the test cache, run through router/start-router.sh with the overlay's own flags) in front of two real vLLM CPU
workers of the tiny model, and two real proxy processes sharing one SESSION_ID_SECRET and one store (STATE_URL, a
real redis-server standing in for the overlay's Valkey) in front of it.

- every API the proxy serves answers through the router, streamed and not;
- one agent session's turns land on one worker (each worker's own vLLM counters), and its prefix-cache hits show
  it, against round robin over the same workers in the same run;
- the second worker killed mid-run: every later request on every API still succeeds;
- the Scale-out dashboard's queries, evaluated by a real Prometheus scraping the router and the proxies, show it.

The session's vLLM (conftest's real_vllm) is the first worker; this module starts the second once and stops it by
its pid. Figures go to tests/.work/router-figures.json (docs/operations.md, "Scaling past one card" quotes them, CPU/tiny model).
Run: tests/run.sh tests/real_vllm/test_router_real.py
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from realvllm import (
    MODEL,
    Http,
    Tap,
    cache_dir,
    compose_binary,
    free_port,
    start_server,
    stop_server,
    wait_healthy,
)

from standins import dashboards
from standins.prometheus import PrometheusServer
from standins.redis_server import RedisServer

# The real vLLM workers, and a redis-server as the replicas' shared store (tests/run.sh installs it for the `redis` tier).
pytestmark = [pytest.mark.real_vllm, pytest.mark.redis]

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "router" / "requirements.txt"
WORK = REPO / "tests" / ".work"
FIGURES = WORK / "router-figures.json"
SECRET = "router-test-secret"
NO_THINKING = {"enable_thinking": False}


# ---- the parts ------------------------------------------------------------------------------------------

def router_binary() -> Path:
    """vllm-router from router/requirements.txt (hashes required), in a venv of its own keyed by the lock; built
    once (a file lock keeps two runs from building it at once) and reused."""
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    venv = cache_dir() / f"vllm-router-{key}"
    binary = venv / "bin" / "vllm-router"
    if (venv / ".complete").exists():
        return binary
    with open(cache_dir() / f"vllm-router-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            subprocess.run(["rm", "-rf", str(venv)], check=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            log = venv.with_suffix(".pip.log")
            with open(log, "wb") as out:
                # As router/Dockerfile installs it: the lock alone, no resolver, then pip check.
                pip = subprocess.run(f'"{venv}/bin/pip" install --no-deps --require-hashes -r "{LOCK}" && '
                                     f'"{venv}/bin/pip" check', shell=True,
                                     stdout=out, stderr=subprocess.STDOUT, timeout=900)
            assert pip.returncode == 0, f"installing {LOCK} failed: {log.read_text()[-3000:]}"
            (venv / ".complete").touch()
    return binary


def overlay_router_command() -> list[str]:
    """The router service's command as `docker compose config` resolves compose.scale.yaml."""
    out = subprocess.run([compose_binary(), "--project-directory", str(REPO), "-f", "docker-compose.yaml", "-f",
                          "compose.scale.yaml", "config", "--format", "json"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["services"]["router"]["command"]


class Router:
    """router/start-router.sh with the overlay's flags, then loopback ports and `policy` in place of the image's
    0.0.0.0:8000 (vllm-router, like argparse, takes an option's last value); stopped by its pid."""

    def __init__(self, binary: Path, workers: list[str], policy: str, log_path: Path):
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        args = [*overlay_router_command(), "--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port)]
        env = {"PATH": f"{binary.parent}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/tmp"),
               "VLLM_WORKERS": ",".join(workers)}
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([str(REPO / "router" / "start-router.sh"), *args], env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(120)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, seconds: float):
        """Until /health answers 200: the router starts serving only once every worker answered its health check."""
        deadline = time.monotonic() + seconds
        while True:
            assert self.proc.poll() is None, f"vllm-router exited: {self.log_path.read_text(errors='replace')[-3000:]}"
            try:
                if Http(timeout=2).get(self.url + "/health").status == 200:
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"vllm-router not ready: {self.log_path.read_text(errors='replace')[-3000:]}"
            time.sleep(0.2)

    def metrics(self) -> dict[tuple, float]:
        return samples(Http().get(self.metrics_url).body.decode())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()


def samples(text: str) -> dict[tuple, float]:
    """{(name, sorted labels): value} of a Prometheus text page."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def total(metrics: dict[tuple, float], name: str, **labels) -> float:
    return sum(v for (n, ls), v in metrics.items() if n == name and all((k, w) in ls for k, w in labels.items()))


def worker_counters(url: str) -> dict[str, float]:
    m = samples(Http().get(url + "/metrics").body.decode())
    return {"requests": total(m, "vllm:request_success_total"), "queries": total(m, "vllm:prefix_cache_queries_total"),
            "hits": total(m, "vllm:prefix_cache_hits_total")}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


# ---- the fixture: two workers, two routers (consistent_hash and round robin), two proxies --------------------

@pytest.fixture(scope="module")
def scaled(real_vllm, real_vllm_env, compose_vllm, _proxies, tmp_path_factory):
    work = tmp_path_factory.mktemp("router")
    binary = router_binary()  # meanwhile nothing else runs: the second worker's boot takes the cores
    proc, second = start_server(real_vllm_env, compose_vllm, name="real_vllm-2")
    routers: list[Router] = []
    store = RedisServer(work / "valkey")  # the overlay's valkey: Debian's redis-server speaks the same protocol
    try:
        wait_healthy(proc, second)
        workers = [real_vllm.url, second.url]
        routers.append(Router(binary, workers, "consistent_hash", work / "router-hash.log"))
        routers.append(Router(binary, workers, "round_robin", work / "router-rr.log"))
        hashed, rr = routers
        # Two replicas, as behind HAProxy: the same shared key, told apart only by a setting that changes nothing.
        proxies = [_proxies(BACKEND_URL=hashed.url, SESSION_ID_SECRET=SECRET, STATE_URL=store.url,
                            PROXY_WORKER_CONNECTIONS=str(n)) for n in (1000, 1001)]
        rr_proxy = _proxies(BACKEND_URL=rr.url, SESSION_ID_SECRET=SECRET)
        yield types_ns(workers=workers, second=second, second_proc=proc, hashed=hashed, rr=rr,
                       proxies=[p.url for p in proxies], rr_proxy=rr_proxy.url, work=work, store=store)
    finally:
        for r in routers:
            r.stop()
        stop_server(proc)
        store.stop()


def types_ns(**kw) -> SimpleNamespace:
    return SimpleNamespace(**kw)


def record(**figures):
    """Adds measured figures to tests/.work/router-figures.json (read for docs/operations.md)."""
    WORK.mkdir(parents=True, exist_ok=True)
    old = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    FIGURES.write_text(json.dumps({**old, **figures}, indent=2, sort_keys=True))


# ---- every API through the router -------------------------------------------------------------------------

def calls(session: str) -> list[tuple[str, str, str, dict | None, dict]]:
    """(name, method, path, body, headers) of one request per API the proxy serves, streamed and not, all of one
    agent session (Claude Code's header, as it sends it)."""
    h = {"X-Claude-Code-Session-Id": session}
    ask = [{"role": "user", "content": "Say something."}]
    chat = {"model": MODEL, "messages": ask, "max_tokens": 4, "chat_template_kwargs": NO_THINKING}
    messages = {"model": MODEL, "max_tokens": 4, "messages": ask, "chat_template_kwargs": NO_THINKING}
    responses = {"model": MODEL, "input": "Say something.", "max_output_tokens": 4, "chat_template_kwargs": NO_THINKING}
    alpha = {"id": session, "model": MODEL, "commands": {"search_query": [{"q": "vllm router"}]},
             "settings": {"allowed_callers": ["direct"], "external_web_access": True}}
    return [
        ("chat", "POST", "/v1/chat/completions", chat, h),
        ("chat-stream", "POST", "/v1/chat/completions", {**chat, "stream": True}, h),
        ("messages", "POST", "/v1/messages", messages, h),
        ("messages-stream", "POST", "/v1/messages", {**messages, "stream": True}, h),
        ("count_tokens", "POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": ask}, h),
        ("responses", "POST", "/v1/responses", responses, h),
        ("responses-stream", "POST", "/v1/responses", {**responses, "stream": True}, h),
        ("alpha", "POST", "/v1/alpha/search", alpha, h),
        ("models", "GET", "/v1/models", None, h),
        ("passthrough", "POST", "/v1/completions", {"model": MODEL, "prompt": "Say", "max_tokens": 2}, h),
    ]


def check(name: str, reply) -> None:
    """The answer is a whole one of its API: 200, and a stream that ended as its API ends one."""
    assert reply.status == 200, (name, reply.status, reply.body[:400])
    body = reply.body
    if name == "chat-stream":
        assert body.rstrip().endswith(b"data: [DONE]"), body[-300:]
    elif name == "messages-stream":
        assert b"event: message_stop" in body, body[-300:]
    elif name == "responses-stream":
        assert b"response.completed" in body, body[-300:]
    elif name == "models":
        assert json.loads(body)["data"][0]["id"] == MODEL
    elif name == "count_tokens":
        assert json.loads(body)["input_tokens"] > 0
    elif name == "alpha":
        assert json.loads(body)
    else:
        assert json.loads(body)


def send(proxy_url: str, method: str, path: str, body, headers) -> object:
    http = Http(timeout=120)
    if method == "GET":
        return http.get(proxy_url + path, headers=headers)
    return http.post(proxy_url + path, body, headers=headers)


def test_every_api_answers_through_the_router(scaled, searxng):
    before = scaled.hashed.metrics()
    for i, (name, method, path, body, headers) in enumerate(calls("every-api")):
        check(name, send(scaled.proxies[i % 2], method, path, body, headers))
    after = scaled.hashed.metrics()
    routed = {dict(ls)["route"]: after[(n, ls)] - before.get((n, ls), 0)
              for (n, ls) in after if n == "vllm_router_requests_total"}
    # The router, not a shortcut, carried them: each route the proxy called it on counted them.
    for route in ("/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
                  "/v1/completions"):
        assert routed.get(route, 0) >= 1, (route, routed)
    # One agent session, one worker: every decision of this test went to the same one.
    decided = {dict(ls)["worker"] for (n, ls), v in after.items()
               if n == "vllm_router_policy_decisions_total" and v > before.get((n, ls), 0)}
    assert len(decided) == 1, decided


# ---- session affinity, measured by the workers' own prefix caches --------------------------------------------

def conversation(seed: int, turns: int) -> list[list[dict]]:
    """The messages of each turn of one agent-like session: a long system prompt (the bulk of every prompt, as an
    agent's is), then a growing exchange; each turn resends all of it."""
    rng = random.Random(seed)
    words = ["router", "worker", "cache", "prefix", "session", "token", "agent", "stream", "model", "card"]
    system = {"role": "system", "content": f"Session {seed}. " + " ".join(rng.choice(words) for _ in range(250))}
    history = [system]
    out = []
    for t in range(turns):
        history = history + [{"role": "user", "content": f"Step {t}: " + " ".join(rng.choice(words) for _ in range(20))}]
        out.append(list(history))
        history = history + [{"role": "assistant", "content": "ok"}]
    return out


def run_sessions(proxy_urls: list[str], workers: list[str], sessions: int, turns: int, seed: int) -> dict:
    """Each session's turns in order, alternating over the proxies; per session, the requests each worker served;
    and the prefix-cache hit rate over all of it (vLLM's own counters, both workers summed). Sessions of their own
    (`seed`): no other run's prompts are in the caches."""
    start = [worker_counters(w) for w in workers]
    spread, took = [], []
    for s in range(sessions):
        before = [worker_counters(w) for w in workers]
        for t, messages in enumerate(conversation(seed + s, turns)):
            body = {"model": MODEL, "messages": messages, "max_tokens": 1, "chat_template_kwargs": NO_THINKING,
                    "tool_choice": "none"}
            began = time.monotonic()
            reply = Http(timeout=120).post(proxy_urls[t % len(proxy_urls)] + "/v1/chat/completions", body)
            took.append(time.monotonic() - began)
            assert reply.status == 200, reply.body[:300]
        spread.append([delta(b, worker_counters(w))["requests"] for b, w in zip(before, workers, strict=True)])
    change = [delta(b, worker_counters(w)) for b, w in zip(start, workers, strict=True)]
    queries, hits = sum(c["queries"] for c in change), sum(c["hits"] for c in change)
    return {"spread": spread, "hit_rate": hits / queries, "queries": queries, "hits": hits,
            "mean_seconds": sum(took) / len(took)}


def test_a_sessions_turns_stay_on_one_worker_and_hit_its_prefix_cache(scaled):
    sessions, turns = 4, 3
    hashed = run_sessions(scaled.proxies, scaled.workers, sessions, turns, seed=1000)
    rr = run_sessions([scaled.rr_proxy], scaled.workers, sessions, turns, seed=2000)
    record(affinity={"sessions": sessions, "turns": turns, "system_prompt_words": 250,
                     "consistent_hash": hashed, "round_robin": rr})
    # Consistent hashing on X-Session-ID: every turn of each session on one worker, whichever proxy sent it.
    assert all(sorted(s) == [0, turns] for s in hashed["spread"]), hashed["spread"]
    # Round robin over the same workers: sessions split across both.
    assert any(0 < s[0] < turns for s in rr["spread"]), rr["spread"]
    # And the cache shows it: most of each later turn is found in the worker's prefix cache.
    assert hashed["hit_rate"] > 1.5 * rr["hit_rate"], (hashed, rr)


# ---- twelve agent sessions, as their agents send them ------------------------------------------------------------

WIRE = Path(__file__).resolve().parents[1] / "data" / "agent-wire"
DROPPED_HEADERS = {"host", "content-length", "content-type", "authorization", "x-api-key", "accept-encoding", "connection"}


def captured(name: str) -> tuple[dict, dict]:
    """The first request of a captured agent run: (its headers, less what the test's own client sets, and body)."""
    first = json.loads((WIRE / name).read_text())[0]
    return {k: v for k, v in first["headers"] if k.lower() not in DROPPED_HEADERS}, first["body"]


def agent_sessions() -> list[tuple[str, str, list[tuple[dict, dict]]]]:
    """(kind, path, [(headers, body) per turn]) for four sessions each of Claude Code, Codex and plain chat, three
    turns each. Claude Code's and Codex's keep their captured headers with a session id of their own, and every
    session of one agent has the same body (the same folder, the same first message: Codex's <environment_context>,
    which once made all of a machine's Codex sessions one); the bulky system prompt and tool list are left out for
    the test model's 4,096-token context. Plain chat sends no session header: its conversations differ."""
    out = []
    cc_headers, cc_body = captured("claude-code-2.1.332-websearch.json")
    cx_headers, cx_body = captured("codex-0.171.0-websearch.json")
    reminder = cc_body["messages"][0]["content"][0]["text"]
    context = [i for i in cx_body["input"] if i.get("role") == "user"]
    for n in range(4):
        sid = str(uuid.uuid4())
        turns, messages = [], []
        for t in range(3):
            messages = messages + [{"role": "user", "content": [{"type": "text", "text": reminder if t == 0 else
                                                                  f"Step {t}: go on."}]}]
            turns.append(({**cc_headers, "X-Claude-Code-Session-Id": sid},
                          {"model": MODEL, "max_tokens": 1, "stream": True, "messages": messages,
                           "metadata": cc_body.get("metadata"), "chat_template_kwargs": NO_THINKING}))
            messages = messages + [{"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
        out.append(("claude-code", "/v1/messages?beta=true", turns))
        sid = str(uuid.uuid4())
        codex = {**cx_headers, "session-id": sid, "thread-id": sid, "x-client-request-id": sid,
                 "x-codex-window-id": f"{sid}:0"}
        codex.pop("x-codex-turn-metadata", None)
        turns, items = [], list(context)
        for t in range(3):
            body = {"model": MODEL, "stream": True, "input": items, "store": False, "prompt_cache_key": sid,
                    "max_output_tokens": 1, "chat_template_kwargs": NO_THINKING}
            turns.append((codex, body))
            items = items + [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                             {"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": f"Step {t + 1}: go on."}]}]
        out.append(("codex", "/v1/responses", turns))
        turns = [({}, {"model": MODEL, "max_tokens": 1, "chat_template_kwargs": NO_THINKING, "messages": m})
                 for m in conversation(3000 + n, 3)]
        out.append(("chat", "/v1/chat/completions", turns))
    return out


def test_twelve_agent_sessions_get_twelve_session_ids_each_on_one_worker(scaled, _proxies):
    """Issue 50's check: Claude Code, Codex and plain chat sessions (four each, their agents' captured wire) through
    two replicas that share one store and no SESSION_ID_SECRET, behind the consistent-hash router: one X-Session-ID
    per session, twelve different ones, every turn of a session on one worker."""
    tap = Tap(scaled.hashed.url)
    try:
        replicas = [_proxies(BACKEND_URL=tap.url, STATE_URL=scaled.store.url, PROXY_WORKERS="2",
                             PROXY_WORKER_CONNECTIONS=str(n)) for n in (1002, 1003)]
        ids, spread = {}, {}
        for s, (kind, path, turns) in enumerate(agent_sessions()):
            before = [worker_counters(w) for w in scaled.workers]
            sent = len(tap.headers)
            for t, (headers, body) in enumerate(turns):
                reply = send(replicas[t % 2].url, "POST", path, body, headers)
                assert reply.status == 200, (kind, t, reply.body[:300])
            ids[(kind, s)] = {h.get("x-session-id") for h in tap.headers[sent:]}
            spread[(kind, s)] = sorted(delta(b, worker_counters(w))["requests"]
                                       for b, w in zip(before, scaled.workers, strict=True))
    finally:
        tap.close()
    assert all(len(v) == 1 and None not in v for v in ids.values()), ids
    assert len({v for found in ids.values() for v in found}) == 12, ids
    assert all(s == [0, 3] for s in spread.values()), spread


# ---- a worker lost mid-run --------------------------------------------------------------------------------------

def session_on(proxy_url: str, router: Router, worker: str) -> str:
    """A Claude Code session id the router hashes to `worker`: cheap count_tokens probes until one lands there."""
    for i in range(40):
        session = f"probe-{i}"
        before = total(router.metrics(), "vllm_router_processed_requests_total", worker=worker)
        reply = send(proxy_url, "POST", "/v1/messages/count_tokens",
                     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                     {"X-Claude-Code-Session-Id": session})
        assert reply.status == 200, reply.body[:300]
        if total(router.metrics(), "vllm_router_processed_requests_total", worker=worker) > before:
            return session
    raise AssertionError(f"no session of 40 hashed to {worker}")


def test_a_worker_killed_mid_run_costs_no_later_request(scaled, searxng):
    """The second worker's whole process group gets SIGKILL (a card gone, a host powered off); then every API, for
    sessions spread over both workers' share of the hash ring, must answer. The first request after it is a
    Messages one of a session on the lost worker: the router does not retry that route, so the proxy's one retry is
    what carries it."""
    doomed = session_on(scaled.proxies[0], scaled.hashed, scaled.second.url)
    retries_before = sum(total(samples(Http().get(p + "/proxy/metrics").body.decode()), "proxy_backend_retries_total")
                         for p in scaled.proxies)
    os.killpg(scaled.second_proc.pid, signal.SIGKILL)
    scaled.second_proc.wait(timeout=30)
    killed_at = time.monotonic()
    # Through the hashing router: the doomed session's Messages request, then every API for sessions all over the
    # ring. Through the round-robin router, which has not noticed yet either: two chats, one of which it sends to the
    # lost worker and retries itself (chat is a route it retries).
    first = [(scaled.proxies[0], c) for c in calls(doomed) if c[0] == "messages"]
    later = [(scaled.proxies[i % 2], c) for i, c in enumerate(
        c for session in range(6) for c in calls(f"after-kill-{session}"))]
    round_robin = [(scaled.rr_proxy, c) for c in calls("round-robin-after-kill")[:1] * 2]
    failures, n = [], 0
    for proxy_url, (name, method, path, body, headers) in first + round_robin + later:
        reply = send(proxy_url, method, path, body, headers)
        n += 1
        try:
            check(name, reply)
        except AssertionError as e:
            failures.append((n, name, str(e)[:300]))
    took = time.monotonic() - killed_at
    assert not failures, failures
    after = scaled.hashed.metrics()
    dead = scaled.second.url
    # The router saw the worker go: its circuit opened.
    opened = total(after, "vllm_router_cb_state_transitions_total", worker=dead, to="open")
    assert opened >= 1
    retries = sum(total(samples(Http().get(p + "/proxy/metrics").body.decode()), "proxy_backend_retries_total")
                  for p in scaled.proxies) - retries_before
    assert retries >= 1  # the Messages request above: the router's 502, then the proxy's retry on a live worker
    router_retries = total(scaled.rr.metrics(), "vllm_router_retries_total")
    assert router_retries >= 1  # the round-robin router's chat to the lost worker, carried by its own retry
    record(failover={"requests_after_kill": n, "failed": len(failures), "seconds": round(took, 1),
                     "proxy_retries": retries, "router_retries": router_retries, "circuit_opened": opened})


# ---- the Scale-out dashboard against a real Prometheus scraping the router ----------------------------------

def scale_prometheus_config(workdir: Path, targets: dict[str, list[str]]) -> Path:
    """monitoring/prometheus.scale.yml with each job's targets swapped for this machine's (no DNS here)."""
    config = yaml.safe_load((REPO / "monitoring" / "prometheus.scale.yml").read_text())
    # Often enough for a short test; vLLM's /metrics answers within the timeout (the interval) even under load.
    config["global"]["scrape_interval"] = "2s"
    jobs = []
    for job in config["scrape_configs"]:
        if job["job_name"] not in targets:
            continue  # HAProxy: not run here
        job.pop("dns_sd_configs", None)
        job.pop("authorization", None)  # the test's proxies have no key
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        jobs.append(job)
    config["scrape_configs"] = jobs
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_scraped(prom: PrometheusServer, jobs: int, live: int, seconds: float = 90) -> None:
    """Until every job has targets and `live` of them answered a scrape since now (the lost worker stays down)."""
    since = time.time()
    deadline = time.monotonic() + seconds
    while True:
        targets = prom.targets()
        fresh = [t for t in targets if t["health"] == "up" and parse_stamp(t["lastScrape"]) > since]
        if len({t["labels"]["job"] for t in targets}) >= jobs and len(fresh) >= live:
            return
        assert time.monotonic() < deadline, targets
        time.sleep(0.5)


def parse_stamp(stamp: str) -> float:
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")).timestamp()


def router_queries() -> list:
    return [q for q in dashboards.queries() if q.dashboard in dashboards.ROUTER_DASHBOARDS]


def test_the_scale_out_dashboard_shows_the_router_and_the_lost_worker(scaled):
    netloc = lambda url: urllib.parse.urlsplit(url).netloc  # noqa: E731
    config = scale_prometheus_config(scaled.work, {
        "vllm": [netloc(w) for w in scaled.workers],
        "coding-stack-proxy": [netloc(p) for p in scaled.proxies],
        # Both routers (the compose stack runs one): the round-robin one is where the router's own retries were.
        "vllm-router": [netloc(scaled.hashed.metrics_url), netloc(scaled.rr.metrics_url)]})
    prom = PrometheusServer(config, scaled.work)
    try:
        # A little traffic between scrapes, so every rate() has two samples of each series.
        for round_ in range(3):
            for name, method, path, body, headers in calls(f"dashboard-{round_}")[:3]:
                check(name, send(scaled.proxies[0], method, path, body, headers))
            wait_scraped(prom, jobs=3, live=len(scaled.workers) - 1 + len(scaled.proxies) + 2)
        queries = router_queries()
        assert len(queries) >= 6
        empty = []
        for q in queries:
            answer = prom.query(q.promql)
            assert answer["status"] == "success", (q.panel, answer)
            values = [r["value"][1] for r in answer["data"]["result"]]
            if not values or set(values) == {"NaN"}:
                empty.append((q.panel, q.promql))
        assert not empty, empty
        # And every router series a panel reads is one the real router exposes (a misspelled name shows nothing).
        read = {m for q in queries for m in q.metrics if m.startswith("vllm_router_")}
        exposed = {name for name, _ in [*scaled.hashed.metrics(), *scaled.rr.metrics()]}
        assert read and read <= exposed, sorted(read - exposed)
    finally:
        prom.stop()


# ---- HAProxy's configuration, checked by the real HAProxy (Debian's, which tests/run.sh installs) ----------------

def haproxy_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)


def test_haproxy_accepts_the_overlays_config():
    result = haproxy_check(REPO / "haproxy" / "haproxy.cfg")
    assert result.returncode == 0 and "Configuration file is valid" in result.stdout + result.stderr, result


def test_haproxy_refuses_a_broken_config(tmp_path):
    # Proves the check above can fail: the same file with its balancing algorithm misspelled.
    broken = tmp_path / "haproxy.cfg"
    broken.write_text((REPO / "haproxy" / "haproxy.cfg").read_text().replace("balance leastconn", "balance leastconns"))
    assert haproxy_check(broken).returncode != 0
