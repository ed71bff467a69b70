"""The monitoring profile's Prometheus config and dashboards against the real things: Debian's promtool checks
monitoring/prometheus.yml, Debian's Prometheus scrapes a real proxy (with its key, from a file) and the real vLLM of
this tier with that config's jobs, and every query of every dashboard panel is evaluated over Prometheus' HTTP API
after a little traffic. Run: tests/run.sh tests/real_vllm/test_monitoring_real.py

Only what cannot be the same here differs from the file the profile mounts: each job's target (loopback ports
instead of service names), the key file's path, and a 1 s scrape interval so the test's traffic spans many scrapes.
"""
from __future__ import annotations

import concurrent.futures
import json
import re
import socket
import subprocess
import sys
import time
import urllib.parse
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from realvllm import Http, Tap, chat, forced_call_request

from standins import dashboards
from standins.prometheus import PrometheusServer, binary
from standins.web_pages import WebSite

pytestmark = pytest.mark.real_vllm

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "monitoring" / "prometheus.yml"
CHAT = "/v1/chat/completions"
KEY = "monitoring-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PAGE = "<html><head><title>Notes</title></head><body><article><p>" + "Plain words here. " * 20 + "</p></article></body></html>"
EMPTY_QUERY = "nothing at all"
PARTIAL_QUERY = "some engines failing"
ANSWER = "Done."


def local_config(workdir: Path, targets: dict[str, str], key_file: Path, scrape_interval: str | None = "1s") -> Path:
    """The repository's config with each job's target and the key file's path swapped for this machine's."""
    config = yaml.safe_load(CONFIG.read_text())
    if scrape_interval:
        config["global"]["scrape_interval"] = scrape_interval
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(key_file)
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], capture_output=True, text=True, timeout=60)


# ---- promtool -----------------------------------------------------------------------------------------

def test_promtool_accepts_the_profiles_config(tmp_path):
    key = tmp_path / "proxy-api-key"
    key.write_text(KEY)  # promtool checks that the key file exists; in the container the entrypoint writes it
    config = local_config(tmp_path, {"vllm": "vllm:8000", "coding-stack-proxy": "proxy:11433"}, key, scrape_interval=None)
    result = promtool("check", "config", str(config))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_the_prometheus_here_is_the_release_run_sh_pins():
    pin = re.search(r'^PROMETHEUS_PACKAGE="prometheus=([^"+~-]+)', (REPO / "tests" / "run.sh").read_text(), re.M)[1]
    for name in ("prometheus", "promtool"):
        out = subprocess.run([binary(name), "--version"], capture_output=True, text=True, timeout=60)
        assert f"version {pin}" in out.stdout + out.stderr, (name, out.stdout + out.stderr)


def test_promtool_refuses_a_broken_config(tmp_path):
    broken = tmp_path / "prometheus.yml"
    broken.write_text(CONFIG.read_text().replace("metrics_path:", "metric_path:"))
    assert promtool("check", "config", str(broken)).returncode != 0


# ---- Prometheus scraping the proxy and vLLM --------------------------------------------------------------

def forced(real_vllm, function: str, parameter: str, value: str, said: str | None = None) -> dict:
    """A chat request whose first turn is the model calling the proxy's `function` with `parameter`=`value`
    (the tool-call grammar of realvllm.forced_call_request, for any tool and argument); `said` is what the user's
    message adds (a page's URL, which web_fetch reads only when the conversation gave it)."""
    call = (f"<tool_call>\n<function={function}>\n<parameter={parameter}>\n{value}\n</parameter>\n</function>\n"
            "</tool_call>")
    body = forced_call_request(real_vllm)
    body["structured_outputs"] = {"regex": re.escape(call)}
    body["max_tokens"] = len(call) + 16  # as forced_call_request's: a call cut by max_tokens is no call
    del body["tools"]  # the client sends none: the call is to the tool the proxy adds
    if said:
        body["messages"] = [{"role": "user", "content": f"Say something about {said}"}]
    return body


def answer_once_a_tool_answered(body: dict) -> dict | None:
    """The Tap's rewrite: after a tool result the random model is held to a short answer, so each request is
    one tool round and one answer."""
    if not any(m.get("role") == "tool" for m in body.get("messages", [])):
        return None
    return {**body, "structured_outputs": {"regex": re.escape(ANSWER)}, "logit_bias": None}


