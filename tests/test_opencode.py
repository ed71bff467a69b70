"""End to end with the real opencode (npm `opencode-ai` 1.18.33, installed by tests/run.sh into
$AGENTS_BIN), a chat-completions agent: `opencode run --format json` with an OpenAI-compatible provider at
the proxy's /v1 and the proxy's MCP server at /mcp. The stand-in model calls the MCP server's search tool,
opencode runs it over /mcp, the proxy searches the SearXNG stand-in, and the model answers from the results.

Run: tests/run.sh tests/test_opencode.py
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from standins import vllm_wire as v

pytestmark = pytest.mark.agents

OPENCODE = Path(os.environ.get("AGENTS_BIN", "/nonexistent")) / "opencode"
QUERY = "vllm 0.32 release notes"
ANSWER = "Per the search, vLLM 0.32 shipped the Responses loop."
TITLE = "vLLM 0.32 notes"
RUN_TIMEOUT = 120  # seconds; a run takes a few, and a hang must fail the test, not the suite


def opencode_config(proxy_url: str) -> dict:
    """opencode.json as the README shows it: the proxy as an OpenAI-compatible provider, and its MCP server."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"stack": {"npm": "@ai-sdk/openai-compatible", "name": "coding stack",
                               "options": {"baseURL": f"{proxy_url}/v1", "apiKey": "{env:STACK_API_KEY}"},
                               "models": {"foundation": {"name": "foundation"}}}},
        "model": "stack/foundation",
        "mcp": {"stack": {"type": "remote", "url": f"{proxy_url}/mcp",
                          "headers": {"Authorization": "Bearer {env:STACK_API_KEY}"}}},
    }


def mcp_search_tool(request: dict) -> str | None:
    """The name opencode gives the MCP server's web_search when it offers it to the model, or None."""
    for t in request.get("tools") or []:
        f = t.get("function") or {}
        if "Served by the coding stack" in (f.get("description") or "") and "search" in f.get("name", ""):
            return f["name"]
    return None


def reply(content: str | None = None, reasoning: str | None = None, tool_calls: list | None = None):
    """vLLM's streamed answer (opencode streams every request, the title's too)."""
    return v.sse_reply(v.stream_frames(content=[content] if content else [], reasoning=[reasoning] if reasoning else [],
                                       tool_calls=tool_calls or [], include_usage=True))


def stand_in_model(received):
    """Search through the MCP tool; once its result is a tool message, answer. Requests without it (the title) get text."""
    if received.path != "/v1/chat/completions":
        return None
    request = received.json()
    tool = mcp_search_tool(request)
    if any(m.get("role") == "tool" for m in request.get("messages") or []):
        return reply(content=ANSWER)
    if tool is None:
        return reply(content=TITLE)
    return reply(reasoning="I need to look this up.", tool_calls=[v.tool_call(tool, {"query": QUERY})])


def run_opencode(proxy, tmp_path, prompt: str) -> tuple[subprocess.CompletedProcess, list, str]:
    """`opencode run --format json` in a fresh HOME; its JSON events, and what to show when it fails."""
    home, work = tmp_path / "home", tmp_path / "work"
    for d in (home, work):
        d.mkdir(exist_ok=True)
    config = home / ".config" / "opencode" / "opencode.json"  # where the README says it goes
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(opencode_config(proxy.url)))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(home),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"),
           "STACK_API_KEY": "sk-local", "NO_COLOR": "1",
           # Everything opencode would fetch or start on its own is off: update checks, sharing, models.dev's
           # catalogue, its default plugins (installed from npm at start), LSP downloads, ~/.claude's skills.
           "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
           "OPENCODE_DISABLE_CLAUDE_CODE": "1", "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
           # Loopback only: anything else that would leave the machine meets a closed port.
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1,localhost"}
    proc = subprocess.run([str(OPENCODE), "run", "--format", "json", "--print-logs", "--log-level", "WARN", prompt],
                          cwd=work, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    diagnostics = (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}\n"
                   f"proxy log:\n{proxy.log()[-3000:]}")
    return proc, events, diagnostics


needs_opencode = pytest.mark.skipif(not OPENCODE.exists(), reason="opencode is installed by tests/run.sh ($AGENTS_BIN)")


@needs_opencode
def test_opencode_searches_through_the_mcp_server(start_proxy, backend, searxng, tmp_path):
    proxy = start_proxy(PROXY_API_KEY="sk-local")
    backend.responder = stand_in_model
    proc, events, diagnostics = run_opencode(proxy, tmp_path, "What changed in vLLM 0.32? Search the web.")
    assert proc.returncode == 0, diagnostics
    # Offline: without its OPENCODE_DISABLE_* opencode logs an ERROR for the models.dev catalogue it could not fetch.
    assert "level=ERROR" not in proc.stderr, diagnostics
    # opencode's own output: the MCP tool call, its input and the results it got, then the model's answer.
    calls = [e["part"] for e in events if e.get("type") == "tool_use"]
    assert [(c["tool"], c["state"]["status"], c["state"]["input"]) for c in calls] == [
        ("stack_web_search", "completed", {"query": QUERY})], diagnostics
    assert calls[0]["state"]["output"].startswith(f'Search results for "{QUERY}"'), diagnostics
    assert [e["part"]["text"] for e in events if e.get("type") == "text"] == [ANSWER], diagnostics
    assert searxng.queries == [QUERY]

    # The model's side: offered the MCP tool and no second web_search of the proxy's; then the results as readable text.
    main = [r.json() for r in backend.received if r.path == "/v1/chat/completions" and mcp_search_tool(r.json())]
    assert len(main) == 2, diagnostics
    assert not [t for t in main[0]["tools"] if t["function"]["name"] in ("web_search", "web_fetch")]
    (result,) = [m for m in main[1]["messages"] if m.get("role") == "tool"]
    text = result["content"] if isinstance(result["content"], str) else "".join(p.get("text", "") for p in result["content"])
    assert text.startswith(f'Search results for "{QUERY}"'), text[:2000]
    assert "\nURL: https://example.org/vllm-0.32-release-notes/1\n" in text, text[:2000]
    # The key went to /mcp on every call (the proxy answers 401 without it).
    assert "POST /mcp 401" not in proxy.log() and "POST /mcp 200" in proxy.log(), diagnostics
