"""Every answer the proxy gives loads strictly as the pinned SDKs' own types (issue 29): whole answers and every
streamed event of /v1/messages, /v1/responses and /v1/chat/completions, plain and streamed, with and without a
search or a fetch, validated with `Model.model_validate(obj, strict=True)` as a typed client or a schema check
sees them (the SDKs' own parsing is lenient and hides a missing field until someone reads it).

Run: tests/run.sh tests/test_sdk_types.py -q
"""
from __future__ import annotations

import json
import urllib.request

import pytest
from clients import anthropic, openai

from standins import anthropic_wire as W
from standins import responses_wire as w
from standins.vllm_wire import completion, sse_reply, stream_frames, tool_call
from standins.vllm_wire import json_reply as chat_json

SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}
FETCH = {"type": "web_fetch_20250910", "name": "web_fetch"}
ASK = [{"role": "user", "content": "What changed in vLLM 0.32?"}]
HOSTED = {"type": "web_search", "external_web_access": False}
PAGE = "<html><head><title>Notes</title></head><body><main><p>vLLM 0.32 adds a CPU backend.</p></main></body></html>"


def post(proxy, path: str, body: dict) -> bytes:
    req = urllib.request.Request(proxy.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "x-api-key": "k",
                                          "authorization": "Bearer k", "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        return r.read()


def strict(model, obj):
    """obj validated strictly as `model` (a pydantic model or a union type alias); the error names the field."""
    import pydantic
    return pydantic.TypeAdapter(model).validate_python(obj, strict=True)


def event_models(alias) -> dict:
    """An SDK's stream-event union as {event type: its model}, so each event is checked against its own type
    (a strict union check reports every member's complaint, hundreds of lines)."""
    import typing
    out = {}
    members = typing.get_args(alias)
    members = typing.get_args(members[0]) if members and typing.get_origin(members[0]) is typing.Union else members
    for model in members:
        for name in typing.get_args(model.model_fields["type"].annotation):
            out[name] = model
    return out


def strict_event(alias, event: dict):
    models = event_models(alias)
    assert event.get("type") in models, event
    return strict(models[event["type"]], event)


def sse_data(raw: bytes) -> list[dict]:
    """The JSON payload of every event of a stream (comments and [DONE] left out)."""
    out = []
    for frame in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                out.append(json.loads(line[5:]))
    return out


# ---- Anthropic Messages ----------------------------------------------------------------------

def _messages_turns(kind: str, stream: bool, site=None) -> tuple[list, list]:
    """(the vLLM turns to script, the request's tools) for one case."""
    reply = W.stream_reply if stream else W.message_reply
    if kind == "plain":
        return [reply([W.text("Hello.")])], [SEARCH]
    if kind == "subrequest":  # Claude Code's search sub-request: the proxy makes the first turn (and message_start)
        return [reply([W.text("Found it.")])], [SEARCH]
    if kind == "search":
        return [reply([W.tool_use("web_search", {"query": "vllm 0.32"})]),
                reply([W.text(["vLLM 0.32 ", "adds things."])])], [SEARCH]
    url = f"http://127.0.0.1:{site.port}/notes"
    return [reply([W.tool_use("web_fetch", {"url": url})]), reply([W.text("It adds a CPU backend.")])], [FETCH]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["plain", "search", "fetch", "subrequest"])
def test_messages_answers_load_strictly(start_proxy, backend, searxng, site, kind, stream):
    site.route("/notes", PAGE, headers={"Content-Type": "text/html"})
    proxy = start_proxy(WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8")
    turns, tools = _messages_turns(kind, stream, site)
    backend.script(*turns)
    ask = [{"role": "user", "content": "Perform a web search for the query: vllm 0.32"}] if kind == "subrequest" else ASK
    if kind == "fetch":  # the user gives the page, as web_fetch reads only URLs the conversation gave
        ask = [{"role": "user", "content": f"What do the notes at http://127.0.0.1:{site.port}/notes say?"}]
    body = {"model": "foundation", "max_tokens": 99, "messages": ask, "tools": tools, "stream": stream}
    raw = post(proxy, "/v1/messages", body)
    if not stream:
        msg = strict(anthropic.types.Message, json.loads(raw))
        strict(anthropic.types.beta.BetaMessage, json.loads(raw))  # Claude Code reads the beta types
    else:
        events = [e for e in sse_data(raw) if e.get("type") != "ping"]
        for e in events:
            strict_event(anthropic.types.RawMessageStreamEvent, e)
            strict_event(anthropic.types.beta.BetaRawMessageStreamEvent, e)
        backend.script(*_messages_turns(kind, stream, site)[0])  # the same answer again, through the SDK's accumulator
        with anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0).messages.stream(
                **{k: v for k, v in body.items() if k != "stream"}) as s:
            msg = s.get_final_message()
        msg = strict(anthropic.types.Message, msg.model_dump(exclude_unset=True))
    if kind != "plain":
        # Both counts, always: anthropic 2.16 requires web_search_requests and web_fetch_requests.
        assert (msg.usage.server_tool_use.web_search_requests, msg.usage.server_tool_use.web_fetch_requests) == \
               ((0, 1) if kind == "fetch" else (1, 0))


