"""Issue 54: the first turn of the search loop sends vLLM the client's own bytes for the history it left as it was
(proxy/core/codec.py, encoded_over), instead of encoding a megabyte again; what it means is always what encoding the
whole request would have meant. Pure: no server.

Run: tests/run.sh tests/test_codec_over.py
"""
from __future__ import annotations

import json

import pytest

from proxy.core import codec

HISTORY = [{"role": "user", "content": "Fix it; see https://a.test/ and \"tools\": [1], the \\\"quoted\\\" bits"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"tools": "x.py"}'}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "naïve → ünïcode, and a lone \ud800 surrogate"}]
TOOL = {"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"tools": {"type": "array"}}}}}  # a parameter named like the member
NAMESPACE = {"type": "namespace", "name": "ns", "tools": [TOOL, {"type": "function", "name": "x", "tools": []}]}
OURS = {"type": "function", "function": {"name": "web_search", "parameters": {"type": "object"}}}


def add_tool(body: dict) -> dict:
    return {**body, "tools": list(body.get("tools") or []) + [OURS]}


def rename_model(body: dict) -> dict:
    return {**body, "model": "served"}


def add_member(body: dict) -> dict:
    return {**body, "stream_options": {"include_usage": True}}


def drop_tools(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "tools"}


def new_history(body: dict) -> dict:
    return {**body, "messages": body["messages"] + [{"role": "user", "content": "next"}]}


def unchanged(body: dict) -> dict:
    return body


def dumped(obj) -> str:
    """A body as no encoder of the proxy's writes it (indented, ASCII-escaped), so reused bytes show."""
    return json.dumps(obj, indent=1)


# (the client's body as sent, what the handler makes of it, whether the history's bytes are the client's)
CASES = [
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL]}), add_tool, True),
    (dumped({"model": "m", "messages": HISTORY}), add_tool, True),                       # a member added at the end
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL], "stream": True}), add_tool, True),
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL]}), add_member, True),
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL]}), drop_tools, True),
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL]}), unchanged, True),
    ('{"model": "m", "messages": %s , "tools" : [] }  \n' % json.dumps(HISTORY), add_tool, True),  # spaces around
    (dumped({"tools": [TOOL], "model": "m", "messages": HISTORY}), add_tool, False),     # the first member changed
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL]}), rename_model, False),
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL]}), new_history, False),  # a later turn
    # the tools before the history: what follows the cut is most of the body, so it is not read again
    (dumped({"model": "m", "tools": [TOOL], "messages": HISTORY}), add_tool, False),
    # the key written with an escape: not found as written, so the whole body is encoded
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL]}).replace('"tools": [\n', '"\\u0074ools": [\n'),
     add_tool, False),
    # duplicate keys: the last is the one decoded, and the one vLLM reads
    ('{"model": "m", "messages": %s, "tools": [1], "tools": []}' % json.dumps(HISTORY), add_tool, True),
    ('{"model": "m", "messages": [], "tools": [], "messages": %s}' % json.dumps(HISTORY), add_tool, False),
    ('{"model": "m", "messages": %s, "tools": [], "messages": []}' % json.dumps(HISTORY), add_tool, False),
    # the member's key again after it, inside its own value or a later member's: the cut is where the members read
    # back are exactly the ones decoded
    (dumped({"model": "m", "messages": HISTORY, "tools": [NAMESPACE]}), add_tool, True),
    (dumped({"model": "m", "messages": HISTORY, "tools": [TOOL], "metadata": {"a": 1, "tools": 2}}), add_tool, True),
]


@pytest.mark.parametrize("raw, change, reused", CASES)
def test_a_rewritten_body_means_what_encoding_it_whole_would(raw, change, reused):
    sent = raw.encode()
    client = codec.Decoded(sent)
    new = change(client.value())
    out = codec.encoded_over(new, client)
    assert json.loads(out) == json.loads(codec.dumps(new))  # json keeps the last of duplicate keys, as vLLM does
    assert out.startswith(sent[:sent.index(b'"messages"') + 200]) is reused  # the history as the client wrote it
    if reused:
        assert out.count(b"\\ud800") == 1  # the client's escape, as it sent it


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"{}", b"  {  }  ", b"null"])
def test_anything_but_an_object_with_members_is_encoded_whole(raw):
    client = codec.Decoded(raw)
    value = client.value()
    assert codec.encoded_over(value, client) == codec.dumps(value)


def test_a_body_never_decoded_or_not_json_is_encoded_whole():
    assert codec.encoded_over({"a": 1}, None) == b'{"a":1}'
    assert codec.encoded_over({"a": 1}, codec.Decoded(b'{"a": 1}')) == b'{"a":1}'  # not read: no members known
    broken = codec.Decoded(b'{"a": ')
    with pytest.raises(ValueError):
        broken.value()
    assert codec.encoded_over({"a": 1}, broken) == b'{"a":1}'


def test_a_member_set_on_the_decoded_object_itself_is_not_taken_for_the_clients():
    """The Messages handler renames the model on the decoded body in place: the members as decoded still say what the
    client sent, so the client's bytes for `model` are not reused."""
    client = codec.Decoded(b'{"model": "claude-x", "messages": []}')
    body = client.value()
    body["model"] = "foundation"
    assert json.loads(codec.encoded_over(body, client))["model"] == "foundation"
