"""docs/architecture.md's "How to add a tool", walked for a tool made up for this test: `lookup_word`
(standins/new_tool.py) is its module, its registry entry and one row in each API's presentation table, and nothing
more. The real proxy under gunicorn serves it on chat completions, Messages and Responses end to end: what the
client gets, and what vLLM's stand-in received. Also: no API module names a tool.

Run: tests/run.sh tests/test_new_tool.py
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from standins import anthropic_wire as A
from standins import responses_wire as R
from standins.proxy_process import ProxyProcess
from standins.vllm_wire import completion, json_reply, tool_call

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "tests" / ".work" / f"new-tool-{os.getpid()}"
MEANING = '"proxy" means: a server that stands between a client and the server it talks to.'


@pytest.fixture(scope="module")
def tool_proxy(_backend_server, _searxng_server):
    WORK.mkdir(parents=True, exist_ok=True)
    proxy = ProxyProcess({"BACKEND_URL": _backend_server.url, "SEARXNG_URL": _searxng_server.url,
                          "SEARCH_CACHE_TTL": "0"}, WORK / "proxy-new-tool.log", app="standins.new_tool:app")
    yield proxy
    proxy.stop()


def post(proxy, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(proxy.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, json.loads(resp.read())


def test_chat_offers_and_runs_it(tool_proxy, backend):
    backend.script(json_reply(completion(tool_calls=[tool_call("lookup_word", {"word": "Proxy"})])),
                   json_reply(completion(content="A proxy stands between.")))
    status, got = post(tool_proxy, "/v1/chat/completions",
                       {"model": "foundation", "messages": [{"role": "user", "content": "What is a proxy?"}]})
    assert status == 200 and got["choices"][0]["message"]["content"] == "A proxy stands between."
    first, second = (r.json() for r in backend.received)
    assert "lookup_word" in [t["function"]["name"] for t in first["tools"]]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": second["messages"][-2]["tool_calls"][0]["id"],
                                      "content": MEANING}


def test_messages_shows_it_as_a_server_tool(tool_proxy, backend):
    backend.script(A.message_reply([A.tool_use("lookup_word", {"word": "proxy"})], stop_reason="tool_use"),
                   A.message_reply([A.text("A proxy stands between.")]))
    status, got = post(tool_proxy, "/v1/messages", {
        "model": "foundation", "max_tokens": 100, "messages": [{"role": "user", "content": "What is a proxy?"}],
        "tools": [{"type": "lookup_word_20260101", "name": "lookup_word", "max_uses": 3}]})
    assert status == 200
    assert [b["type"] for b in got["content"]] == ["server_tool_use", "lookup_word_tool_result", "text"]
    use, result = got["content"][:2]
    assert use["name"] == "lookup_word" and result["tool_use_id"] == use["id"]
    assert result["content"] == {"type": "lookup_word_result", "word": "proxy", "meaning": MEANING.split(": ", 1)[1][:-1]}
    first, second = (r.json() for r in backend.received)
    assert first["tools"] == [{"name": "lookup_word", "description": "Look up what a word means in the proxy's glossary.",
                               "input_schema": {"type": "object", "properties": {"word": {"type": "string"}},
                                                "required": ["word"]}}]
    assert second["messages"][-1]["content"][0]["content"] == MEANING
    # Its usage key is none: the two counts Anthropic always sends, nothing of its own.
    assert got["usage"]["server_tool_use"] == {"web_search_requests": 0, "web_fetch_requests": 0}


def test_messages_replays_its_blocks(tool_proxy, backend):
    """An answer holding its blocks, sent back as history, reads to the model as its row replays it."""
    backend.script(A.message_reply([A.text("ok")]))
    use = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "lookup_word", "input": {"word": "proxy"}}
    result = {"type": "lookup_word_tool_result", "tool_use_id": "srvtoolu_1",
              "content": {"type": "lookup_word_result", "word": "proxy", "meaning": "a go-between"}}
    status, _ = post(tool_proxy, "/v1/messages", {
        "model": "foundation", "max_tokens": 100, "tools": [{"type": "lookup_word_20260101", "name": "lookup_word"}],
        "messages": [{"role": "user", "content": "What is a proxy?"}, {"role": "assistant", "content": [use, result]},
                     {"role": "user", "content": "thanks"}]})
    sent = backend.received[0].json()["messages"]
    assert status == 200 and sent[1]["content"][0]["type"] == "tool_use"
    assert sent[2]["content"][0] == {"type": "tool_result", "tool_use_id": "srvtoolu_1",
                                     "content": '"proxy" means: a go-between.'}


def test_responses_shows_it_as_an_action_of_the_hosted_tool(tool_proxy, backend):
    backend.responder = R.model([R.call("lookup_word", {"word": "proxy"})], [R.message("A proxy stands between.")])
    status, got = post(tool_proxy, "/v1/responses", {"model": "foundation", "input": "What is a proxy?",
                                                     "tools": [{"type": "web_search"}]})
    assert status == 200
    item = next(i for i in got["output"] if i["type"] == "lookup_call")
    assert item["status"] == "completed" and item["action"] == {"type": "lookup", "word": "proxy"}
    assert item["id"].startswith("lk_")
    first, second = (r.json() for r in backend.received)
    assert "lookup_word" in [t["name"] for t in first["tools"]]
    assert [i["output"] for i in second["input"] if i.get("type") == "function_call_output"] == [MEANING]


def test_responses_streams_its_rows_events(tool_proxy, backend):
    backend.responder = R.model([R.call("lookup_word", {"word": "proxy"})], [R.message("done")])
    req = urllib.request.Request(tool_proxy.url + "/v1/responses", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "foundation", "input": "What is a proxy?", "stream": True,
                                                  "tools": [{"type": "web_search"}]}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read().decode()
    kinds = [json.loads(line[6:])["type"] for line in raw.splitlines() if line.startswith("data: {")]
    assert "response.lookup_call.in_progress" in kinds and "response.lookup_call.completed" in kinds
    assert not any("web_search_call" in k for k in kinds)


# The API packages show tools through their presentation tables (presentation.py) only; their other modules
# must not compare a tool's name. The names a table keys by are the registry's.
TOOL_NAMES = {"web_search", "web_fetch", "find_in_page", "WEB_SEARCH", "WEB_FETCH", "FIND_IN_PAGE"}


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "proxy" / "apis").rglob("*.py")
                                        if p.name != "presentation.py" and "alpha_search" not in p.parts
                                        and p.name != "given.py"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_api_module_names_a_tool(path):
    """Neither a literal name nor a registry constant, anywhere in the module's code (docstrings aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in TOOL_NAMES and isinstance(node.value, str):
            found.append(node.value)
        elif isinstance(node, (ast.Name, ast.Attribute)) and (getattr(node, "id", None) or getattr(node, "attr", None)) in TOOL_NAMES:
            found.append(getattr(node, "id", None) or getattr(node, "attr", None))
    assert not found, f"{path.name} names tools: {sorted(set(found))}"


