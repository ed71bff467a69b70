"""vLLM 0.32's chat-completions wire format, rebuilt from the real captures in
tests/data/vllm-0.32-samples/ (field order, nulls, compact SSE framing), for the scripted
stand-in's replies.

Imported by tests; tests/test_standins.py checks these builders against the captures.
"""
from __future__ import annotations

import itertools
import json

from .scripted_backend import Reply

FINGERPRINT = "vllm-0.32.0-2c37d8d2"
_ids = itertools.count(1)
CREATED = 1796234487


def _hex(n: int) -> str:
    return f"{n:016x}"


def compact(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def tool_call(name: str, arguments, call_id: str | None = None) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or f"chatcmpl-tool-{_hex(next(_ids))}", "type": "function",
            "function": {"name": name, "arguments": args}}


def usage(prompt: int, completion: int, reasoning: int = 0, stream: bool = False) -> dict:
    u: dict[str, object] = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    if not stream:
        u["prompt_tokens_details"] = None
    u["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return u


def completion(content=None, reasoning=None, tool_calls=None, finish_reason=None,
               prompt_tokens=17, completion_tokens=20, reasoning_tokens=0, ident=None) -> dict:
    """A non-streaming chat.completion exactly as vLLM 0.32 dumps it."""
    message = {"role": "assistant", "content": content, "refusal": None, "annotations": None,
               "audio": None, "function_call": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    message["reasoning"] = reasoning
    return {"id": ident or f"chatcmpl-{_hex(next(_ids))}", "object": "chat.completion", "created": CREATED,
            "model": "foundation",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                         "stop_reason": None, "token_ids": None, "routed_experts": None}],
            "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": usage(prompt_tokens, completion_tokens, reasoning_tokens),
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


def json_reply(obj, status: int = 200) -> Reply:
    return Reply(status=status, body=compact(obj))


def error_reply(status: int, message: str, type_: str, param=None) -> Reply:
    return json_reply({"error": {"message": message, "type": type_, "param": param, "code": status}}, status)


def stream_frames(content=(), reasoning=(), tool_calls=(), finish_reason=None, include_usage=False,
                  prompt_tokens=17, completion_tokens=None, ident=None, arg_pieces=3) -> list[bytes]:
    """The SSE events of one streamed turn, in vLLM's order: role, reasoning, content,
    tool-call deltas (id+name, then argument fragments), the finish chunk, usage, [DONE]."""
    ident = ident or f"chatcmpl-{_hex(next(_ids))}"
    head = {"id": ident, "object": "chat.completion.chunk", "created": CREATED, "model": "foundation"}

    def chunk(delta, finish=None, extra_choice=None, **top):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        choice.update(extra_choice or {})
        return b"data: " + compact({**head, "choices": [choice], **top}) + b"\n\n"

    frames = [b"data: " + compact({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                         "logprobs": None, "finish_reason": None}],
                                    "prompt_token_ids": None, "prompt_text": None}) + b"\n\n"]
    for r in reasoning:
        frames.append(chunk({"reasoning": r}, extra_choice={"token_ids": None}))
    for c in content:
        frames.append(chunk({"content": c}, extra_choice={"token_ids": None}))
    for i, tc in enumerate(tool_calls):
        frames.append(chunk({"tool_calls": [{"id": tc["id"], "type": "function", "index": i,
                                             "function": {"name": tc["function"]["name"]}}]},
                            extra_choice={"token_ids": None}))
        args = tc["function"]["arguments"]
        step = max(1, -(-len(args) // arg_pieces))
        for j in range(0, len(args), step):
            frames.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + step]}}]},
                                extra_choice={"token_ids": None}))
    finish = finish_reason or ("tool_calls" if tool_calls else "stop")
    frames.append(chunk({}, finish, extra_choice={"token_ids": None}))
    if include_usage:
        n = completion_tokens if completion_tokens is not None else len(content) + len(reasoning) + 10 * len(tool_calls)
        frames.append(b"data: " + compact({**head, "choices": [], "usage": usage(prompt_tokens, n, len(reasoning), stream=True),
                                           "system_fingerprint": FINGERPRINT}) + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return frames


SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8")]


def sse_reply(frames: list, gap: float = 0.0, **kw) -> Reply:
    chunks = []
    for f in frames:
        chunks.append(f)
        if gap:
            chunks.append(gap)
    return Reply(status=200, headers=list(SSE_HEADERS), chunks=chunks, **kw)
