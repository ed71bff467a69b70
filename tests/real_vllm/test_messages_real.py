"""Claude Code's web_search server tool on /v1/messages through the proxy against the real vLLM server (issue 10's real-vLLM items), driven by the official anthropic SDK; run with `tests/run.sh tests/real_vllm/test_messages_real.py`.

vLLM's Messages route has no structured_outputs or logit_bias (the first test pins that down),
so the random model can't be made to call the search tool there. The searching tests use
Claude Code's own search sub-request instead (`Perform a web search for the query: <q>`),
which the proxy searches directly and then hands to the model for its summary. A recording
pass-through between the proxy and vLLM shows what vLLM really received.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clients import anthropic
from realvllm import FORCED_CALL, MODEL, QUERY
from test_client_errors import shape_problem

from proxy.apis.messages.presentation import server_blocks
from proxy.apis.messages.request import rewrite
from proxy.tools.web_search import QUERY_SCHEMA, TOOL_DESCRIPTION
from standins.rawhttp import raw_request

pytestmark = pytest.mark.real_vllm

MESSAGES = "/v1/messages"
SERVER_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}
SYSTEM = "You are an assistant for performing a web search tool use"
ASK = [{"role": "user", "content": f"Perform a web search for the query: {QUERY}"}]
ORDINARY_TOOL = {"name": "web_search", "description": "Search the web.",
                 "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


def sdk(proxy) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="dummy", max_retries=0, timeout=60)


def claude_code_search(**kw) -> dict:
    """Claude Code's search sub-request (tests/data/agent-wire/claude-code-2.1.332-websearch.json:
    the same tool, tool_choice and user message; a one-line system prompt), with a max_tokens the
    tiny model's context fits."""
    body = {"model": MODEL, "max_tokens": 16, "system": SYSTEM, "messages": ASK, "tools": [SERVER_TOOL],
            "tool_choice": {"type": "auto"}, "stream": True}
    body.update(kw)
    return body


def anthropic_headers() -> dict:
    return {"x-api-key": "dummy", "anthropic-version": "2023-06-01"}


def test_vllm_messages_ignore_structured_outputs_and_logit_bias(real_vllm, http_client):
    """Why the searching tests below use the sub-request: the fields that force a call on
    chat completions and Responses are dropped by vLLM 0.32's Messages route."""
    bias = {str(real_vllm.token_id(t)): 100 for t in ("<tool_call>", "</tool_call>")}
    body = {"model": MODEL, "max_tokens": 48, "temperature": 0, "messages": [{"role": "user", "content": "Say something."}],
            "tools": [ORDINARY_TOOL], "structured_outputs": {"regex": re.escape(FORCED_CALL)},
            "logit_bias": bias, "chat_template_kwargs": {"enable_thinking": False}}
    reply = http_client.post(real_vllm.url + MESSAGES, body)
    assert reply.status == 200, reply.body[:500]
    assert [b["type"] for b in reply.json()["content"]] == ["text"]


def test_claude_code_search_request_is_rejected_by_vllm_alone(real_vllm, http_client):
    reply = http_client.post(real_vllm.url + MESSAGES + "?beta=true", claude_code_search(), headers=anthropic_headers())
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "body.tools.0.input_schema"


