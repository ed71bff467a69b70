"""Codex's hosted web_search on /v1/responses through the proxy against the real vLLM server (issue 11's real-vLLM items), driven by the official openai SDK; run with `tests/run.sh tests/real_vllm/test_responses_real.py`.

The random model is made to call `web_search` with the same structured_outputs regex and
logit_bias as on chat completions (realvllm.forced_call_request), passed as vLLM extra fields
through the proxy. A recording pass-through between the proxy and vLLM shows what vLLM
really received on each turn.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clients import openai
from realvllm import FORCED_CALL, MODEL, QUERY

pytestmark = pytest.mark.real_vllm

RESPONSES = "/v1/responses"
HOSTED = {"type": "web_search", "external_web_access": False}
FORCING = ("structured_outputs", "logit_bias")


def unforce_after_search(body: dict) -> dict | None:
    """Drop the forcing fields from a turn that already carries a search result: the proxy
    rightly repeats every client field on every turn, so a forced model would search until
    MAX_SEARCH_ITER and never answer."""
    if any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in body.get("input") or []):
        return {k: v for k, v in body.items() if k not in FORCING}
    return None


def client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0, timeout=60)


def codex_request(**kw) -> dict:
    """What Codex 0.171.0 sends (tests/data/agent-wire/codex-0.171.0-websearch.json), small enough for the tiny model."""
    body = {"model": MODEL, "instructions": "You are Codex, a coding agent.",
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "Look up hello."}]}],
            "tools": [HOSTED], "tool_choice": "auto", "parallel_tool_calls": True,
            "reasoning": {"summary": "auto"}, "store": False,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "real-vllm-test",
            "max_output_tokens": 48}
    body.update(kw)
    return body


def forcing(real_vllm) -> dict:
    """vLLM extra fields that make the random model write FORCED_CALL (see realvllm.forced_call_request);
    seeded so the unforced answer turn repeats too."""
    bias = {str(real_vllm.token_id(t)): 100 for t in ("<tool_call>", "</tool_call>")}
    return {"structured_outputs": {"regex": re.escape(FORCED_CALL)}, "logit_bias": bias,
            "chat_template_kwargs": {"enable_thinking": False}, "seed": 11}


def vllm_response(status: int, data: bytes) -> dict:
    """One vLLM answer's response object: plain JSON, or a stream's final event."""
    assert status == 200, data[:500]
    if data.lstrip().startswith(b"{"):
        return json.loads(data)
    events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: {")]
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]["type"]
    return events[-1]["response"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_codex_search_runs_the_models_query_and_feeds_the_result_back(real_vllm, tapped, searxng, stream):
    proxy, t = tapped
    t.outgoing = unforce_after_search
    body = codex_request(stream=stream)
    extra = forcing(real_vllm)
    c = client(proxy)
    kw = {k: v for k, v in body.items() if k != "stream"}
    if stream:
        events = list(c.responses.create(**kw, stream=True, extra_body=extra))
        types = [e.type for e in events]
        assert [types.count(ty) for ty in ("response.created", "response.in_progress", "response.completed")] == [1, 1, 1]
        assert types[-1] == "response.completed"
        # The internal function call never reaches Codex; the search shows as its own events.
        assert not [ty for ty in types if ty.startswith("response.function_call_arguments")]
        assert types[2:7] == ["response.output_item.added", "response.web_search_call.in_progress",
                              "response.web_search_call.searching", "response.web_search_call.completed",
                              "response.output_item.done"]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        response = events[-1].response
    else:
        response = c.responses.create(**kw, extra_body=extra)

    # vLLM saw the hosted tool as a function tool, and the forced call was the model's query.
    first, second = [b for _, b in t.bodies(RESPONSES)]
    # The hosted tool reads pages too: its search, then web_fetch and find_in_page (tests/test_responses_fetch.py).
    assert [t["name"] for t in first["tools"]] == ["web_search", "web_fetch", "find_in_page"]
    assert all(sorted(t) == ["description", "name", "parameters", "type"] and t["type"] == "function" for t in first["tools"])
    assert first["tools"][0]["parameters"]["required"] == ["query"]
    assert first["store"] is False and first["structured_outputs"] == extra["structured_outputs"]
    assert searxng.queries == [QUERY]
    # The next turn is the first one's input plus the model's call and its output.
    assert second["input"][:len(first["input"])] == first["input"]
    call, output = second["input"][len(first["input"]):]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == ("function_call", "web_search", {"query": QUERY})
    assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
    assert f"{QUERY} — result 1" in output["output"] and f"https://example.org/{QUERY}/1" in output["output"]
    # The proxy forwards the forcing fields on every turn; only the tap dropped them here.
    assert second["structured_outputs"] == extra["structured_outputs"]

    kinds = [item.type for item in response.output]
    assert "function_call" not in kinds
    assert kinds[0] == "web_search_call" and kinds[-1] == "message", kinds
    ws = response.output[0]
    assert ws.status == "completed" and ws.action.type == "search" and ws.action.query == QUERY
    assert ws.id.startswith("ws_")
    assert [t.model_dump(exclude_none=True) for t in response.tools] == [HOSTED]
    turns = [vllm_response(status, data) for path, _, status, data in t.exchanges if path == RESPONSES]
    assert len(turns) == 2
    # The answer turn runs to max_output_tokens on the random model ("incomplete"): the
    # client gets the last turn's status, the first turn's id, and usage over both turns.
    assert response.status == turns[1]["status"]
    assert response.id == turns[0]["id"]
    assert response.usage.input_tokens == sum(u["usage"]["input_tokens"] for u in turns)
    assert response.usage.output_tokens == sum(u["usage"]["output_tokens"] for u in turns)


REPLAYED = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Look up hello."}]},
    # As Codex replays it: no id.
    {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": QUERY}},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Found it."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks. And now?"}]},
]


def test_replayed_web_search_call_is_rejected_by_vllm_alone(real_vllm, http_client):
    reply = http_client.post(real_vllm.url + RESPONSES, codex_request(input=REPLAYED, max_output_tokens=8))
    assert reply.status == 400, reply.body[:500]
    assert "web_search_call" in reply.json()["error"]["message"]


def test_replayed_web_search_call_is_accepted_through_the_proxy(tapped, searxng):
    proxy, t = tapped
    body = codex_request(input=REPLAYED, max_output_tokens=8)
    response = client(proxy).responses.create(**body, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert response.status in ("completed", "incomplete")
    assert response.output and "function_call" not in [i.type for i in response.output]
    (sent,) = [b for _, b in t.bodies(RESPONSES)]
    kinds = [i.get("type") for i in sent["input"]]
    assert "web_search_call" not in kinds
    call, output = sent["input"][1:3]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == ("function_call", "web_search", {"query": QUERY})
    assert output == {"type": "function_call_output", "call_id": call["call_id"], "output": output["output"]}
    assert QUERY in output["output"]
    assert sent["input"][3:] == REPLAYED[2:]
    assert searxng.queries == []  # an earlier search is replayed, not run again


def standalone_followup() -> dict:
    """Codex 0.171.0's turn after a web.run call in standalone-search mode (tests/data/agent-wire/
    codex-0.171.0-alpha-search.json, third request), cut down for the tiny model: the `web`
    namespace tool (its 7.5k-character description and its parameters cut to two commands), the user message, the namespaced
    function_call and its function_call_output (a list of input_text parts, as Codex sends it)."""
    capture = json.loads((Path(__file__).resolve().parent.parent / "data" / "agent-wire"
                          / "codex-0.171.0-alpha-search.json").read_text())
    sent = [r["body"] for r in capture if r["target"] == RESPONSES][-1]
    (web,) = [t for t in sent["tools"] if t.get("type") == "namespace" and t.get("name") == "web"]
    # Only the search_query and open parameters: the whole schema alone fills much of the tiny model's context.
    web = {**web, "tools": [{**t, "description": "Tool for accessing the internet.",
                             "parameters": {**t["parameters"], "properties": {
                                 k: v for k, v in t["parameters"]["properties"].items() if k in ("search_query", "open")}}}
                            for t in web["tools"]]}
    user = next(i for i in sent["input"] if i.get("role") == "user" and "vLLM 0.32" in json.dumps(i))
    call = next(i for i in sent["input"] if i.get("type") == "function_call")
    output = next(i for i in sent["input"] if i.get("type") == "function_call_output")
    output = {**output, "output": [{"type": "input_text", "text": output["output"][0]["text"][:600]}]}
    assert call["namespace"] == "web" and call["name"] == "run"
    return {"model": MODEL, "instructions": "You are Codex, a coding agent.", "input": [user, call, output],
            "tools": [web], "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
            "store": False, "stream": True, "include": ["reasoning.encrypted_content"], "max_output_tokens": 16}


def test_codex_standalone_followup_is_relayed_and_accepted_by_vllm(real_vllm, tapped, http_client):
    """No hosted tool, so the proxy relays the turn byte for byte; the real vLLM takes the
    namespace tool and the namespaced call in the history and streams an answer."""
    proxy, tap = tapped
    body = standalone_followup()
    reply = http_client.post(proxy.url + RESPONSES, body)
    assert reply.status == 200, reply.body[:800]
    events = re.findall(r"^event: (\S+)$", reply.body.decode(), re.M)
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete"), events[-3:]
    ((path, sent),) = tap.bodies(RESPONSES)
    assert path == RESPONSES and sent == body
