"""End to end with the real Codex CLI (`@openai/codex` 0.171.0, installed by tests/run.sh into
$AGENTS_BIN): `codex exec --json` against the proxy with a provider using wire_api =
"responses"; the stand-in model calls web_search, the proxy searches the SearXNG stand-in, and
Codex shows its own web_search item. Run: tests/run.sh tests/test_codex.py
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from standins import responses_wire as w

pytestmark = pytest.mark.agents

CODEX = Path(os.environ.get("AGENTS_BIN", "/nonexistent")) / "codex"
README = Path(__file__).resolve().parents[1] / "README.md"
ANSWER = "Per the search, vLLM 0.32 shipped the Responses loop."
QUERY = "vllm 0.32 release notes"


def codex_config(proxy_url: str) -> str:
    """A provider at the proxy and every switch that would make Codex reach past loopback off."""
    return f"""
model = "foundation"
model_provider = "stack"
model_reasoning_summary = "auto"
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false
web_search = "cached"

[model_providers.stack]
name = "coding stack proxy"
base_url = "{proxy_url}/v1"
wire_api = "responses"
env_key = "STACK_API_KEY"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 60000
supports_websockets = false

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"
"""


def stand_in_model(received):
    """Codex's main turn: search first; once a web_search result is in the input, answer."""
    if received.path != "/v1/responses":
        return None
    request = received.json()
    searched = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in request.get("input") or [])
    has_search = any(t.get("name") == "web_search" and t.get("type") == "function" for t in request.get("tools") or [])
    if searched or not has_search:
        return w.answer(request, [w.reasoning("The results answer it."), w.message(ANSWER)])
    return w.answer(request, [w.reasoning("I need to look this up."), w.call("web_search", {"query": QUERY})])


def run_codex(proxy, tmp_path, *args, config: str | None = None) -> tuple[subprocess.CompletedProcess, list, str]:
    home = tmp_path / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(config or codex_config(proxy.url))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "CODEX_HOME": str(home),
           "STACK_API_KEY": "sk-local", "NO_COLOR": "1", "RUST_LOG": "error",
           # Loopback only: no proxy may route Codex's calls elsewhere.
           "NO_PROXY": "*", "no_proxy": "*"}
    # A generous timeout that still cannot hang the suite.
    proc = subprocess.run([str(CODEX), "exec", "--json", "--skip-git-repo-check", "-C", str(work), *args],
                          env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    diagnostics = (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}\n"
                   f"proxy log:\n{proxy.log()[-3000:]}")
    return proc, [e["item"] for e in events if e.get("type") == "item.completed"], diagnostics


needs_codex = pytest.mark.skipif(not CODEX.exists(), reason="Codex is installed by tests/run.sh ($AGENTS_BIN)")


@needs_codex
def test_codex_exec_searches_through_the_proxy(proxy, backend, searxng, tmp_path):
    backend.responder = stand_in_model
    proc, items, diagnostics = run_codex(proxy, tmp_path, "--ephemeral", "What changed in vLLM 0.32? Search the web.")
    assert proc.returncode == 0, diagnostics
    searches = [i for i in items if i.get("type") == "web_search"]
    assert len(searches) == 1 and searches[0].get("query") == QUERY, diagnostics
    messages = [i.get("text") for i in items if i.get("type") == "agent_message"]
    assert messages and messages[-1] == ANSWER, diagnostics
    assert searxng.queries == [QUERY]

    sent = [r.json() for r in backend.received if r.path == "/v1/responses"]
    assert len(sent) == 2, diagnostics
    assert not any(t.get("type") == "web_search" for t in sent[0]["tools"])
    assert [t["name"] for t in sent[0]["tools"] if t.get("name") == "web_search"] == ["web_search"]
    assert sent[1]["input"][-1]["type"] == "function_call_output" and QUERY in sent[1]["input"][-1]["output"]
    assert all(r.headers.get("authorization") == "Bearer sk-local" for r in backend.received)


