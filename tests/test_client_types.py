"""A field of the wrong JSON type that the proxy itself reads is a 400 in the route's API's own
error shape, naming the field, and nothing reaches vLLM; one the proxy only relays goes to vLLM
untouched (vLLM judges it). Each row was a 500 (or a cut stream) before proxy/core/validate.py.

Run: tests/run.sh tests/test_client_types.py  (tests/test_fuzz.py draws such bodies at random)
"""
from __future__ import annotations

import base64
import json

import pytest

from proxy.core import validate as V
from standins import anthropic_wire as aw
from standins import responses_wire as rw
from standins.rawhttp import raw_request
from standins.vllm_wire import completion, json_reply

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
USER = [{"role": "user", "content": "hi"}]
FN = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
SEARCH = {"type": "web_search_20250305", "name": "web_search"}
STU = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}}
WSTR = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
        "content": [{"type": "web_search_result", "url": "https://a.example/", "title": "A", "encrypted_content": "x"}]}


def history(*blocks) -> list:
    return USER + [{"role": "assistant", "content": list(blocks)}, {"role": "user", "content": "more"}]


def chat(**kw) -> dict:
    return {"model": "foundation", "messages": USER, **kw}


def msg(**kw) -> dict:
    return {"model": "foundation", "max_tokens": 5, "messages": USER, **kw}


def resp(**kw) -> dict:
    return {"model": "foundation", "input": "hi", **kw}


# (route, body, the field named in the 400)
REFUSED = [
    (CHAT, chat(tools=[{**FN, "function": {"name": ["get_weather"]}}]), "tools[0].function.name"),
    (CHAT, chat(tools=[{"type": "function", "name": {"n": 1}}]), "tools[0].name"),
    (CHAT, chat(tools=[{**FN, "function": "get_weather"}]), "tools[0].function"),
    (CHAT, chat(tool_choice={"type": "function", "function": {"name": ["web_search"]}}), "tool_choice.function.name"),
    (CHAT, chat(tool_choice={"type": "function", "function": {"name": {}}}, stream=True), "tool_choice.function.name"),
    (MESSAGES, msg(tools=[SEARCH], messages=history({"type": ["text"], "text": "so"}, STU, WSTR)),
     "messages.1.content.0.type"),
    (MESSAGES, msg(messages=history(STU, {**WSTR, "type": {"t": 1}})), "messages.1.content.1.type"),
    (MESSAGES, msg(tools=[SEARCH], messages=history({**STU, "id": ["srvtoolu_1"]}, WSTR)), "messages.1.content.0.id"),
    (MESSAGES, msg(messages=history(STU, {**WSTR, "tool_use_id": {"id": 1}})), "messages.1.content.1.tool_use_id"),
    (MESSAGES, msg(messages=history(STU, {**WSTR, "content": {"type": "web_search_tool_result_error", "error_code": []}})),
     "messages.1.content.1.content.error_code"),
    (MESSAGES, msg(messages=history(STU, WSTR, {"type": "tool_use", "id": [1], "name": "Bash", "input": {}})),
     "messages.1.content.2.id"),
    (MESSAGES, msg(messages=history({**STU, "input": "q"}, WSTR)), "messages.1.content.0.input"),
    (MESSAGES, msg(tools=[SEARCH, {"name": ["Bash"], "input_schema": {"type": "object"}}]), "tools.1.name"),
    (MESSAGES, msg(tools=[SEARCH], tool_choice={"type": "tool", "name": ["web_search"]}), "tool_choice.name"),
    (MESSAGES, msg(tools=[{**SEARCH, "allowed_domains": ["a.example", 5]}]), "tools.0.allowed_domains[1]"),
    (MESSAGES, msg(tools=[SEARCH], stream="yes"), "stream"),
    (MESSAGES + "/count_tokens", msg(tools=[{"type": "web_fetch_20250910", "name": "web_fetch", "blocked_domains": [{}]}]),
     "tools.0.blocked_domains[0]"),
    (RESPONSES, resp(tools=[{"type": "web_search"}, {"type": ["function"], "name": "f"}]), "tools[1].type"),
    (RESPONSES, resp(tools=[{"type": "web_search"}], tool_choice={"type": ["web_search"]}), "tool_choice.type"),
    (RESPONSES, resp(tools=[{"type": "web_search"}],
                     tool_choice={"type": "allowed_tools", "mode": "auto", "tools": [{"type": {"a": 1}}]}),
     "tool_choice.tools[0].type"),
    (RESPONSES, resp(tools=[{"type": "web_search", "filters": {"allowed_domains": 5}}]), "tools[0].filters.allowed_domains"),
    (RESPONSES, resp(tools=[{"type": "web_search", "filters": {"allowed_domains": "a.example"}}]),
     "tools[0].filters.allowed_domains"),
    (RESPONSES, resp(tools=[{"type": "web_search"}, {"type": "namespace", "name": "web", "tools": 5}]), "tools[1].tools"),
    (RESPONSES, resp(input=[{"type": "web_search_call", "id": "ws_1", "status": "completed",
                             "action": {"type": "search", "query": "q", "sources": 5}}]), "input[0].action.sources"),
    (RESPONSES, resp(input=[{"type": "web_search_call", "action": {"type": "search", "query": ["q"]}}]),
     "input[0].action.query"),
]