def test_claude_code_search_request_through_the_proxy(tapped, searxng):
    proxy, tap = tapped
    body = claude_code_search()
    kw = {k: v for k, v in body.items() if k != "stream"}
    # The path Claude Code calls (the SDK adds no query string of its own); the beta
    # accumulator checks that every event fits the message built so far.
    with sdk(proxy).beta.messages.stream(**kw, extra_query={"beta": "true"}) as stream:
        events = [event.type for event in stream]
        msg = stream.get_final_message()
    assert [events.count(t) for t in ("message_start", "message_delta", "message_stop")] == [1, 1, 1]
    assert events[-1] == "message_stop"

    kinds = [b.type for b in msg.content]
    assert kinds[:2] == ["server_tool_use", "web_search_tool_result"], kinds
    # The model's own summary follows (thinking, as Claude Code sends no `thinking` field and
    # the template thinks by default, or text); nothing of the internal tool call leaks.
    assert kinds[2:] and set(kinds[2:]) <= {"thinking", "text"}, kinds
    use, result = msg.content[:2]
    assert use.id.startswith("srvtoolu_") and use.name == "web_search" and use.input == {"query": QUERY}
    assert result.tool_use_id == use.id
    assert [r.url for r in result.content] == [f"https://example.org/{QUERY}/{i}" for i in (1, 2, 3)]
    assert msg.usage.server_tool_use.web_search_requests == 1
    assert searxng.queries == [QUERY]

    # The proxy searched the sub-request's query itself; vLLM got one streaming request: the
    # rewritten tool, and the search as an ordinary tool_use with its tool_result.
    ((path, sent),) = tap.bodies(MESSAGES)
    assert path == MESSAGES + "?beta=true"
    assert sent["stream"] is True and sent["system"] == SYSTEM
    assert sent["tools"] == [{"name": "web_search", "description": TOOL_DESCRIPTION, "input_schema": QUERY_SCHEMA}]
    user, assistant, results = sent["messages"]
    assert user == ASK[0]
    (call,) = assistant["content"]
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "web_search", {"query": QUERY})
    (tool_result,) = results["content"]
    assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == call["id"]
    assert f"{QUERY} — result 1" in tool_result["content"]


def first_search(proxy, http_client) -> dict:
    """The client's message for a real search through the proxy (not streamed)."""
    reply = http_client.post(proxy.url + MESSAGES + "?beta=true", claude_code_search(stream=False),
                             headers=anthropic_headers())
    assert reply.status == 200, reply.body[:500]
    return reply.json()


@pytest.mark.parametrize("with_tool", [False, True], ids=["history-only", "with-server-tool"])
def test_replayed_server_blocks(real_vllm, tapped, searxng, http_client, with_tool):
    proxy, tap = tapped
    message = first_search(proxy, http_client)
    assert [b["type"] for b in message["content"]][:2] == ["server_tool_use", "web_search_tool_result"]
    ((_, first_turn),) = tap.bodies(MESSAGES)
    read_first_time = first_turn["messages"][-1]["content"]

    history = {"model": MODEL, "max_tokens": 8,
               "messages": [*ASK, {"role": "assistant", "content": message["content"]},
                            {"role": "user", "content": "Thanks. Say more."}]}
    if with_tool:
        history["tools"] = [SERVER_TOOL]
    direct = http_client.post(real_vllm.url + MESSAGES, history, headers=anthropic_headers())
    assert direct.status == 400
    assert "server_tool_use" in direct.json()["error"]["message"]

    reply = http_client.post(proxy.url + MESSAGES, history, headers=anthropic_headers())
    assert reply.status == 200, reply.body[:500]
    assert reply.json()["type"] == "message" and reply.json()["content"]
    # vLLM got blocks it accepts, and the model reads the same results as the first time.
    _, replayed = tap.bodies(MESSAGES)[-1]
    blocks = [b for m in replayed["messages"] if isinstance(m["content"], list) for b in m["content"]]
    assert not {b["type"] for b in blocks} & server_blocks()
    (call,) = [b for b in blocks if b["type"] == "tool_use"]
    (result,) = [b for b in blocks if b["type"] == "tool_result"]
    assert call["input"] == {"query": QUERY} and result["tool_use_id"] == call["id"]
    assert [result["content"]] == [b["content"] for b in read_first_time]
    assert searxng.queries == [QUERY]  # the first search only: a replay searches nothing


def test_count_tokens_with_the_server_tool(real_vllm, tapped, http_client):
    proxy, tap = tapped
    body = {"model": MODEL, "system": SYSTEM, "messages": ASK, "tools": [SERVER_TOOL]}
    direct = http_client.post(real_vllm.url + MESSAGES + "/count_tokens", body, headers=anthropic_headers())
    assert direct.status == 400
    assert direct.json()["error"]["param"] == "body.tools.0.input_schema"

    counted = sdk(proxy).messages.count_tokens(**body)
    # The count is vLLM's own for the request the proxy really sends to the model.
    rewritten, _ = rewrite(body)
    expected = http_client.post(real_vllm.url + MESSAGES + "/count_tokens", rewritten, headers=anthropic_headers())
    assert expected.status == 200, expected.body[:500]
    assert counted.input_tokens == expected.json()["input_tokens"] > 0
    ((path, sent),) = tap.bodies(MESSAGES)
    assert path == MESSAGES + "/count_tokens" and sent == rewritten


