"""The stack's qwen3_stack tool parser (vllm-plugin/) in the real vLLM server: awkward and normal Qwen3 outputs
(tests/data/qwen3-tool-markup.json, each with its source) forced token for token with structured outputs, on chat
completions and Responses, streaming and not, direct and through the proxy with its tools on; and vLLM's own
qwen3_coder on the same texts in the same venv, so normal calls are shown byte-equal to it. Run with
`tests/run.sh tests/real_vllm/test_tool_markup_real.py`."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from realvllm import MODEL, REPO, locate_env, start_server, stop_server, wait_healthy

pytestmark = pytest.mark.real_vllm

DATA = json.loads((REPO / "tests" / "data" / "qwen3-tool-markup.json").read_text())
CASES = DATA["cases"]
REASONING_CASES = DATA["reasoning_cases"]
TOOLS = [{"type": "function", "function": {"name": name, "description": f"The {name} tool.", "parameters": {
    "type": "object", "properties": properties}}} for name, properties in DATA["schemas"].items()]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


def forcing(server, case: dict) -> dict:
    bias = {str(server.token_id(t)): 100 for t in ("<tool_call>", "</tool_call>")}
    # Greedy: the regex admits many tokenizations of one text, and a sampled one moved where max_tokens cut it from run
    # to run (once exactly between two calls, which is no cut inside a call), so a case's outcome was a draw.
    return {"structured_outputs": {"regex": re.escape(case["text"])}, "logit_bias": bias, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}}


def chat_outcome(status: int, body: bytes, stream: bool) -> tuple:
    assert status == 200, body[:500]
    if not stream:
        choice = json.loads(body)["choices"][0]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or []]
        return choice["message"].get("content") or None, calls, choice["finish_reason"]
    content, calls, finish = "", {}, None
    for line in body.decode().split("\n"):
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            content += choice["delta"].get("content") or ""
            for c in choice["delta"].get("tool_calls") or []:
                entry = calls.setdefault(c["index"], ["", ""])
                entry[0] += (c.get("function") or {}).get("name") or ""
                entry[1] += (c.get("function") or {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return content or None, [tuple(v) for _, v in sorted(calls.items())], finish


def chat_reasoning(body: bytes, stream: bool) -> str:
    if not stream:
        return json.loads(body)["choices"][0]["message"].get("reasoning") or ""
    return "".join(choice["delta"].get("reasoning") or "" for line in body.decode().split("\n")
                   if line.startswith("data: {") for choice in json.loads(line[6:]).get("choices", []))


def responses_final(status: int, body: bytes) -> dict:
    assert status == 200, body[:500]
    if body.lstrip().startswith(b"{"):
        return json.loads(body)
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    return events[-1]["response"]


def responses_reasoning(response: dict) -> str:
    return "".join(part.get("text", "") for item in response["output"] if item["type"] == "reasoning"
                   for part in (item.get("content") or []) + (item.get("summary") or []))


def responses_outcome(status: int, body: bytes) -> tuple:
    response = responses_final(status, body)
    text = "".join(part.get("text", "") for item in response["output"] if item["type"] == "message"
                   for part in item["content"])
    calls = [(i["name"], i["arguments"]) for i in response["output"] if i["type"] == "function_call"]
    return text or None, calls, response["status"]


def expected(case: dict, stream: bool) -> tuple:
    calls = case["calls"]
    return case["content"], [tuple(c) for c in calls], case["finish"]


def strip_ws(content):
    return content.strip() or None if content else None


@pytest.fixture
def through_proxy(start_proxy, real_vllm):
    return start_proxy(BACKEND_URL=real_vllm.url)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", ["direct", "proxy"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_chat(real_vllm, through_proxy, http_client, case, route, stream):
    base = real_vllm.url if route == "direct" else through_proxy.url
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Go."}], "tools": TOOLS,
            "max_tokens": case.get("max_tokens", 200), "stream": stream, **forcing(real_vllm, case)}
    reply = http_client.post(base + "/v1/chat/completions", body)
    content, calls, finish = chat_outcome(reply.status, reply.body, stream)
    want_content, want_calls, want_finish = expected(case, stream)
    assert (strip_ws(content), calls, finish) == (strip_ws(want_content), want_calls, want_finish)
    assert "<tool_call>" not in (content or "") or case["finish"] == "stop"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", ["direct", "proxy", "tools"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_responses(real_vllm, through_proxy, http_client, case, route, stream):
    """`tools`: the hosted web_search tool too, so the proxy plays it (its loop reads the answer)."""
    base = real_vllm.url if route == "direct" else through_proxy.url
    hosted = [{"type": "web_search"}] if route == "tools" else []
    body = {"model": MODEL, "input": "Go.", "tools": RESPONSES_TOOLS + hosted, "store": False, "stream": stream,
            "max_output_tokens": case.get("max_tokens", 200), **forcing(real_vllm, case)}
    reply = http_client.post(base + "/v1/responses", body)
    text, calls, status = responses_outcome(reply.status, reply.body)
    want_content, want_calls, want_finish = expected(case, stream)
    want_status = "incomplete" if want_finish == "length" else "completed"
    if calls and calls == [tuple(c) for c in case.get("complete_before_cut", ())]:
        # vLLM's Responses stream, under the proxy's loop, now and then reports a call that was complete before the
        # cut (its own reading of the stream, not the parser's): allowed, since the status still says the answer
        # was cut and the call is whole.
        want_calls = calls
    assert (strip_ws(text), calls, status) == (strip_ws(want_content), want_calls, want_status)


FORCE_FILE = REPO / "tests" / ".work" / "forced-text.txt"
MESSAGES_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in TOOLS]


@pytest.fixture(scope="module")
def forced_vllm(compose_vllm):
    """A second vLLM with the stack's flags and tests/real_vllm/forcer.py: it writes FORCE_FILE's text on any API."""
    FORCE_FILE.parent.mkdir(parents=True, exist_ok=True)
    FORCE_FILE.write_text("")
    proc, server = start_server(locate_env(), compose_vllm, name="forced",
                                extra_args=("--logits-processors", "forcer:ForceText"),
                                extra_env={"FORCE_TEXT_FILE": str(FORCE_FILE), "PYTHONPATH": str(Path(__file__).parent)})
    try:
        wait_healthy(proc, server)
        yield server
    finally:
        stop_server(proc)
        FORCE_FILE.unlink(missing_ok=True)


def messages_blocks(status: int, body: bytes) -> tuple[list[dict], str | None]:
    assert status == 200, body[:500]
    if body.lstrip().startswith(b"{"):
        message = json.loads(body)
        blocks, stop = message["content"], message["stop_reason"]
    else:
        blocks, stop, inputs = [], None, {}
        for line in body.decode().splitlines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["type"] == "content_block_start":
                blocks.append(dict(event["content_block"]))
            elif event["type"] == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    blocks[-1]["text"] = blocks[-1].get("text", "") + delta["text"]
                elif delta["type"] == "thinking_delta":
                    blocks[-1]["thinking"] = blocks[-1].get("thinking", "") + delta["thinking"]
                elif delta["type"] == "input_json_delta":
                    inputs[len(blocks) - 1] = inputs.get(len(blocks) - 1, "") + delta["partial_json"]
            elif event["type"] == "message_delta":
                stop = event["delta"].get("stop_reason") or stop
        for index, raw in inputs.items():
            blocks[index]["input"] = json.loads(raw or "{}")
    return blocks, stop


def messages_outcome(status: int, body: bytes) -> tuple:
    blocks, stop = messages_blocks(status, body)
    text = "".join(b.get("text", "") for b in blocks if b["type"] == "text")
    calls = [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    return text or None, calls, stop


STOP_REASON = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", ["direct", "proxy", "tools"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_messages(forced_vllm, start_proxy, http_client, case, route, stream):
    """`tools`: the web_search server tool too, so the proxy plays it (its loop reads the answer)."""
    base = forced_vllm.url if route == "direct" else start_proxy(BACKEND_URL=forced_vllm.url).url
    server = [{"type": "web_search_20250305", "name": "web_search"}] if route == "tools" else []
    FORCE_FILE.write_text(case["text"])
    body = {"model": MODEL, "max_tokens": case.get("max_tokens", 200), "tools": MESSAGES_TOOLS + server,
            "stream": stream,
            "messages": [{"role": "user", "content": "Go."}], "chat_template_kwargs": {"enable_thinking": False}}
    try:
        reply = http_client.post(base + "/v1/messages", body)
    finally:
        FORCE_FILE.write_text("")
    text, calls, stop = messages_outcome(reply.status, reply.body)
    want_content, want_calls, want_finish = expected(case, stream)
    want_calls = [(name, json.loads(args)) for name, args in want_calls]
    assert (strip_ws(text), calls, stop) == (strip_ws(want_content), want_calls, STOP_REASON[want_finish])


def api_outcome(path: str, status: int, body: bytes, stream: bool) -> tuple:
    """(reasoning, text, [(name, arguments as an object)], chat's finish reason) of any of the three APIs."""
    if path == "/v1/chat/completions":
        content, calls, finish = chat_outcome(status, body, stream)
        return chat_reasoning(body, stream), content, [(n, json.loads(a)) for n, a in calls], finish
    if path == "/v1/responses":
        response = responses_final(status, body)
        text, calls, state = responses_outcome(status, body)
        finish = "length" if state == "incomplete" else "tool_calls" if calls else "stop"
        return responses_reasoning(response), text, [(n, json.loads(a)) for n, a in calls], finish
    blocks, stop = messages_blocks(status, body)
    text, calls, _ = messages_outcome(status, body)
    thinking = "".join(b.get("thinking", "") for b in blocks if b["type"] == "thinking")
    return thinking, text, calls, {v: k for k, v in STOP_REASON.items()}[stop]


def reasoning_request(path: str, case: dict, stream: bool) -> dict:
    limit = case.get("max_tokens", 200)
    thinking = {"chat_template_kwargs": {"enable_thinking": True}}
    if path == "/v1/responses":
        return {"model": MODEL, "input": "Go.", "tools": RESPONSES_TOOLS, "store": False, "stream": stream,
                "max_output_tokens": limit, "reasoning": {"summary": "auto"}, **thinking}
    tools = MESSAGES_TOOLS if path == "/v1/messages" else TOOLS
    return {"model": MODEL, "messages": [{"role": "user", "content": "Go."}], "tools": tools, "stream": stream,
            "max_tokens": limit, **thinking}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("route", ["direct", "proxy"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
@pytest.mark.parametrize("case", REASONING_CASES, ids=[c["name"] for c in REASONING_CASES])
def test_calls_written_in_the_reasoning(forced_vllm, start_proxy, http_client, case, path, route, stream):
    """Thinking on, the forced text holds its call inside <think>: a complete, unquoted call to an offered tool is a
    call and leaves the reasoning; anything else stays reasoning, whole; a cut leaves no call."""
    base = forced_vllm.url if route == "direct" else start_proxy(BACKEND_URL=forced_vllm.url).url
    FORCE_FILE.write_text(case["text"])
    try:
        reply = http_client.post(base + path, reasoning_request(path, case, stream))
    finally:
        FORCE_FILE.write_text("")
    reasoning, text, calls, finish = api_outcome(path, reply.status, reply.body, stream)
    want_calls = [(n, json.loads(a)) for n, a in case["calls"]]
    assert (calls, strip_ws(text), finish) == (want_calls, strip_ws(case["content"]), case["finish"]), reasoning
    assert ("<function=" in reasoning) == case["reasoning_markup"], reasoning
    assert reasoning.strip(), "the reasoning around the call is kept"


HARNESS = Path(__file__).with_name("parser_harness.py")


def harness(env, texts: list[str], *flags: str) -> list[dict]:
    proc = subprocess.run([str(env.python), str(HARNESS), str(env.model_dir), *flags],
                          input=json.dumps(texts), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_normal_calls_are_byte_equal_to_qwen3_coder(real_vllm_env):
    """Both parsers on the same texts in vLLM's own venv (whole and streamed per token): on every case vLLM's
    qwen3_coder reads right, the arguments are the same bytes (and the reasoning parsers change nothing)."""
    good = [c for c in CASES if c["finish"] == "tool_calls" and not c.get("coerced")]
    for case, result in zip(good, harness(real_vllm_env, [c["text"] for c in good]), strict=True):
        for mode in ("whole", "stream"):
            assert result[mode]["qwen3_stack"] == result[mode]["qwen3_coder"], (mode, result)
            assert [json.loads(a) for _, a in result[mode]["qwen3_stack"]["calls"]] == [
                json.loads(a) for _, a in case["calls"]], (mode, case["name"], result)


def _parsed(outcome: dict) -> tuple:
    return ([(n, json.loads(a)) for n, a in outcome["calls"]], strip_ws(outcome["content"]),
            "<function=" in (outcome["reasoning"] or ""))


@pytest.mark.parametrize("kind", ["coerced", "reasoning"])
def test_stack_parsers_in_vllms_venv(real_vllm_env, kind):
    """The stack's pair as `vllm serve` composes it, whole and streamed per token, gives each case's calls and text:
    values read where the schema wants no string (qwen3_coder's own conversion left them strings), and calls written
    in the reasoning (thinking on) taken out of it only when complete, unquoted and offered."""
    cases = [c for c in CASES if c.get("coerced")] if kind == "coerced" else REASONING_CASES
    cases = [c for c in cases if "max_tokens" not in c]
    results = harness(real_vllm_env, [c["text"] for c in cases], *(["--thinking"] if kind == "reasoning" else []))
    for case, result in zip(cases, results, strict=True):
        want = ([(n, json.loads(a)) for n, a in case["calls"]], strip_ws(case["content"]),
                case.get("reasoning_markup", False))
        for mode in ("whole", "stream"):
            assert _parsed(result[mode]["qwen3_stack"]) == want, (case["name"], mode, result[mode])
        if kind == "coerced":
            assert _parsed(result["whole"]["qwen3_coder"]) != want, case["name"]  # vLLM's own reads them otherwise


CUT_ARGS = '{"command": "ls -la /very/lo'
REPLAYS = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 8, "tools": TOOLS, "messages": [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": CUT_ARGS}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cut"}]},
    "/v1/responses": {"model": MODEL, "max_output_tokens": 8, "tools": RESPONSES_TOOLS, "store": False, "input": [
        {"type": "message", "role": "user", "content": "list"},
        {"type": "function_call", "call_id": "c1", "name": "Bash", "arguments": CUT_ARGS},
        {"type": "function_call_output", "call_id": "c1", "output": "cut"}]},
    "/v1/messages": {"model": MODEL, "max_tokens": 8, "tools": [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS], "messages": [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "Bash", "input": CUT_ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "cut"}]}]},
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("path", list(REPLAYS))
def test_broken_history_replays(real_vllm, tapped, http_client, path, stream):
    """A history holding a cut call's arguments: the proxy answers vLLM's 200 and vLLM read the raw text."""
    proxy, tap = tapped
    body = {**REPLAYS[path], "stream": stream, "chat_template_kwargs": {"enable_thinking": False}}
    reply = http_client.post(proxy.url + path, body)
    assert reply.status == 200, reply.body[:500]
    (sent_path, sent, status, _), *_ = tap.exchanges
    assert (sent_path.split("?")[0], status) == (path, 200)
    if path == "/v1/chat/completions":
        args = json.loads(sent["messages"][1]["tool_calls"][0]["function"]["arguments"])
    elif path == "/v1/responses":
        args = json.loads(sent["input"][1]["arguments"])
    else:
        args = sent["messages"][1]["content"][0]["input"]
    assert args == {"_unparsed": CUT_ARGS}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_tool_choice_none_yields_no_call(real_vllm, http_client, stream):
    case = CASES[0]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Go."}], "tools": TOOLS, "tool_choice": "none",
            "max_tokens": 200, "stream": stream, **forcing(real_vllm, case)}
    reply = http_client.post(real_vllm.url + "/v1/chat/completions", body)
    content, calls, finish = chat_outcome(reply.status, reply.body, stream)
    assert (calls, finish) == ([], "stop")
    assert "<function=" not in (content or "")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "Bash"}}],
                         ids=["required", "named"])
def test_forced_tool_choice_yields_a_call_or_a_truthful_cut(real_vllm, http_client, choice, stream):
    """vLLM's grammar makes the random model call a tool; whatever it writes is a well-formed call to an offered tool
    (the named one), or, cut by max_tokens, no call at all."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Go."}], "tools": TOOLS, "tool_choice": choice,
            "max_tokens": 300, "stream": stream, "seed": 3, "chat_template_kwargs": {"enable_thinking": False}}
    reply = http_client.post(real_vllm.url + "/v1/chat/completions", body)
    content, calls, finish = chat_outcome(reply.status, reply.body, stream)
    if finish == "length":
        assert calls == [] or choice != "required", (content, calls)
        return
    assert calls, (content, finish)
    names = {"Bash"} if isinstance(choice, dict) else {"Grep", "Bash"}
    for name, args in calls:
        assert name in names and isinstance(json.loads(args), dict), (name, args)
