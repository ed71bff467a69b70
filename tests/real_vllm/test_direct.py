"""Sanity tests straight against the real vLLM server (tiny model, compose flags); run with `tests/run.sh tests/real_vllm`.

They pin down the behaviour that the proxy tests and the stand-ins rely on: the served name and
context, the qwen3 reasoning split, a forced qwen3_coder tool call, seeded repeatability and
vLLM's own error bodies. If one fails, the stand-ins or the compose flags have drifted from
the real server.
"""
import json
import re

import pytest
from realvllm import CPU_MAX_MODEL_LEN, MODEL, QUERY, WEB_SEARCH, chat, forced_call_request

from proxy.apis.chat.rules import assistant_turn, tool_results
from proxy.backends.search.search import SearchOutcome

pytestmark = pytest.mark.real_vllm


def test_models_lists_the_served_name_with_the_cpu_context(real_vllm, http_client):
    reply = http_client.get(real_vllm.url + "/v1/models")
    assert reply.status == 200
    (model,) = reply.json()["data"]
    assert model["id"] == MODEL
    assert model["root"] == str(real_vllm.model_dir)
    assert model["max_model_len"] == CPU_MAX_MODEL_LEN


def test_health_is_200_with_an_empty_body(real_vllm, http_client):
    reply = http_client.get(real_vllm.url + "/health")
    assert (reply.status, reply.body) == (200, b"")


def test_version_is_the_pinned_release(real_vllm, http_client):
    reply = http_client.get(real_vllm.url + "/version")
    assert reply.status == 200
    assert reply.json() == {"version": "0.32.0"}


def test_flags_from_compose_reach_the_server(real_vllm):
    """The fixture really passed the compose file's model-independent flags."""
    argv = real_vllm.argv
    for flag in ("--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice",
                 "--enable-prefix-caching", "--served-model-name"):
        assert flag in argv
    assert "--gpu-memory-utilization" not in argv
    assert argv[argv.index("--dtype") + 1] == "float32"


def test_thinking_off_puts_everything_in_content(real_vllm, http_client):
    reply = http_client.post(real_vllm.url + "/v1/chat/completions",
                             chat(seed=7, chat_template_kwargs={"enable_thinking": False}))
    assert reply.status == 200, reply.body
    message = reply.json()["choices"][0]["message"]
    assert message["reasoning"] is None
    assert message["content"]


def test_thinking_on_without_end_tag_is_all_reasoning(real_vllm, http_client):
    """The qwen3 parser treats output before </think> as reasoning; with the tag banned it
    never ends, so content stays null (what a proxy must relay unchanged)."""
    ban_end = {str(real_vllm.token_id("</think>")): -100}
    reply = http_client.post(real_vllm.url + "/v1/chat/completions", chat(seed=7, logit_bias=ban_end))
    assert reply.status == 200, reply.body
    message = reply.json()["choices"][0]["message"]
    assert message["reasoning"]
    assert message["content"] is None
    assert reply.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 16


def test_thinking_on_splits_reasoning_from_content(real_vllm, http_client):
    """A raised </think> ends the trace early: reasoning before it, content after, and the
    tag itself in neither."""
    end = {str(real_vllm.token_id("</think>")): 6}
    reply = http_client.post(real_vllm.url + "/v1/chat/completions",
                             chat(seed=7, max_tokens=32, logit_bias=end))
    assert reply.status == 200, reply.body
    message = reply.json()["choices"][0]["message"]
    assert message["reasoning"] and message["content"], message
    assert "</think>" not in message["reasoning"] + message["content"]


def test_forced_tool_call_is_parsed_into_tool_calls(real_vllm, http_client):
    reply = http_client.post(real_vllm.url + "/v1/chat/completions", forced_call_request(real_vllm))
    assert reply.status == 200, reply.body
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", call["id"])
    assert call["type"] == "function"
    assert call["function"]["name"] == "web_search"
    # A JSON string as Python's json.dumps writes it; clients and the proxy must parse it.
    assert call["function"]["arguments"] == json.dumps({"query": QUERY})
    assert not choice["message"]["content"]