# ---- OpenAI Responses ------------------------------------------------------------------------

def _responses_turns(kind: str, site=None) -> list:
    if kind == "plain":
        return [[w.message("Hello.")]]
    if kind == "search":
        return [[w.reasoning("look"), w.call("web_search", {"query": "vllm 0.32"})], [w.message("It shipped.")]]
    return [[w.call("web_fetch", {"url": f"http://127.0.0.1:{site.port}/notes"})], [w.message("It adds a CPU backend.")]]


def _without_cache_write(turn_items: list):
    """A turn whose usage lacks input_tokens_details.cache_write_tokens, as vLLM builds without it send."""
    def build(request):
        use = w.default_usage(turn_items)
        del use["input_tokens_details"]["cache_write_tokens"]
        return w.answer(request, turn_items, use=use)
    return build


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["plain", "search", "fetch"])
def test_responses_answers_load_strictly(start_proxy, backend, searxng, site, kind, stream):
    site.route("/notes", PAGE, headers={"Content-Type": "text/html"})
    proxy = start_proxy(WEB_FETCH_ALLOWED_NETWORKS="127.0.0.0/8")
    turns = _responses_turns(kind, site)
    backend.responder = w.model(*[_without_cache_write(t) for t in turns])
    body = {"model": "foundation", "input": "What changed?", "tools": [HOSTED], "stream": stream}
    raw = post(proxy, "/v1/responses", body)
    if not stream:
        resp = strict(openai.types.responses.Response, json.loads(raw))
    else:
        events = sse_data(raw)
        for e in events:
            strict_event(openai.types.responses.ResponseStreamEvent, e)
        resp = strict(openai.types.responses.Response, events[-1]["response"])
        for e in events:
            if e["type"] in ("response.created", "response.in_progress"):
                strict(openai.types.responses.Response, e["response"])
    assert resp.usage.input_tokens_details.cache_write_tokens == 0
    assert resp.output[-1].type == "message"


# ---- OpenAI chat completions ---------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["plain", "search"])
def test_chat_answers_load_strictly(proxy, backend, searxng, kind, stream):
    calls = [tool_call("web_search", {"query": "vllm 0.32"})]
    if stream:
        turns = [stream_frames(tool_calls=calls, include_usage=True)] if kind == "search" else []
        backend.script(*[sse_reply(t) for t in turns + [stream_frames(content=["It ", "shipped."], include_usage=True)]])
    else:
        turns = [completion(tool_calls=calls)] if kind == "search" else []
        backend.script(*[chat_json(t) for t in turns + [completion(content="It shipped.")]])
    body = {"model": "foundation", "messages": ASK, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    raw = post(proxy, "/v1/chat/completions", body)
    if not stream:
        done = strict(openai.types.chat.ChatCompletion, json.loads(raw))
        assert done.choices[0].message.content == "It shipped."
    else:
        chunks = [strict(openai.types.chat.ChatCompletionChunk, c) for c in sse_data(raw)]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "It shipped."


def test_a_failed_responses_stream_loads_strictly(start_proxy, backend, searxng):
    """The search cap ends a stream with response.failed: the proxy's own response object, usage completed."""
    proxy = start_proxy(MAX_SEARCH_ITER="1")
    again = _without_cache_write([w.call("web_search", {"query": "again"})])
    backend.responder = w.model(again, again)
    events = sse_data(post(proxy, "/v1/responses", {"model": "foundation", "input": "hi", "tools": [HOSTED], "stream": True}))
    assert events[-1]["type"] == "response.failed"
    for e in events:
        strict_event(openai.types.responses.ResponseStreamEvent, e)
    assert events[-1]["response"]["usage"]["input_tokens_details"]["cache_write_tokens"] == 0