# ---- counted by its kind, never by its name ------------------------------------------------------------------

def test_its_calls_count_by_kind_in_the_keys_usage(tmp_path, _backend_server, _searxng_server, backend):
    """lookup_word is of kind OTHER: its calls are neither searches nor page reads in the key's day (a count by name,
    "every tool not named web_search reads a page", took each for a page read)."""
    keys_file, admin = tmp_path / "keys.json", "admin-key-for-new-tool"
    made = subprocess.run([sys.executable, str(ROOT / "scripts" / "keys.py"), "add", "reader", "--file", str(keys_file)],
                          capture_output=True, text=True, timeout=30, check=True)
    key = made.stdout.strip()
    proxy = ProxyProcess({"BACKEND_URL": _backend_server.url, "SEARXNG_URL": _searxng_server.url,
                          "PROXY_API_KEY": admin, "PROXY_KEYS_FILE": str(keys_file),
                          "PROXY_STATE_DB": str(tmp_path / "state.sqlite3")},
                         tmp_path / "proxy-kind.log", app="standins.new_tool:app")
    try:
        backend.script(json_reply(completion(tool_calls=[tool_call("lookup_word", {"word": "proxy"}),
                                                         tool_call("lookup_word", {"word": "greenlet"})])),
                       json_reply(completion(content="Both looked up.")))
        req = urllib.request.Request(proxy.url + "/v1/chat/completions", method="POST", data=json.dumps(
            {"model": "foundation", "messages": [{"role": "user", "content": "What are these?"}]}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["choices"][0]["message"]["content"] == "Both looked up."
        deadline, day = time.monotonic() + 5, {}
        while not day and time.monotonic() < deadline:  # the day is written as the request ends, after its bytes
            got = urllib.request.urlopen(urllib.request.Request(
                proxy.url + "/proxy/usage", headers={"Authorization": f"Bearer {admin}"}), timeout=10)
            days = json.loads(got.read())["keys"].get("reader", {})
            day = next(iter(days.values())) if days else {}
            time.sleep(0.05)
        assert {k: day.get(k) for k in ("requests", "searches", "page_reads")} == {
            "requests": 1, "searches": 0, "page_reads": 0}, day
    finally:
        proxy.stop()


# Outside the tools and the presentation tables nothing tells tools apart by name to count them: each counts by
# `kind`. Allowed, with the reason: a wire's own word that happens to be a tool's name.
WIRE_WORDS = {"proxy/apis/given.py": "Responses' web_search_call action.type 'find_in_page' (a page read earlier)"}


def name_comparisons(tree) -> list[str]:
    """The tool names (literal or the registry's constants) a module compares anything with. Pure."""
    def names(node) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TOOL_NAMES:
            return [node.value]
        if isinstance(node, (ast.Name, ast.Attribute)) and (getattr(node, "id", None) or node.attr) in TOOL_NAMES:
            return [getattr(node, "id", None) or node.attr]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [n for e in node.elts for n in names(e)]
        return []
    return [n for node in ast.walk(tree) if isinstance(node, ast.Compare)
            for operand in (node.left, *node.comparators) for n in names(operand)]


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "proxy").rglob("*.py")
                                        if "tools" not in p.relative_to(ROOT / "proxy").parts[:1]
                                        and p.name != "presentation.py"), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_outside_the_tools_counts_by_a_tools_name(path):
    found = name_comparisons(ast.parse(path.read_text()))
    if str(path.relative_to(ROOT)) in WIRE_WORDS:
        found = [n for n in found if n != "find_in_page"]
    assert not found, f"{path.relative_to(ROOT)} compares with tool names {sorted(set(found))}: count by kind"


def test_the_name_comparison_scan_finds_each_form():
    source = ('if o.tool != "web_search": pass\nif t in ("web_fetch", "x"): pass\nif n == registry.WEB_SEARCH: pass\n'
              'PAGE = {"open": registry.WEB_FETCH}\n')
    assert name_comparisons(ast.parse(source)) == ["web_search", "web_fetch", "WEB_SEARCH"]