@pytest.mark.parametrize("route, body, param", REFUSED)
def test_a_field_the_proxy_reads_of_the_wrong_type_is_a_400_naming_it(proxy, backend, route, body, param):
    status, _, raw = raw_request(proxy.url, "POST", route, json.dumps(body).encode(), {"Content-Type": "application/json"})
    doc = json.loads(raw)
    assert status == 400, raw
    if route.startswith(MESSAGES):  # Anthropic's shape, the field first as Anthropic writes it
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        assert doc["error"]["message"].startswith(f"{param}: must be "), doc
    else:
        assert doc["error"] == {"message": doc["error"]["message"], "type": "invalid_request_error", "param": param,
                                "code": 400}
        assert doc["error"]["message"].startswith(f"`{param}` must be "), doc
    assert backend.received == []


# Fields the proxy does not read on this request: relayed for vLLM to judge (chat adds its tools, and
# the rest as sent; the other routes byte for byte, having no server tool to play).
RELAYED = [
    (CHAT, chat(tools=[FN], metadata=[1], max_tokens="5"), json_reply(completion(content="ok"))),
    (MESSAGES, msg(messages=history({"type": ["server_tool_use"], "id": "x"})), aw.message_reply([aw.text("ok")])),
    (MESSAGES, msg(max_tokens="5", system=5), aw.message_reply([aw.text("ok")])),
    (RESPONSES, resp(tools=[{"type": ["web_search"]}]), rw.json_reply(rw.body({}, [rw.message("ok")]))),
    (RESPONSES, resp(input=[{"type": "message", "role": "user", "content": 5}], max_output_tokens=[]),
     rw.json_reply(rw.body({}, [rw.message("ok")]))),
]


@pytest.mark.parametrize("route, body, reply", RELAYED)
def test_a_field_only_relayed_reaches_vllm_untouched(proxy, backend, route, body, reply):
    backend.script(reply)
    sent = json.dumps(body).encode()
    status, _, raw = raw_request(proxy.url, "POST", route, sent, {"Content-Type": "application/json"})
    assert (status, raw) == (200, reply.body)
    got = backend.received[0]
    if route == CHAT:
        assert {k: v for k, v in got.json().items() if k != "tools"} == {k: v for k, v in body.items() if k != "tools"}
    else:
        assert got.body == sent


def test_a_replayed_result_with_mangled_stored_content_is_read_not_refused(proxy, backend, searxng):
    """encrypted_content is the proxy's own base64: a client's in its place is read as far as it goes."""
    stored = base64.b64encode(json.dumps({"snippet": 5, "answers": 5, "infoboxes": [{"a": 1}]}).encode()).decode()
    block = {**WSTR, "content": [{**WSTR["content"][0], "encrypted_content": stored, "page_age": 7}]}
    backend.script(aw.message_reply([aw.text("ok")]))
    status, _, raw = raw_request(proxy.url, "POST", MESSAGES, json.dumps(msg(messages=history(STU, block))).encode())
    assert status == 200, raw
    result = backend.received[0].json()["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and "Infobox: {'a': 1}" in result["content"] and "Snippet: 5" in result["content"]


@pytest.mark.parametrize("check, value, expected, message", [
    (V.string, 5, None, "`p` must be a string, not a number."),
    (V.string, None, None, None),
    (V.strings, ["a", None], None, "`p[1]` must be a string, not null."),
    (V.strings, "a", None, "`p` must be an array of strings, not a string."),
    (V.objects, [{}, []], None, "`p[1]` must be an object, not an array."),
    (V.obj, None, {}, None),
    (V.obj, True, None, "`p` must be an object, not a boolean."),
    (V.boolean, "yes", None, "`p` must be true or false, not a string."),
])
def test_the_checks(check, value, expected, message):
    if message is None:
        assert check(value, "p") == expected
    else:
        with pytest.raises(V.Invalid) as e:
            check(value, "p")
        assert e.value.openai_message == message and e.value.param.startswith("p")


@pytest.mark.parametrize("value, expected", [({"type": "text"}, "text"), ({"type": ["text"]}, None), ({}, None),
                                             (["text"], None), ("text", None)])
def test_kind_is_a_string_or_none(value, expected):
    assert V.kind(value) == expected
