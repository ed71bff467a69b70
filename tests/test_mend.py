"""Replayed tool calls whose arguments are not a JSON object reach vLLM mended as {"_unparsed": RAW}, on chat,
Messages and Responses, relayed or with the proxy's tools (proxy/apis/mend.py; docs/apis.md, "Tool calls the model
writes"): the pure rule, then the proxy under gunicorn with what the backend received."""
from __future__ import annotations

import json

import pytest

from proxy.apis import mend
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply

CUT = '{"command": "ls -la /very/lo'


@pytest.mark.parametrize("raw,expected", [
    ('{"command": "ls"}', None),
    ("{}", None),
    (None, None),
    (CUT, json.dumps({"_unparsed": CUT})),
    ("", '{"_unparsed": ""}'),
    ("[1, 2]", '{"_unparsed": "[1, 2]"}'),
    ('"just a string"', '{"_unparsed": "\\"just a string\\""}'),
    ("héllo {", '{"_unparsed": "héllo {"}'),
    ({"an": "object, not a string"}, '{"_unparsed": "{\\"an\\": \\"object, not a string\\"}"}'),
])
def test_mended_arguments(raw, expected):
    assert mend.mended_arguments(raw) == expected


def chat_body(arguments):
    return {"model": "foundation", "messages": [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cut"}]}


def responses_body(arguments):
    return {"model": "foundation", "input": [
        {"type": "message", "role": "user", "content": "list"},
        {"type": "function_call", "call_id": "c1", "name": "Bash", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "cut"}]}


def messages_body(tool_input):
    return {"model": "foundation", "max_tokens": 16, "messages": [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "Bash", "input": tool_input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "cut"}]}]}


def sent_arguments(path: str, body: dict):
    if path == "/v1/chat/completions":
        return body["messages"][1]["tool_calls"][0]["function"]["arguments"]
    if path == "/v1/responses":
        return body["input"][1]["arguments"]
    return body["messages"][1]["content"][0]["input"]


CASES = [
    ("/v1/chat/completions", chat_body(CUT), json.dumps({"_unparsed": CUT})),
    ("/v1/chat/completions", chat_body('{"command": "ls"}'), '{"command": "ls"}'),
    ("/v1/responses", responses_body(CUT), json.dumps({"_unparsed": CUT})),
    ("/v1/responses", responses_body('{"command": "ls"}'), '{"command": "ls"}'),
    ("/v1/messages", messages_body(CUT), {"_unparsed": CUT}),
    ("/v1/messages", messages_body('{"command": "ls"}'), {"command": "ls"}),
    ("/v1/messages", messages_body({"command": "ls"}), {"command": "ls"}),
]


@pytest.mark.parametrize("path,body,upstream", CASES)
def test_rule(path, body, upstream):
    fix = {"/v1/chat/completions": mend.chat, "/v1/responses": mend.responses, "/v1/messages": mend.messages}[path]
    mended = fix(body)
    assert sent_arguments(path, mended or body) == upstream
    assert (mended is None) == (sent_arguments(path, body) == upstream)


@pytest.mark.parametrize("tools", [False, True], ids=["relay", "tools"])
@pytest.mark.parametrize("path,body,upstream", CASES)
def test_proxy_sends_mended_history(proxy, backend, path, body, upstream, tools):
    """What the backend gets (the mended history, or the client's bytes unchanged) and that the client gets the
    backend's answer; with `tools` the proxy's web tools are in play (chat: injected; others: relayed alike)."""
    reply = json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    backend.script(Reply(body=reply))
    body = {**body, "tool_choice": "none"} if not tools and path == "/v1/chat/completions" else body
    raw = json.dumps(body).encode()
    status, _, data = raw_request(proxy.url, "POST", path, raw, {"Content-Type": "application/json"})
    assert (status, data) == (200, reply)
    got = backend.received[0]
    assert sent_arguments(path, got.json()) == upstream
    if sent_arguments(path, body) == upstream and not (tools and path == "/v1/chat/completions"):
        assert got.body == raw  # nothing to mend: relayed byte for byte
