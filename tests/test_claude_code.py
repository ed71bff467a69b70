"""End to end with the real Claude Code (npm @anthropic-ai/claude-code 2.1.332, installed by
tests/run.sh into $AGENTS_BIN): `claude -p` against the proxy, a stand-in model that answers
each request by its shape, and the SearXNG stand-in; Claude Code's WebSearch must really search,
and its WebFetch (with `skipWebFetchPreflight`) must fetch a loopback page and have the local
model summarise it through /v1/messages.

Run: tests/run.sh tests/test_claude_code.py -q
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from standins import anthropic_wire as W
from standins.scripted_backend import Reply
from standins.web_pages import WebSite

pytestmark = pytest.mark.agents

SAMPLES = Path(__file__).parent / "data" / "vllm-0.32-samples"
QUERY = "vllm 0.32 release notes"
ANSWER = "vLLM 0.32 is out; see the release notes."
SUMMARY = "The results say vLLM 0.32 shipped."
RUN_TIMEOUT = 120  # seconds; a run takes a few, and a hang must fail the test, not the suite


def claude_env(proxy_url: str, home: str) -> dict:
    """Claude Code talking to the proxy and nothing else: every non-essential call off, and
    an unreachable loopback proxy for anything that would still leave the machine."""
    return {"PATH": os.environ["PATH"], "HOME": home, "TMPDIR": home,
            "ANTHROPIC_BASE_URL": proxy_url, "ANTHROPIC_API_KEY": "dummy-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_BUG_COMMAND": "1",
            "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
            "NO_PROXY": "127.0.0.1,localhost"}


class StandInModel:
    """Answers Claude Code's requests by their shape, as agent-apis.md describes them."""

    def __init__(self):
        self.shapes: list[str] = []

    def __call__(self, r):
        if r.path == "/v1/models":
            return Reply(body=(SAMPLES / "models.json").read_bytes())
        body = r.json()
        if r.path.endswith("/count_tokens"):
            self.shapes.append("count_tokens")
            return Reply(body=b'{"input_tokens":42}')
        shape, blocks = self.answer(body)
        self.shapes.append(shape)
        return W.stream_reply(blocks) if body.get("stream") else W.message_reply(blocks)

    def answer(self, body):
        tools = [t.get("name") for t in body.get("tools") or []]
        msgs = body.get("messages") or []
        first_user = json.dumps(msgs[0].get("content")) if msgs else ""
        last = json.dumps(msgs[-1].get("content")) if msgs else ""
        if tools == ["web_search"] and "Perform a web search for the query:" in first_user:
            if '"tool_result"' in last:
                return "subrequest-summary", [W.text(SUMMARY)]
            return "subrequest-call", [W.tool_use("web_search", {"query": QUERY})]
        previous = json.dumps(msgs[-2].get("content")) if len(msgs) > 1 else ""
        if "WebSearch" in tools:
            if '"WebSearch"' in previous and '"tool_result"' in last:
                return "final", [W.text(ANSWER)]
            return "call-websearch", [W.tool_use("WebSearch", {"query": QUERY})]
        if "ToolSearch" in tools:
            return "load-websearch", [W.tool_use("ToolSearch", {"query": "select:WebSearch", "max_results": 1})]
        return "background", [W.text("ok")]


def run_claude(proxy_url: str, prompt: str, extra_env: dict | None = None, allowed: str = "WebSearch",
               args: tuple = (), home: str | None = None, cwd: str | None = None) -> list[dict]:
    claude = os.environ.get("AGENTS_BIN")
    if not claude:
        pytest.skip("AGENTS_BIN is unset: run the suite with tests/run.sh, which installs Claude Code")
    own_home = home is None
    home = home or tempfile.mkdtemp(prefix="claude-home-")
    try:
        return _run_claude_in(claude, home, proxy_url, prompt, extra_env, allowed, args, cwd)
    finally:
        if own_home:
            shutil.rmtree(home, ignore_errors=True)  # its settings, sessions and caches: nothing to keep


