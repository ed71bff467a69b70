"""Replayed tool calls whose arguments are not a JSON object (a call cut by max_tokens in an older answer, unescaped
text), mended before vLLM reads them: vLLM 0.32 turns them into `{}` without a word (older vLLMs answered 400 to every
later request), so the model would see a different call from the one it wrote. Pure; used by the chat, Messages and
Responses handlers on every request, relayed or not (docs/apis.md, "Tool calls the model writes").

The mended arguments are `{"_unparsed": RAW}`: the chat template then shows the model its own text as one
parameter, `<parameter=_unparsed>RAW</parameter>`, so it sees what it wrote and that it did not parse.
"""
from __future__ import annotations

from proxy.core import codec

UNPARSED = "_unparsed"
# Arguments already seen to parse: an agent resends its whole history every turn, and looking a string up costs a
# hash, parsing it again a JSON decode (100 calls of 300 bytes: 255 us parsed, a tenth of that looked up). Bounded,
# and emptied when full; per worker process.
_SEEN_GOOD: dict[str, None] = {}
SEEN_GOOD_MAX = 4096


def mended_arguments(raw: object) -> str | None:
    """The arguments string to send instead of `raw`, or None when `raw` is already a JSON object's text."""
    if isinstance(raw, str):
        if raw in _SEEN_GOOD:
            return None
        try:
            if isinstance(codec.loads(raw), dict):
                if len(_SEEN_GOOD) >= SEEN_GOOD_MAX:
                    _SEEN_GOOD.clear()
                _SEEN_GOOD[raw] = None
                return None
        except ValueError:
            pass
        return codec.arguments_text({UNPARSED: raw})
    if raw is None:
        return None  # absent: vLLM's own default ({}), nothing was written
    return codec.arguments_text({UNPARSED: codec.arguments_text(raw)})


def _mend_messages(body: dict, field: str, broken, mend) -> dict | None:
    """`body` with every message whose list `field` holds an item `broken` says is broken rebuilt with `mend` applied
    to each item, or None when no message needed it (the caller then sends the client's bytes unchanged)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    # Looked for first, copied only when found: nearly every request has nothing to mend, and a long history
    # holds thousands of calls.
    at = [i for i, message in enumerate(messages) if isinstance(message, dict)
          and isinstance(items := message.get(field), list) and any(map(broken, items))]
    if not at:
        return None
    out = list(messages)
    for i in at:
        out[i] = {**out[i], field: [mend(item) for item in out[i][field]]}
    return {**body, "messages": out}


def chat(body: dict) -> dict | None:
    """A chat request with its assistant messages' tool_calls mended, or None when none needed it."""
    return _mend_messages(body, "tool_calls", chat_call_broken, _chat_call)


def chat_call_broken(call: object) -> bool:
    """Whether a chat tool call's arguments need mending. Pure but for the cache of arguments seen to parse."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return False
    raw = function.get("arguments")
    if isinstance(raw, str) and raw in _SEEN_GOOD:
        return False  # the common case, without a call: an agent resends every call of its history each turn
    return mended_arguments(raw) is not None


def _chat_call(call: object) -> object:
    if not chat_call_broken(call):
        return call
    assert isinstance(call, dict)
    function = call["function"]
    return {**call, "function": {**function, "arguments": mended_arguments(function.get("arguments"))}}


def responses(body: dict) -> dict | None:
    """A Responses request with its function_call input items mended, or None when none needed it."""
    items = body.get("input")
    if not isinstance(items, list):
        return None
    out, changed = [], False
    for item in items:
        if isinstance(item, dict) and item.get("type") == "function_call":
            fixed = mended_arguments(item.get("arguments"))
            if fixed is not None:
                item, changed = {**item, "arguments": fixed}, True
        out.append(item)
    return {**body, "input": out} if changed else None


def messages(body: dict) -> dict | None:
    """A Messages request whose tool_use blocks' `input` is not an object (a string a client replayed as it got
    it), mended; None when none needed it. A string holding a JSON object is that object."""
    return _mend_messages(body, "content", tool_use_broken, _tool_use)


def tool_use_broken(block: object) -> bool:
    """Whether a Messages block is a tool_use whose `input` messages() would mend."""
    return (isinstance(block, dict) and block.get("type") == "tool_use" and "input" in block
            and not isinstance(block["input"], dict))


def _tool_use(block: object) -> object:
    if not tool_use_broken(block):
        return block
    assert isinstance(block, dict)
    raw = block["input"]
    fixed = mended_arguments(raw if isinstance(raw, str) else codec.arguments_text(raw))
    return {**block, "input": codec.loads(fixed) if fixed is not None else codec.loads(raw)}