def scraped_since(prom: PrometheusServer, since: float) -> list[dict]:
    """The targets that are down or not scraped since `since` (epoch seconds); empty when all are."""
    late = []
    for target in prom.targets():
        stamp = re.sub(r"(\.\d{6})\d*", r"\1", target["lastScrape"]).replace("Z", "+00:00")
        if target["health"] != "up" or datetime.fromisoformat(stamp).timestamp() <= since:
            late.append(target)
    return late


def wait_for_scrapes(prom: PrometheusServer, jobs: int, since: float, seconds: float = 90) -> None:
    # Prometheus hands new targets to its scrapers at most every 5 s, then scrapes each once a second.
    deadline = time.monotonic() + seconds
    while len(prom.targets()) < jobs or scraped_since(prom, since):
        assert time.monotonic() < deadline, f"not scraped: {scraped_since(prom, since) or prom.targets()}"
        time.sleep(0.5)


def leave_mid_answer(proxy_url: str) -> None:
    """A client that sends a long streamed chat and hangs up without reading it."""
    parts = urllib.parse.urlsplit(proxy_url)
    body = json.dumps(chat(max_tokens=300, ignore_eos=True, stream=True,
                           chat_template_kwargs={"enable_thinking": False})).encode()
    with socket.create_connection((parts.hostname, parts.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def add_key(path: Path, name: str, *limits: str) -> str:
    """A person's key, made the way users make one (scripts/keys.py prints it alone on a line)."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "keys.py"), "add", name, *limits, "--file", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def people_traffic(http: Http, proxy_url: str, alice: str, capped: str) -> None:
    """Tokens and time queued for alice (two answers at once on one seat: one waits), and a 429 for capped (a
    second request inside its one-a-minute limit): what the People row's panels read."""
    body = chat(chat_template_kwargs={"enable_thinking": False})
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda _: http.post(proxy_url + CHAT, body, headers={"Authorization": f"Bearer {alice}"}),
                                range(2)))
    assert [r.status for r in replies] == [200, 200], [r.body[:300] for r in replies]
    statuses = [http.post(proxy_url + CHAT, body, headers={"Authorization": f"Bearer {capped}"}).status for _ in range(2)]
    assert 429 in statuses, statuses


def last_answer(tap: Tap) -> str:
    """vLLM's last answer as the proxy received it (its finish_reason tells a cut call from a refused one)."""
    return tap.exchanges[-1][3][-1500:].decode(errors="replace") if tap.exchanges else ""


def proxy_sample(http: Http, proxy_url: str, name: str) -> float:
    text = http.get(proxy_url + "/proxy/metrics", headers=AUTH).body.decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.fixture(scope="module")