def _run_claude_in(claude: str, home: str, proxy_url: str, prompt: str, extra_env: dict | None, allowed: str,
                   args: tuple, cwd: str | None) -> list[dict]:
    proc = subprocess.Popen([claude + "/claude", "-p", prompt, "--output-format", "stream-json", "--verbose",
                             "--allowedTools", allowed, *args],
                            env={**claude_env(proxy_url, home), **(extra_env or {})}, cwd=cwd or home, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"claude -p did not finish within {RUN_TIMEOUT} s:\n{out[-3000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, f"claude exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    return [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]


def search_tool_result(lines) -> dict:
    (hit,) = [ln["tool_use_result"] for ln in lines if ln.get("type") == "user"
              and isinstance(ln.get("tool_use_result"), dict) and "searchCount" in ln["tool_use_result"]]
    return hit


# Two ways to make Claude Code's `claude-...` model names reach vLLM as the served model.
MODEL_NAMES = {
    "client-env": ({}, {"ANTHROPIC_MODEL": "foundation", "ANTHROPIC_SMALL_FAST_MODEL": "foundation"}),
    "proxy-any-model": ({"ANTHROPIC_ANY_MODEL": "1"}, {}),
}


@pytest.mark.parametrize("names", MODEL_NAMES)
def test_claude_code_web_search_end_to_end(start_proxy, backend, searxng, names):
    proxy_env, client_env = MODEL_NAMES[names]
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2", **proxy_env)
    model = StandInModel()
    backend.responder = model
    lines = run_claude(proxy.url, "Search the web: what is new in vLLM 0.32?", client_env)
    result = lines[-1]
    assert result["type"] == "result" and result["is_error"] is False
    assert result["result"] == ANSWER
    (usage,) = result["modelUsage"].values()
    assert usage["webSearchRequests"] == 1
    assert searxng.queries == [QUERY]
    # Claude Code's own reading of the blocks: one search, the stand-in's three links.
    found = search_tool_result(lines)
    assert found["searchCount"] == 1 and found["query"] == QUERY
    links = [r for r in found["results"] if isinstance(r, dict)][0]["content"]
    assert [x["url"] for x in links] == [f"https://example.org/vllm-0.32-release-notes/{i}" for i in (1, 2, 3)]
    assert SUMMARY in found["results"]
    # The shortcut: the sub-request reached the model once, already holding the results.
    assert "subrequest-call" not in model.shapes and model.shapes.count("subrequest-summary") == 1
    assert {"load-websearch", "call-websearch", "final"} <= set(model.shapes)
    turns = [r for r in backend.received if r.path.startswith("/v1/messages")]
    assert all(r.query == "beta=true" and r.json()["model"] == "foundation" for r in turns)
    assert all("x-api-key" not in r.headers or r.headers["x-api-key"] == "dummy-key" for r in turns)
    sub = [r.json() for r in turns if [t.get("name") for t in r.json().get("tools") or []] == ["web_search"]][0]
    assert "input_schema" in sub["tools"][0] and "type" not in sub["tools"][0]
    assert "Snippet 1 about vllm 0.32 release notes" in sub["messages"][-1]["content"][0]["content"]


def test_claude_code_sees_a_failed_search_as_an_error(start_proxy, backend, searxng):
    proxy = start_proxy(ANTHROPIC_ANY_MODEL="1", KEEPALIVE_INTERVAL="0.2")
    searxng.behave(None, "status", code=429)
    backend.responder = StandInModel()
    lines = run_claude(proxy.url, "Search the web: what is new in vLLM 0.32?")
    assert lines[-1]["result"] == ANSWER
    (usage,) = lines[-1]["modelUsage"].values()
    assert usage["webSearchRequests"] == 0
    found = search_tool_result(lines)
    # Claude Code's searchCount (2.1.328 and 2.1.332) counts attempts; the billed count above stays 0.
    assert found["searchCount"] == 1
    assert found["results"] == ["Web search error: too_many_requests", SUMMARY]
    assert searxng.queries == [QUERY]


# ---- WebFetch: Claude Code fetches the page itself, then asks the (small fast) model for a summary

PAGE_TEXT = "The magic word is PELICAN-7731."
PAGE = ("<html><head><title>vLLM 0.32 release notes</title></head><body><h1>vLLM 0.32</h1>"
        f"<p>{PAGE_TEXT}</p></body></html>").encode()
FETCH_PROMPT = "What is the magic word?"
FETCH_SUMMARY = "The page says the magic word is PELICAN-7731."
FETCH_ANSWER = "The magic word is PELICAN-7731, per the page."
SKIP_PREFLIGHT = json.dumps({"skipWebFetchPreflight": True})
FAILED_PREFLIGHT = "Unable to verify if domain 127.0.0.1 is safe to fetch."


class WebFetchModel(StandInModel):
    """Claude Code's requests in a WebFetch run, answered by shape (tests/data/agent-wire/claude-code-2.1.332-webfetch.json)."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url

    def answer(self, body):
        tools = [t.get("name") for t in body.get("tools") or []]
        msgs = body.get("messages") or []
        last = json.dumps(msgs[-1].get("content")) if msgs else ""
        previous = json.dumps(msgs[-2].get("content")) if len(msgs) > 1 else ""
        if not tools and "Web page content:" in last:
            return "summary", [W.text(FETCH_SUMMARY)]
        if "WebFetch" in tools:
            if '"WebFetch"' in previous and '"tool_result"' in last:
                return "final", [W.text(FETCH_ANSWER)]
            return "call-webfetch", [W.tool_use("WebFetch", {"url": self.url, "prompt": FETCH_PROMPT})]
        if "ToolSearch" in tools:
            return "load-webfetch", [W.tool_use("ToolSearch", {"query": "select:WebFetch", "max_results": 1})]
        return "background", [W.text("ok")]


def tls_site(folder: Path) -> WebSite:
    """The page over HTTPS (WebFetch turns http:// into https://, for 127.0.0.1 too), with a
    throw-away certificate for 127.0.0.1 that Claude Code trusts through NODE_EXTRA_CA_CERTS."""
    if not shutil.which("openssl"):
        pytest.fail("the openssl command is needed to make the test certificate (apt-get install openssl)")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    site = WebSite(str(cert), str(key))
    site.route("/notes", PAGE)
    site.ca_file = cert
    return site


@pytest.fixture(scope="module")
def tls_pages(tmp_path_factory):
    site = tls_site(tmp_path_factory.mktemp("tls"))
    yield site
    site.close()


def webfetch_results(lines) -> list:
    """What Claude Code's WebFetch returned, as its stream-json `user` lines report it."""
    return [ln["tool_use_result"] for ln in lines if ln.get("type") == "user" and
            (isinstance(ln.get("tool_use_result"), str) or "codeText" in (ln.get("tool_use_result") or {}))]


def settings_in(where: str, tmp_path: Path) -> tuple[dict, tuple]:
    """A home and a project folder (under pytest's tmp_path) with `skipWebFetchPreflight` where `where` says; returns
    run_claude's keyword arguments and extra command-line arguments."""
    home, project = tmp_path / "claude-home", tmp_path / "claude-project"
    home.mkdir()
    project.mkdir()
    folder = {"user": Path(home), "project": Path(project)}.get(where)
    if folder is not None:
        (folder / ".claude").mkdir()
        (folder / ".claude" / "settings.json").write_text(SKIP_PREFLIGHT)
    return {"home": str(home), "cwd": str(project)}, (("--settings", SKIP_PREFLIGHT) if where == "flag" else ())


# Where the setting may live: ~/.claude/settings.json, the project's .claude/settings.json (read
# in -p mode; an interactive session reads it only in a folder the user trusted), or --settings.
@pytest.mark.parametrize("where", ["user", "project", "flag"])
def test_claude_code_webfetch_is_summarised_by_the_local_model(start_proxy, backend, searxng, tls_pages, where, tmp_path):
    tls_pages.requests.clear()
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2")
    url = tls_pages.url + "/notes"
    model = WebFetchModel(url)
    backend.responder = model
    where_kw, args = settings_in(where, tmp_path)
    lines = run_claude(proxy.url, f"Fetch {url} and tell me the magic word.",
                       {**MODEL_NAMES["client-env"][1], "NODE_EXTRA_CA_CERTS": str(tls_pages.ca_file)},
                       allowed="WebFetch", args=args, **where_kw)
    assert lines[-1]["type"] == "result" and lines[-1]["result"] == FETCH_ANSWER
    (fetched,) = webfetch_results(lines)
    assert isinstance(fetched, dict), fetched
    assert fetched["code"] == 200 and fetched["url"] == url and fetched["result"] == FETCH_SUMMARY
    # Claude Code itself fetched the page, once, over TLS.
    (page_request,) = tls_pages.requests
    assert page_request.path == "/notes" and page_request.headers["user-agent"].startswith("Claude-User (claude-code/")
    # Its summary request reached the local model through /v1/messages, holding the page's text.
    assert model.shapes.count("summary") == 1 and {"load-webfetch", "call-webfetch", "final"} <= set(model.shapes)
    (summary,) = [r for r in backend.received if r.path == "/v1/messages" and not r.json().get("tools")
                  and "Web page content:" in json.dumps(r.json()["messages"])]
    sent = summary.json()
    assert summary.query == "beta=true" and sent["model"] == "foundation" and sent["tools"] == []
    asked = sent["messages"][0]["content"][0]["text"]
    assert PAGE_TEXT in asked and FETCH_PROMPT in asked and "vLLM 0.32" in asked
    # The summary, not the page, went back into the main loop.
    final = [r.json() for r in backend.received if r.path == "/v1/messages"
             and "WebFetch" in [t.get("name") for t in r.json().get("tools") or []]][-1]
    assert FETCH_SUMMARY in json.dumps(final["messages"][-1]["content"])
    assert searxng.queries == []


def test_claude_code_webfetch_without_the_setting_fails_offline(start_proxy, backend, searxng, tls_pages, tmp_path):
    """Without skipWebFetchPreflight Claude Code asks api.anthropic.com first, ignoring ANTHROPIC_BASE_URL."""
    tls_pages.requests.clear()
    proxy = start_proxy(KEEPALIVE_INTERVAL="0.2")
    url = tls_pages.url + "/notes"
    model = WebFetchModel(url)
    backend.responder = model
    where_kw, _ = settings_in("nowhere", tmp_path)
    lines = run_claude(proxy.url, f"Fetch {url} and tell me the magic word.",
                       {**MODEL_NAMES["client-env"][1], "NODE_EXTRA_CA_CERTS": str(tls_pages.ca_file)},
                       allowed="WebFetch", **where_kw)
    (fetched,) = webfetch_results(lines)
    assert isinstance(fetched, str) and FAILED_PREFLIGHT in fetched
    assert tls_pages.requests == [] and "summary" not in model.shapes
    # The check never came to the proxy: no request but the model's own reached the backend.
    assert {r.path for r in backend.received} <= {"/v1/messages", "/v1/models", "/v1/messages/count_tokens"}


# ---- the web tools over MCP (/mcp) ---------------------------------------------------------------------------------

MCP_SEARCH = "mcp__stack__web_search"  # Claude Code's name for the server "stack"'s tool


class McpModel(StandInModel):
    """Searches through the stack's MCP server (loading the tool first when Claude Code defers it), then answers."""

    def answer(self, body):
        tools = [t.get("name") for t in body.get("tools") or []]
        msgs = body.get("messages") or []
        last = json.dumps(msgs[-1].get("content")) if msgs else ""
        previous = json.dumps(msgs[-2].get("content")) if len(msgs) > 1 else ""
        if MCP_SEARCH in tools:
            if f'"{MCP_SEARCH}"' in previous and '"tool_result"' in last:
                return "final", [W.text(ANSWER)]
            return "call-mcp", [W.tool_use(MCP_SEARCH, {"query": QUERY})]
        if "ToolSearch" in tools and "web" in json.dumps(msgs[0].get("content") if msgs else ""):
            return "load-mcp", [W.tool_use("ToolSearch", {"query": f"select:{MCP_SEARCH}", "max_results": 1})]
        return "background", [W.text("ok")]


def test_claude_code_searches_through_the_mcp_server_and_its_model_reads_text(start_proxy, backend, searxng,
                                                                               tmp_path):
    proxy = start_proxy(ANTHROPIC_ANY_MODEL="1", KEEPALIVE_INTERVAL="0.2", PROXY_API_KEY="dummy-key")
    backend.responder = McpModel()
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"stack": {
        "type": "http", "url": proxy.url + "/mcp", "headers": {"Authorization": "Bearer dummy-key"}}}}))
    lines = run_claude(proxy.url, "Search the web: what is new in vLLM 0.32?", allowed=MCP_SEARCH,
                       args=("--mcp-config", str(config), "--strict-mcp-config"))
    assert lines[-1]["type"] == "result" and lines[-1]["result"] == ANSWER, lines[-1]
    assert searxng.queries == [QUERY]
    # The call in Claude Code's own output, and its result as the text the proxy wrote.
    calls = [b for ln in lines if ln.get("type") == "assistant" for b in ln["message"]["content"]
             if b.get("type") == "tool_use" and b.get("name") == MCP_SEARCH]
    assert [c["input"] for c in calls] == [{"query": QUERY}]
    turns = [r.json() for r in backend.received if r.path == "/v1/messages"]
    # The turn after the call (and any background request Claude Code sends with the same history).
    after = [t for t in turns if len(t["messages"]) > 1 and isinstance(t["messages"][-2]["content"], list)
             and any(b.get("name") == MCP_SEARCH for b in t["messages"][-2]["content"])]
    assert after
    for turn in after:
        (block,) = [b for b in turn["messages"][-1]["content"] if b.get("type") == "tool_result"]
        shown = block["content"] if isinstance(block["content"], str) else "".join(
            p.get("text", "") for p in block["content"])
        # Readable text, its line ends real: never the structured output's JSON with every newline escaped.
        assert shown.startswith(f'Search results for "{QUERY}":\n') and "\nURL: https://example.org/" in shown
        assert "\\n" not in shown and '{"result"' not in shown