def webfetch_summary_request() -> tuple[dict, dict]:
    """Claude Code 2.1.332's WebFetch summary request as captured (tests/data/agent-wire/
    claude-code-2.1.332-webfetch.json): `tools: []`, a system list, `output_config`, `metadata`;
    only the model name and a max_tokens the tiny model's context fits are changed."""
    capture = json.loads((Path(__file__).resolve().parent.parent / "data" / "agent-wire"
                          / "claude-code-2.1.332-webfetch.json").read_text())
    (record,) = [r for r in capture if r["body"].get("tools") == []]
    headers = {n: v for n, v in record["headers"] if n.lower() in ("anthropic-version", "anthropic-beta", "x-api-key")}
    return {**record["body"], "model": MODEL, "max_tokens": 16}, headers


def test_claude_code_webfetch_summary_is_relayed_to_vllm(real_vllm, tapped, http_client):
    """WebFetch's summary request carries no server tool, so the proxy relays it byte for byte,
    and the real vLLM accepts its shape (an empty tools list included) and streams an answer."""
    proxy, tap = tapped
    body, headers = webfetch_summary_request()
    raw = json.dumps(body).encode()
    reply = http_client.post(proxy.url + MESSAGES + "?beta=true", raw, headers=headers)
    assert reply.status == 200, reply.body[:500]
    events = re.findall(r"^event: (\S+)$", reply.body.decode(), re.M)
    assert events[0] == "message_start" and events[-1] == "message_stop"
    ((path, sent),) = tap.bodies(MESSAGES)
    assert path == MESSAGES + "?beta=true" and sent == body
    assert "Web page content:" in sent["messages"][0]["content"][0]["text"]


# What the real vLLM answers on its Messages paths for a body it refuses (issue 55): OpenAI's shape (or FastAPI's
# {"detail": ...}), which the proxy must hand Claude Code in Anthropic's, with vLLM's status.
REFUSED_BY_VLLM = [
    # (target, body)
    (MESSAGES, b"[]"),
    (MESSAGES, b'"text"'),
    (MESSAGES, json.dumps({"model": MODEL, "max_tokens": 5}).encode()),
    (MESSAGES, json.dumps({"model": MODEL, "max_tokens": 5, "stream": True}).encode()),
    (MESSAGES + "/count_tokens", json.dumps({"model": MODEL}).encode()),
    (MESSAGES + "/batches", json.dumps({"model": MODEL, "max_tokens": 5, "messages": ASK}).encode()),
    (MESSAGES + "?beta=true", b"{not json"),
]


@pytest.mark.parametrize("target, body", REFUSED_BY_VLLM, ids=[f"{t}-{b[:16]!r}" for t, b in REFUSED_BY_VLLM])
def test_vllms_own_errors_reach_claude_code_in_anthropics_shape(tapped, target, body):
    proxy, tap = tapped
    status, _, data = raw_request(proxy.url, "POST", target, body, {"Content-Type": "application/json", **anthropic_headers()})
    assert [s for _, _, s, _ in tap.exchanges] == [status] and 400 <= status < 500, (status, data[:300])
    vllm_wrote = tap.exchanges[0][3]
    assert not vllm_wrote.startswith(b'{"type":"error"'), "vLLM wrote Anthropic's shape itself: the row tests nothing"
    assert shape_problem(MESSAGES, status, data) is None, (shape_problem(MESSAGES, status, data), vllm_wrote[:300])


def test_a_trailing_slash_is_redirected_back_through_the_proxy(tapped):
    """vLLM redirects `POST /v1/messages/` to `/v1/messages` at its own address; the client must stay on the proxy."""
    proxy, tap = tapped
    body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": ASK}).encode()
    status, headers, _ = raw_request(proxy.url, "POST", MESSAGES + "/", body, {"Content-Type": "application/json"})
    assert tap.exchanges[0][2] == status == 307
    assert headers["location"] == MESSAGES