def monitored(real_vllm, _proxies, _searxng_server, tmp_path_factory):
    """(Prometheus, the proxy's url, seconds the traffic took) once Prometheus has scraped the proxy and vLLM
    during and after a little traffic of every kind the dashboards count."""
    work = tmp_path_factory.mktemp("prometheus")
    site = WebSite()
    site.route("/notes1", PAGE)
    site.route("/notes2", PAGE)
    tap = Tap(real_vllm.url, outgoing=answer_once_a_tool_answered)
    http = Http(timeout=120)
    prom = None
    try:
        # Two people beside the admin key, and a fair queue of one seat (as the stack runs it), for the People row:
        # alice's two requests at once make one of them wait its turn; capped's second in a minute is refused.
        keys_file = work / "keys.json"
        alice, capped = add_key(keys_file, "alice"), add_key(keys_file, "capped", "--rpm", "1")
        proxy = _proxies(BACKEND_URL=tap.url, PROXY_API_KEY=KEY, SEARCH_CACHE_TTL="600",
                         WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8", PROXY_KEYS_FILE=keys_file, MAX_NUM_SEQS="1")
        key_file = work / "proxy-api-key"
        key_file.write_text(KEY)
        targets = {"vllm": urllib.parse.urlsplit(real_vllm.url).netloc,
                   "coding-stack-proxy": urllib.parse.urlsplit(proxy.url).netloc}
        prom = PrometheusServer(local_config(work, targets, key_file), work)
        wait_for_scrapes(prom, len(targets), since=time.time())  # the series exist before the traffic moves them

        started = time.monotonic()
        _searxng_server.behave(EMPTY_QUERY, "empty")
        for round_ in (1, 2):  # results from some engines only: the engine-failures panel's traffic, one per round
            _searxng_server.behave(f"{PARTIAL_QUERY} {round_}", "results", unresponsive=[("duckduckgo", "CAPTCHA")])
        # Twice, with a scrape between: the proxy's labelled series appear at their first use, so the second
        # round is what moves them from one sample to the next (a rate above 0, a percentile that is a number).
        for round_ in (1, 2):
            requests = [
                forced(real_vllm, "web_search", "query", "hello"),
                forced(real_vllm, "web_search", "query", "hello"),  # the search cache's hit, in both rounds
                forced(real_vllm, "web_search", "query", EMPTY_QUERY),  # an empty answer is never cached
                forced(real_vllm, "web_search", "query", f"{PARTIAL_QUERY} {round_}"),  # an engine failing
                forced(real_vllm, "web_fetch", "url", f"http://127.0.0.1:{site.port}/notes{round_}",
                       said=f"http://127.0.0.1:{site.port}/notes{round_}"),
                forced(real_vllm, "web_fetch", "url", "ftp://files.example/notes"),  # refused: not http(s)
                # Refused by URL provenance: the model built it (docs/web-tools.md, Security).
                forced(real_vllm, "web_fetch", "url", f"http://127.0.0.1:{site.port}/notes{round_}?k=built"),
            ]
            for i, body in enumerate(requests):
                reply = http.post(proxy.url + CHAT, body, headers=AUTH)
                assert reply.status == 200, (round_, i, reply.body[:500])
            # The premise of the Refused fetches panel, read from the proxy itself: in a CI run the random model
            # once spelled the forced call out in more tokens than max_tokens allowed, the cut call was (rightly)
            # dropped, and Prometheus had no refusal to show.
            deadline = time.monotonic() + 30
            while proxy_sample(http, proxy.url, "proxy_url_refusals_total") < round_:
                assert time.monotonic() < deadline, ("the built URL was not refused by provenance", round_,
                                                     last_answer(tap))
                time.sleep(0.2)
            reply = http.post(proxy.url + CHAT, chat(stream=True, chat_template_kwargs={"enable_thinking": False}),
                              headers=AUTH)
            assert reply.status == 200 and reply.body.rstrip().endswith(b"data: [DONE]")
            people_traffic(http, proxy.url, alice, capped)
            leave_mid_answer(proxy.url)
            deadline = time.monotonic() + 60
            while proxy_sample(http, proxy.url, "proxy_client_disconnects_total") < round_:
                assert time.monotonic() < deadline, "the proxy never counted the client that left"
                time.sleep(0.2)
            if round_ == 1:
                wait_for_scrapes(prom, len(targets), since=time.time())
        took = time.monotonic() - started
        # Two scrapes after the last request: rate() needs two samples of a series, and the last ones to appear
        # (the disconnect's) have none before.
        for _ in range(2):
            wait_for_scrapes(prom, len(targets), since=time.time())
        yield prom, proxy.url, took
    finally:
        if prom is not None:
            prom.stop()
        tap.close()
        site.close()
        _searxng_server.reset()


def test_prometheus_scrapes_both_jobs_and_the_proxy_only_with_its_key(monitored):
    prom, proxy_url, _ = monitored
    ups = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")["data"]["result"]}
    assert ups == {"vllm": "1", "coding-stack-proxy": "1"}
    # Up only because the key file's key was sent: without one the proxy refuses the scrape.
    assert Http().get(proxy_url + "/proxy/metrics").status == 401


def test_every_vllm_series_a_panel_reads_is_one_the_real_vllm_exposes(real_vllm):
    exposed = {s.name for f in text_string_to_metric_families(Http().get(real_vllm.url + "/metrics").body.decode())
               for s in f.samples}
    read = {m for q in dashboards.queries() for m in q.metrics if m.startswith("vllm:")}
    assert read and read <= exposed, sorted(read - exposed)


@pytest.mark.parametrize("query", [q for q in dashboards.queries() if q.dashboard not in dashboards.ROUTER_DASHBOARDS],
                         ids=lambda q: f"{q.dashboard}:{q.panel}:{q.ref_id}")
def test_every_panel_query_evaluates_and_shows_the_traffic(monitored, query):
    prom, _, _ = monitored
    answer = prom.query(query.promql)
    assert answer["status"] == "success", answer
    if query.metrics & dashboards.PENDING:
        return  # its counter lands with the search-health work: an empty answer is right until then
    values = [r["value"][1] for r in answer["data"]["result"]]
    # Data, and a number among it: a percentile of series that did not move is NaN, a query on a misspelled
    # series is no data at all.
    assert values and set(values) != {"NaN"}, f"{values} for {query.promql}"