@needs_codex
def test_codex_resume_replays_its_web_search_call(proxy, backend, searxng, tmp_path):
    """The second turn's history holds Codex's web_search_call (no id), which vLLM alone rejects."""
    backend.responder = stand_in_model
    proc, _, diagnostics = run_codex(proxy, tmp_path, "What changed in vLLM 0.32? Search the web.")
    assert proc.returncode == 0, diagnostics
    first_turn = len(backend.received)
    backend.responder = lambda r: w.answer(r.json(), [w.message("Nothing else.")]) if r.path == "/v1/responses" else None
    proc, items, diagnostics = run_codex(proxy, tmp_path, "resume", "--last", "Anything else?")
    assert proc.returncode == 0, diagnostics
    assert [i.get("text") for i in items if i.get("type") == "agent_message"][-1] == "Nothing else.", diagnostics
    resumed = backend.received[first_turn].json()["input"]
    assert not any(i.get("type") == "web_search_call" for i in resumed), diagnostics
    replayed = [i for i in resumed if i.get("type") == "function_call" and i.get("name") == "web_search"]
    assert [json.loads(i["arguments"]) for i in replayed] == [{"query": QUERY}], diagnostics
    assert searxng.queries == [QUERY]  # the replay itself searches nothing


# ---- standalone search: Codex calls POST {base_url}/alpha/search itself (tests/data/codex-alpha-search.md)

STANDALONE = """
[features]
standalone_web_search = true
"""
DOC = ("<html><head><title>vLLM 0.32 notes</title></head><body><main><h1>vLLM 0.32</h1>"
       "<p>The magic word is PELICAN-7731.</p></main></body></html>")


def standalone_config(proxy_url: str) -> str:
    """codex_config with the provider's standalone search on; both switches are needed (0.171.0)."""
    config = codex_config(proxy_url).replace("supports_websockets = false",
                                             "supports_websockets = false\nsupports_standalone_web_search = true")
    return config.replace("[analytics]", STANDALONE.strip() + "\n\n[analytics]")


def standalone_model(page_url: str):
    """First turn: call web.run with a search and an open; once its output is in the input, answer."""
    def respond(received):
        if received.path != "/v1/responses":
            return None
        request = received.json()
        if any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in request.get("input") or []):
            return w.answer(request, [w.message(ANSWER)])
        web = [t for t in request.get("tools") or [] if t.get("type") == "namespace" and t.get("name") == "web"]
        if not web:
            return w.answer(request, [w.message("no web tool")])
        return w.answer(request, [w.reasoning("I need to look this up."),
                                  w.call("run", {"search_query": [{"q": QUERY}], "open": [{"ref_id": page_url}]},
                                         namespace="web")])
    return respond


