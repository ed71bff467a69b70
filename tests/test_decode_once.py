"""Issue 54: a request's body is decoded once however many parts of the proxy read it (the session key, the API's
handler), and a body the proxy does not change goes to vLLM byte for byte. In process (the app under Flask's test
client, before the scripted vLLM stand-in): how often a worker decodes is not visible through a server.

Run: tests/run.sh tests/test_decode_once.py
"""
from __future__ import annotations

import gc
import json

import pytest

from proxy.core import codec
from proxy.core.config import Config
from proxy.http.app import create_app
from standins import anthropic_wire, responses_wire
from standins.scripted_backend import Reply
from standins.vllm_wire import compact, completion, sse_reply, stream_frames

SYSTEM = "You are a coding agent."
CHAT = {"model": "foundation", "messages": [
    {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the test; spec at https://a.test/"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "x.py"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "def f():\n    return 1\n"}]}
MESSAGES = {"model": "foundation", "max_tokens": 16, "system": SYSTEM, "messages": [
    {"role": "user", "content": "Fix the test"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "x.py"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "def f(): ..."}]}]}
RESPONSES = {"model": "foundation", "instructions": SYSTEM, "input": [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the test"}]},
    {"type": "function_call", "name": "shell", "call_id": "f1", "arguments": '{"command": ["cat", "x.py"]}'},
    {"type": "function_call_output", "call_id": "f1", "output": "def f(): ..."}]}
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search"}

CHAT_ANSWER = compact(completion(content="Done."))
MESSAGES_ANSWER = compact(anthropic_wire.message([anthropic_wire.text("Done.")]))
RESPONSES_ANSWER = compact(responses_wire.body({}, [responses_wire.message("Done.")]))


@pytest.fixture
def counted(monkeypatch):
    """Every value codec.loads is asked to decode, in order."""
    seen: list = []
    real = codec.loads

    def loads(data):
        seen.append(data)
        return real(data)
    monkeypatch.setattr(codec, "loads", loads)
    return seen


def app_for(backend, searxng, tmp_path, inject: bool):
    cfg = Config(backend_url=backend.url, searxng_url=searxng.url, proxy_state_db=str(tmp_path / "state.db"),
                 inject_web_search=inject, inject_web_fetch=inject)
    return create_app(cfg).test_client()


# (path, body, vLLM's answer, whether the proxy's tools are on, whether the body reaches vLLM as the client sent it)
CASES = [
    ("/v1/chat/completions", CHAT, CHAT_ANSWER, False, True),
    ("/v1/chat/completions", CHAT, CHAT_ANSWER, True, False),       # the tools injected: rewritten, once
    ("/v1/messages", MESSAGES, MESSAGES_ANSWER, False, True),
    ("/v1/messages", {**MESSAGES, "tools": [WEB_SEARCH]}, MESSAGES_ANSWER, True, False),
    ("/v1/responses", RESPONSES, RESPONSES_ANSWER, False, True),
    ("/v1/responses", {**RESPONSES, "tools": [{"type": "web_search"}]}, RESPONSES_ANSWER, True, False),
]


@pytest.mark.parametrize("path, body, answer, inject, unchanged", CASES,
                         ids=[f"{p.rsplit('/', 1)[1]}-{'tools' if t else 'relay'}" for p, _, _, t, _ in CASES])
def test_the_body_is_decoded_once_and_relayed_as_sent(backend, searxng, tmp_path, counted, path, body, answer,
                                                      inject, unchanged):
    raw = json.dumps(body, indent=1).encode()  # spaced as no encoder of the proxy's would write it
    backend.script(Reply(body=answer))
    client = app_for(backend, searxng, tmp_path, inject)
    resp = client.post(path, data=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 200, resp.data[:500]
    assert sum(1 for d in counted if d is raw or d == raw) == 1  # the session key's reading is the handler's
    sent = backend.received[-1].body
    assert (sent == raw) is unchanged
    # Rewritten, the history still goes as the client wrote it (codec.encoded_over): only the members after it are new.
    history = raw[:raw.index(b'"tools"') if b'"tools"' in raw else len(raw.rstrip()) - 1].rstrip().rstrip(b",")
    assert sent.startswith(history)
    assert json.loads(sent)["model"] == "foundation"
    assert resp.headers.get("X-Session-ID") is None  # the session key goes to vLLM only
    assert backend.received[-1].headers.get("x-session-id")


@pytest.mark.parametrize("messages, kinds, broken, cited", [
    ([], set(), False, False),
    ([{"role": "user", "content": "plain text"}], set(), False, False),
    (MESSAGES["messages"], {"tool_use", "tool_result"}, False, False),
    ([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": '{"a": 1}'}]}],
     {"tool_use"}, True, False),
    ([{"role": "assistant", "content": [{"type": "text", "text": "x", "citations": []},
                                        {"type": "web_search_tool_result", "tool_use_id": "s", "content": []}]}],
     {"text", "web_search_tool_result"}, False, True),
    ([{"role": "assistant", "content": [{"type": ["not", "a", "string"]}, "not a block"]}],
     set(), False, False),
])
def test_one_pass_over_a_messages_history_answers_its_readers(messages, kinds, broken, cited):
    """The survey the Messages handler makes once, instead of the mending, the check for server blocks, the
    validation and the rewrite each walking every block."""
    from proxy.apis.messages.request import History, has_server_blocks, survey
    found = survey({"messages": messages})
    assert found == History(frozenset(kinds), broken, cited)
    assert has_server_blocks({"messages": messages}, found) is ("web_search_tool_result" in kinds)


@pytest.mark.parametrize("messages, typed", [
    ([{"role": "user", "content": "x"}, {"content": "no role"}], True),
    ([{"role": "user", "content": "x"}, "not a message"], False),
    ([{"role": 7, "content": "x"}], False),
])
def test_the_messages_survey_says_whether_every_message_is_typed(messages, typed):
    from proxy.apis.messages.request import survey, validate
    assert survey({"messages": messages}).typed is typed
    problem = validate({"messages": messages})
    assert (problem is None) is typed, problem  # and validation names what is wrong only then


BROKEN_CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"cut": '}}


@pytest.mark.parametrize("messages, typed, broken, annotated", [
    ([], True, False, False),
    (CHAT["messages"], True, False, False),
    ([{"role": "assistant", "content": None, "tool_calls": [BROKEN_CALL]}], True, True, False),
    ([{"role": "assistant", "content": "x", "annotations": [{"type": "url_citation"}]}], True, False, True),
    ([{"role": "user", "content": "x", "annotations": [{"type": "url_citation"}]}], True, False, False),
    ([{"role": "user", "content": [{"type": "text", "text": "x", "annotations": [{"a": 1}]}]}], True, False, True),
    ([{"role": ["not", "a", "string"]}], False, False, False),
    (["not a message", {"role": "user", "content": "x"}], False, False, False),
])
def test_one_pass_over_a_chat_history_answers_its_readers(messages, typed, broken, annotated):
    """The survey the chat handler makes once, instead of the checks, the mending and the citations' reader each
    walking every message."""
    from proxy.apis.chat.rules import Survey, survey
    assert survey({"messages": messages}) == Survey(typed, broken, annotated)


@pytest.mark.parametrize("items, typed, replays, broken, annotated", [
    ("a string", True, False, False, False),
    (RESPONSES["input"], True, False, False, False),
    ([{"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}}],
     True, True, False, False),
    ([{"type": "function_call", "name": "f", "call_id": "c", "arguments": "not json"}], True, False, True, False),
    ([{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x",
                                                            "annotations": [{"type": "url_citation"}]}]}],
     True, False, False, True),
    ([{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x", "annotations": []}]}],
     True, False, False, False),
    ([{"type": "function_call", "call_id": 7}], False, False, False, False),
    ([["not", "an", "item"]], False, False, False, False),
])
def test_one_pass_over_a_responses_input_answers_its_readers(items, typed, replays, broken, annotated):
    from proxy.apis.responses.request import Survey, survey
    assert survey({"input": items}) == Survey(typed, replays, broken, annotated)


@pytest.mark.parametrize("path, body, answer, inject, unchanged", CASES,
                         ids=[f"{p.rsplit('/', 1)[1]}-{'tools' if t else 'relay'}" for p, _, _, t, _ in CASES])
def test_a_request_is_freed_when_it_ends_not_by_the_collector(backend, searxng, tmp_path, path, body, answer, inject,
                                                              unchanged):
    """A request's Exchange, its body and the history decoded from it are freed by reference counting when the request
    ends. Held in a cycle (the client watch's callback held the Exchange that held the watch), they stayed until the
    garbage collector's next pass, which then walked every object of the history: a fifth of a relayed megabyte's
    CPU in a worker (docs/performance.md, "A body read in one call")."""
    backend.script(Reply(body=answer))
    assert left_by_one_request(app_for(backend, searxng, tmp_path, inject), path, body) == []


@pytest.mark.parametrize("path, body, answer, inject, unchanged", CASES,
                         ids=[f"{p.rsplit('/', 1)[1]}-{'tools' if t else 'relay'}" for p, _, _, t, _ in CASES])
def test_the_history_is_freed_after_the_answer_has_gone_not_before(backend, searxng, tmp_path, path, body, answer,
                                                                   inject, unchanged):
    """Freeing a long history's objects takes a worker a third of a millisecond per megabyte: done when the handler
    returned, it came between vLLM's answer and the client's. The flow holds the decoded body until the request ends,
    so it is still there when the answer's head is written, and gone after (docs/performance.md)."""
    backend.script(Reply(body=answer))
    client = app_for(backend, searxng, tmp_path, inject)
    inner, held = client.application.wsgi_app, []

    def app(environ, start_response):
        def head(*args):
            held.append(sum(1 for o in gc.get_objects() if isinstance(o, codec.Decoded)))
            return start_response(*args)
        return inner(environ, head)

    client.application.wsgi_app = app
    assert left_by_one_request(client, path, body) == []
    assert held == [1]


def left_by_one_request(client, path: str, body: dict) -> list[str]:
    """The Exchanges and decoded bodies still alive once one request has ended, with the collector off: only
    reference counting has freed anything."""
    from proxy.engine.exchange import Exchange
    gc.collect()
    gc.disable()
    try:
        resp = client.post(path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        data = resp.get_data()
        assert resp.status_code == 200 and b"Done." in data, data[:500]
        resp.close()
        # The test client's answer keeps the request's environ (resp.request), and with it the flow, which holds the
        # decoded body to the request's end; gunicorn lets go of the environ once the answer is sent.
        del resp
        return [type(o).__name__ for o in gc.get_objects() if isinstance(o, (Exchange, codec.Decoded))]
    finally:
        gc.enable()


@pytest.mark.parametrize("path, body, inject", [
    ("/v1/chat/completions", {**CHAT, "stream": True}, False),
    ("/v1/chat/completions", {**CHAT, "stream": True}, True),
    ("/v1/messages", {**MESSAGES, "stream": True, "tools": [WEB_SEARCH]}, True),
], ids=["chat-relay", "chat-tools", "messages-tools"])
def test_a_streamed_request_is_freed_when_it_ends(backend, searxng, tmp_path, path, body, inject):
    """As above, for streams: the relay's generator and the search loop's hold the Exchange until the last event."""
    backend.script(anthropic_wire.stream_reply([anthropic_wire.text("Done.")]) if path == "/v1/messages"
                   else sse_reply(stream_frames(content=["Done."], finish_reason="stop")))
    assert left_by_one_request(app_for(backend, searxng, tmp_path, inject), path, body) == []
