"""The proxy (real gunicorn, tests/conftest.py's start_proxy) in front of the real vLLM server: relayed endpoints, completions equal to direct ones, the search loop and its cap, vLLM's errors, client disconnects; run with `tests/run.sh tests/real_vllm`.

The proxy adds its web_search tool to every chat request, so each "direct" request here carries
that same tool (proxy.apis.chat.rules.chat_tool("web_search")): both then render the same prompt, and seeded
sampling makes the two answers equal once ids and timestamps are set aside.
"""
from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse

import pytest
from realvllm import QUERY, Tap, chat, forced_call_request

from proxy.apis.chat.rules import chat_tool

pytestmark = pytest.mark.real_vllm

CHAT = "/v1/chat/completions"
MAX_SEARCH_ITER = 3


def scrub(value):
    """The JSON with per-request values (ids, creation times, and how much of the prompt the prefix cache served,
    which depends on what ran before: --enable-prompt-tokens-details) blanked out."""
    if isinstance(value, dict):
        return {k: "*" if k in ("id", "created", "prompt_tokens_details") else scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def direct_body(body: dict) -> dict:
    """What the proxy sends vLLM for a client body without tools: the same plus web_search and web_fetch."""
    return {**body, "tools": list(body.get("tools") or []) + [chat_tool("web_search"), chat_tool("web_fetch")]}


@pytest.fixture
def proxy_to_vllm(start_proxy, real_vllm):
    return start_proxy(BACKEND_URL=real_vllm.url, MAX_SEARCH_ITER=str(MAX_SEARCH_ITER))


@pytest.fixture
def tapped_proxy(start_proxy, real_vllm):
    tap = Tap(real_vllm.url)
    try:
        yield start_proxy(BACKEND_URL=tap.url, MAX_SEARCH_ITER=str(MAX_SEARCH_ITER)), tap
    finally:
        tap.close()


# ---- relayed as they are -------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/models", "/health", "/version", "/no/such/path"])
def test_other_endpoints_are_relayed_exactly(real_vllm, proxy_to_vllm, http_client, path):
    direct = http_client.get(real_vllm.url + path)
    relayed = http_client.get(proxy_to_vllm.url + path)
    assert relayed.status == direct.status
    if "content-type" in direct.headers:
        # (vLLM's /health sends none; the proxy currently adds Flask's text/html default there.)
        assert relayed.headers["content-type"] == direct.headers["content-type"]
    if path == "/v1/models":  # vLLM stamps each answer with the time and a fresh permission id
        assert scrub(relayed.json()) == scrub(direct.json())
    else:
        assert relayed.body == direct.body
    if path == "/no/such/path":
        assert relayed.status == 404


@pytest.mark.parametrize("body, status", [
    ({**chat(), "model": "nope"}, 404),
    (chat(max_tokens=100_000), 400),
])
def test_vllm_errors_are_relayed_unchanged(real_vllm, proxy_to_vllm, http_client, body, status):
    direct = http_client.post(real_vllm.url + CHAT, direct_body(body))
    relayed = http_client.post(proxy_to_vllm.url + CHAT, body)
    assert direct.status == status
    assert (relayed.status, relayed.body) == (direct.status, direct.body)


# ---- completions equal to direct ones ------------------------------------------------------

THINKING = {
    # Thinking off: the template closes an empty trace; everything is content.
    "thinking-off": {"chat_template_kwargs": {"enable_thinking": False}},
    # Thinking on: a raised </think> ends the trace early, so both fields have text.
    "thinking-on": {"chat_template_kwargs": {"enable_thinking": True}, "logit_bias": "THINK_END"},
}


def thinking_body(real_vllm, mode: str, **extra) -> dict:
    opts = dict(THINKING[mode])
    if opts.get("logit_bias") == "THINK_END":
        opts["logit_bias"] = {str(real_vllm.token_id("</think>")): 6}
    return chat(seed=5, max_tokens=32, **opts, **extra)


@pytest.mark.parametrize("mode", THINKING)
def test_completion_equals_direct(real_vllm, proxy_to_vllm, http_client, mode):
    body = thinking_body(real_vllm, mode)
    direct = http_client.post(real_vllm.url + CHAT, direct_body(body))
    relayed = http_client.post(proxy_to_vllm.url + CHAT, body)
    assert (relayed.status, direct.status) == (200, 200), relayed.body
    assert scrub(relayed.json()) == scrub(direct.json())
    message = relayed.json()["choices"][0]["message"]
    if mode == "thinking-off":
        assert message["reasoning"] is None and message["content"]
    else:
        assert message["reasoning"] and message["content"]


def sse_chunks(events: list[str]) -> list:
    assert events and events[-1] == "[DONE]", events[-3:]
    return [scrub(json.loads(e)) for e in events[:-1]]


def stream_summary(events: list[str]) -> tuple[dict, list]:
    """(the streamed text by field, every other event). How vLLM splits text into events
    depends on its own timing (a step that finds two tokens waiting sends them as one
    delta, and the last token may come with the finish_reason or before it), so two runs of one request can differ
    there and nowhere else."""
    text, other = {"content": "", "reasoning": ""}, []
    for c in sse_chunks(events):
        choice = c["choices"][0] if c["choices"] else {}
        delta = choice.get("delta") or {}
        for k in text:
            text[k] += delta.get(k) or ""
        rest = {k: v for k, v in delta.items() if k not in text}
        if rest or not delta or choice.get("finish_reason") is not None:
            # The event without its text: what must match event for event (ids, roles, finish reasons, usage).
            other.append({**c, "choices": [{**choice, "delta": rest}]} if c["choices"] else c)
    return text, other


@pytest.mark.parametrize("mode", THINKING)
def test_stream_equals_direct(real_vllm, proxy_to_vllm, http_client, mode):
    body = thinking_body(real_vllm, mode, stream=True, stream_options={"include_usage": True})
    direct_status, direct = http_client.sse(real_vllm.url + CHAT, direct_body(body))
    status, relayed = http_client.sse(proxy_to_vllm.url + CHAT, body)
    assert (status, direct_status) == (200, 200)
    assert stream_summary(relayed) == stream_summary(direct)
    text, _ = stream_summary(relayed)
    assert text["content"] and (bool(text["reasoning"]) == (mode == "thinking-on"))
    assert "usage" in sse_chunks(relayed)[-1]


# ---- the search loop against the real server ------------------------------------------------

def assert_loop_grew(tap: Tap, searxng):
    """vLLM saw the first request, then each later one longer by exactly the assistant's
    web_search call and the tool result with the stand-in SearXNG's results."""
    requests = [b for _, b in tap.bodies(CHAT)]
    assert len(requests) == MAX_SEARCH_ITER + 1
    first = requests[0]["messages"]
    assert [t["function"]["name"] for t in requests[0]["tools"]] == ["web_search", "web_fetch"]
    for n, req in enumerate(requests[1:], start=1):
        messages = req["messages"]
        assert messages[:len(first)] == first
        assert len(messages) == len(first) + 2 * n
        assistant, tool = messages[-2], messages[-1]
        (call,) = assistant["tool_calls"]
        assert assistant["role"] == "assistant"
        assert call["function"]["name"] == "web_search"
        assert json.loads(call["function"]["arguments"]) == {"query": QUERY}
        assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", call["id"])
        assert tool["role"] == "tool" and tool["tool_call_id"] == call["id"]
        assert f"{QUERY} — result 1" in tool["content"]
    # The model asks the same query every turn; the proxy searches it once and repeats it.
    assert searxng.queries == [QUERY]


def test_forced_search_runs_against_searxng_and_stops_at_the_cap(real_vllm, tapped_proxy, searxng, http_client):
    proxy, tap = tapped_proxy
    body = forced_call_request(real_vllm)
    del body["tools"]  # the client sends none: the call is to the proxy's injected web_search
    reply = http_client.post(proxy.url + CHAT, body)
    assert reply.status == 422, reply.body
    error = reply.json()["error"]
    assert error["type"] == "search_iterations_exceeded"
    assert error["message"] == f"{MAX_SEARCH_ITER} of {MAX_SEARCH_ITER} search rounds used (1 search, {MAX_SEARCH_ITER - 1} repeated, 0 empty)"
    assert_loop_grew(tap, searxng)
    assert all(status == 200 for _, _, status, _ in tap.exchanges)


def test_forced_search_in_a_stream_stops_at_the_cap(real_vllm, tapped_proxy, searxng, http_client):
    proxy, tap = tapped_proxy
    body = forced_call_request(real_vllm, stream=True, stream_options={"include_usage": True})
    del body["tools"]
    status, events = http_client.sse(proxy.url + CHAT, body)
    assert status == 200
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "search_iterations_exceeded" and error["code"] == 422
    # The forced calls themselves are searches, so none of their markup reaches the client.
    assert not any('"tool_calls"' in e for e in events)
    assert_loop_grew(tap, searxng)


# ---- citations ---------------------------------------------------------------------------------

CITED_ANSWER = "Per the first result [1], hello."


def answer_after_the_search(body: dict) -> dict | None:
    """The Tap's rewrite: once a tool result is in the conversation, the random model is held to an answer
    that cites source [1] (and the tool-call bias goes), so the second turn is the answer, not another call."""
    if not any(m.get("role") == "tool" for m in body.get("messages", [])):
        return None
    return {**body, "structured_outputs": {"regex": re.escape(CITED_ANSWER)}, "logit_bias": None}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_cited_answer_carries_a_url_citation(real_vllm, start_proxy, searxng, http_client, stream):
    """vLLM's real answer after a real search loop: its [1] becomes a url_citation on the first hit."""
    tap = Tap(real_vllm.url, outgoing=answer_after_the_search)
    try:
        proxy = start_proxy(BACKEND_URL=tap.url, MAX_SEARCH_ITER=str(MAX_SEARCH_ITER))
        body = forced_call_request(real_vllm, **({"stream": True} if stream else {}))
        del body["tools"]
        if stream:
            status, events = http_client.sse(proxy.url + CHAT, body)
            assert status == 200 and events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
            annotations = [a for c in chunks if c.get("choices") for a in c["choices"][0]["delta"].get("annotations") or []]
        else:
            reply = http_client.post(proxy.url + CHAT, body)
            assert reply.status == 200, reply.body
            message = reply.json()["choices"][0]["message"]
            text, annotations = message["content"], message.get("annotations") or []
    finally:
        tap.close()
    # The model read numbered results and was asked to cite them; what it wrote is what vLLM made.
    sent = [b for _, b in tap.bodies(CHAT)]
    assert "[1] " + QUERY + " — result 1" in sent[-1]["messages"][-1]["content"]
    assert text == CITED_ANSWER
    [a] = annotations
    assert a["type"] == "url_citation" and a["url_citation"]["url"] == f"https://example.org/{QUERY}/1"
    assert text[a["url_citation"]["start_index"]:a["url_citation"]["end_index"]] == "[1]"


# ---- a client that leaves --------------------------------------------------------------------

def metric(real_vllm, http_client, name: str) -> float:
    text = http_client.get(real_vllm.url + "/metrics").body.decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    return sum(values)


def test_client_disconnect_mid_stream_aborts_the_vllm_request(real_vllm, proxy_to_vllm, http_client):
    """With --max-num-seqs 1 a request nobody reads would hold the only slot; vLLM must see
    the disconnect through the proxy and abort it."""
    body = chat(seed=1, max_tokens=1900, ignore_eos=True, stream=True,
                chat_template_kwargs={"enable_thinking": False})
    parts = urllib.parse.urlsplit(proxy_to_vllm.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("POST", CHAT, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    request_id = None
    for _ in range(50):
        line = resp.fp.readline().decode()
        if line.startswith("data: {"):
            # The first event: the generation is under way. Hang up at once: the tiny model writes its ~1,400 tokens
            # in about 7 s, and a client that read on (or a loaded machine that starved it) could let vLLM finish
            # before the disconnect, which then has nothing left to abort (one CI run saw exactly that).
            request_id = json.loads(line[6:])["id"]
            break
    assert request_id and request_id.startswith("chatcmpl-")
    started = time.monotonic()
    conn.sock.shutdown(2)
    conn.close()

    deadline = time.monotonic() + 20
    while not re.search(rf"Request {re.escape(request_id)}\S* aborted", real_vllm.log_text()):
        assert time.monotonic() < deadline, f"vLLM never logged {request_id} as aborted:\n{real_vllm.log_text()[-3000:]}"
        time.sleep(0.2)
    # The slot is free again long before 1900 tokens could have been generated.
    while metric(real_vllm, http_client, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "vLLM still runs the abandoned request"
        time.sleep(0.2)
    after = http_client.post(real_vllm.url + CHAT, chat(max_tokens=4))
    assert after.status == 200
    assert time.monotonic() - started < 20