def test_forced_tool_call_streams_as_tool_call_deltas(real_vllm, http_client):
    status, events = http_client.sse(
        real_vllm.url + "/v1/chat/completions",
        forced_call_request(real_vllm, stream=True, stream_options={"include_usage": True}))
    assert status == 200
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    # The bias keeps the markup out of content: no "<tool_call>" text reaches the client.
    assert not "".join(d.get("content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "web_search" and calls[0]["id"].startswith("chatcmpl-tool-")
    assert json.loads("".join(tc["function"].get("arguments", "") for tc in calls)) == {"query": QUERY}
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finals[-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_tool_result_turn_is_accepted(real_vllm, http_client):
    """The message shapes the proxy sends back after a search (assistant call + tool result)
    go through the real chat template."""
    first = http_client.post(real_vllm.url + "/v1/chat/completions", forced_call_request(real_vllm)).json()
    call = first["choices"][0]["message"]["tool_calls"][0]
    body = chat(seed=3, tools=[WEB_SEARCH], chat_template_kwargs={"enable_thinking": False})
    body["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps([{"title": "t", "url": "u"}])},
    ]
    reply = http_client.post(real_vllm.url + "/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    assert reply.json()["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]


def test_assistant_turn_with_reasoning_is_accepted(real_vllm, http_client):
    """With thinking on, the proxy appends the assistant turn with its `reasoning` (built by
    proxy.apis.chat.rules.assistant_turn from vLLM's own message); vLLM must take it back as input."""
    first = http_client.post(real_vllm.url + "/v1/chat/completions", forced_call_request(real_vllm)).json()
    message = {**first["choices"][0]["message"], "reasoning": "I should look this up."}
    calls = message["tool_calls"]
    body = chat(seed=3, tools=[WEB_SEARCH])
    body["messages"] += [assistant_turn(message)] + tool_results(calls, [SearchOutcome("hello", "empty", message="No results")])
    assert body["messages"][-2]["reasoning"] == "I should look this up."
    reply = http_client.post(real_vllm.url + "/v1/chat/completions", body)
    assert reply.status == 200, reply.body


def test_seeded_sampling_repeats_exactly(real_vllm, http_client):
    url = real_vllm.url + "/v1/chat/completions"
    first, again, other = (http_client.post(url, chat(seed=s, temperature=1.0, max_tokens=24)).json()
                           for s in (11, 11, 12))

    def text(reply):
        message = reply["choices"][0]["message"]
        return message["reasoning"], message["content"]

    assert text(first) == text(again)
    assert text(first) != text(other)


def test_streaming_equals_non_streaming_for_the_same_seed(real_vllm, http_client):
    url = real_vllm.url + "/v1/chat/completions"
    body = chat(seed=5, max_tokens=24, chat_template_kwargs={"enable_thinking": False})
    whole = http_client.post(url, body).json()["choices"][0]["message"]["content"]
    status, events = http_client.sse(url, {**body, "stream": True})
    assert status == 200 and events[-1] == "[DONE]"
    pieces = [json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]]
    assert "".join(pieces) == whole


def test_wrong_model_is_404_not_found(real_vllm, http_client):
    reply = http_client.post(real_vllm.url + "/v1/chat/completions", {**chat(), "model": "nope"})
    assert reply.status == 404
    error = reply.json()["error"]
    assert error["type"] == "NotFoundError" and error["param"] == "model" and error["code"] == 404
    assert error["message"] == f"The model `nope` does not exist. Valid aliases: {MODEL}."


def test_max_tokens_beyond_the_context_is_400(real_vllm, http_client):
    reply = http_client.post(real_vllm.url + "/v1/chat/completions", chat(max_tokens=100_000))
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