@needs_codex
def test_codex_standalone_search_is_served_by_the_proxy(start_proxy, backend, searxng, tmp_path):
    from standins.web_pages import WebSite
    site = WebSite()
    site.route("/notes", DOC)
    page_url = f"http://127.0.0.1:{site.port}/notes"
    try:
        proxy = start_proxy(KEEPALIVE_INTERVAL="0.2", WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8")
        backend.responder = standalone_model(page_url)
        # The user names the page: `open` reads only URLs the conversation gave (docs/web-tools.md, URL provenance).
        proc, items, diagnostics = run_codex(proxy, tmp_path, "--ephemeral",
                                             f"What changed in vLLM 0.32? Search the web and read {page_url}.",
                                             config=standalone_config(proxy.url))
    finally:
        site.close()
    assert proc.returncode == 0, diagnostics
    assert [i.get("text") for i in items if i.get("type") == "agent_message"][-1] == ANSWER, diagnostics
    searches = [i for i in items if i.get("type") == "web_search"]
    assert [s.get("query") for s in searches] == [QUERY], diagnostics
    # The proxy searched SearXNG and fetched the page; vLLM never saw the search request.
    assert searxng.queries == [QUERY]
    assert [r.path for r in site.requests] == ["/notes"]
    assert [r.path for r in backend.received] == ["/v1/responses", "/v1/responses"], diagnostics
    first, second = [r.json() for r in backend.received]
    assert not any(t.get("type") == "web_search" for t in first["tools"])
    assert any(t.get("type") == "namespace" and t.get("name") == "web" for t in first["tools"])
    # What Codex handed its model: the endpoint's output, results and page text in it.
    (output,) = [i for i in second["input"] if i.get("type") == "function_call_output"]
    text = output["output"] if isinstance(output["output"], str) else "".join(p.get("text", "") for p in output["output"])
    assert f'## search_query "{QUERY}"' in text and "[turn0search0]" in text
    assert "https://example.org/vllm-0.32-release-notes/1" in text
    assert "## open [turn0view0] vLLM 0.32 notes" in text and "PELICAN-7731" in text
    assert "POST /v1/alpha/search 200" in proxy.log_once("POST /v1/alpha/search 200")


# ---- the web tools over MCP (/mcp) ----------------------------------------------------------------------------------

def mcp_tool_of(request: dict) -> tuple[str, str | None] | None:
    """(name, namespace) of the MCP server's web_search as Codex offers it to the model, or None."""
    for t in request.get("tools") or []:
        if t.get("type") == "namespace":
            for inner in t.get("tools") or []:
                if "Served by the coding stack" in (inner.get("description") or "") and "search" in inner.get("name", ""):
                    return inner["name"], t.get("name")
        elif "Served by the coding stack" in (t.get("description") or "") and "search" in t.get("name", ""):
            return t["name"], None
    return None


def mcp_model(received):
    """Search through the MCP server's tool; once its output is in the input, answer."""
    if received.path != "/v1/responses":
        return None
    request = received.json()
    searched = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in request.get("input") or [])
    found = mcp_tool_of(request)
    if searched or found is None:
        return w.answer(request, [w.message(ANSWER)])
    name, namespace = found
    return w.answer(request, [w.reasoning("I need to look this up."), w.call(name, {"query": QUERY}, namespace=namespace)])


@needs_codex
def test_codex_searches_through_the_mcp_server(start_proxy, backend, searxng, tmp_path):
    proxy = start_proxy(PROXY_API_KEY="sk-local")
    backend.responder = mcp_model
    # The README's entry as a user pastes it (its `required = true` makes Codex wait for the first /mcp answer,
    # which loads the SDK in the worker: past Codex's one-second grace for optional servers on a busy machine).
    entry = re.search(r"^\[mcp_servers\.stack\]\n(?:[^`\n].*\n)+", README.read_text(), re.M)[0]
    config = codex_config(proxy.url).replace('web_search = "cached"', 'web_search = "disabled"') + "\n" + \
        entry.replace("http://localhost:11433", proxy.url)
    proc, items, diagnostics = run_codex(proxy, tmp_path, "--ephemeral", "What changed in vLLM 0.32? Search the web.",
                                         config=config)
    sent = [r.json() for r in backend.received if r.path == "/v1/responses"]
    assert proc.returncode == 0, diagnostics
    assert sent and mcp_tool_of(sent[0]) is not None, json.dumps(sent[0]["tools"] if sent else None)[:3000]
    calls = [i for i in items if i.get("type") == "mcp_tool_call"]
    assert [(c.get("server"), c.get("tool"), c.get("status")) for c in calls] == [
        ("stack", "web_search", "completed")], diagnostics
    assert searxng.queries == [QUERY]
    (output,) = [i for i in sent[-1]["input"] if i.get("type") == "function_call_output"]
    shown = output["output"] if isinstance(output["output"], str) else json.dumps(output["output"])
    assert f'Search results for \\"{QUERY}\\"' in shown or f'Search results for "{QUERY}"' in shown, shown[:2000]
    assert [i.get("text") for i in items if i.get("type") == "agent_message"][-1] == ANSWER
