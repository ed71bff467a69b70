"""Replayed /v1/messages history as vLLM accepts it: the server blocks of earlier answers become
tool_use / tool_result pairs reading exactly as the model first read them; pure, tested by
tests/run.sh tests/test_messages.py tests/test_messages_fetch.py.
"""
from __future__ import annotations

from collections.abc import Callable

from proxy.apis.messages.presentation import row_for_result, server_blocks
from proxy.core import validate as V
from proxy.core.codec import as_dict
from proxy.tools.sources import Sources

# What the model read live for a result its block cannot rebuild (a failure's own sentence), by tool_use_id:
# services.KeptResults.get, whose record holds it as "output".
Kept = Callable[[str], "dict[str, str] | None"]



def no_kept(_: str) -> None:
    return None


def rewrite_history(messages: list[dict], names: dict[str, str], cite: bool = True, kept: Kept = no_kept) -> list[dict]:
    """Replayed server blocks as blocks vLLM accepts (`names`: each server tool's name on the vLLM side, by the
    proxy tool's; a server_tool_use of a tool not among them replays as the first; `kept`: the live text of results
    their blocks cannot rebuild, by tool_use_id). Pure but for the lookup.

    Anthropic keeps a search's (or fetch's) `server_tool_use` and its result in the assistant message;
    vLLM needs a `tool_use` in the assistant turn and its `tool_result` in the next user
    turn. So an assistant message is cut after each run of searches, and the results open
    the user turn that follows (merged into the next user message when there is one).
    """
    out: list[dict] = []
    carry: list[dict] = []       # tool_results waiting for the next user message
    for msg in messages:
        if msg.get("role") == "user" and carry:
            out.append(_opened_with(carry, msg))
            carry = []
        elif _replays_server_blocks(msg):
            turns, carry = _split_answer(msg, names, cite, kept)
            out += turns
        else:
            out.append(msg)
    if carry:
        out.append({"role": "user", "content": carry})
    return out


def _replays_server_blocks(msg: dict) -> bool:
    content = msg.get("content")
    return msg.get("role") == "assistant" and isinstance(content, list) \
        and any(V.kind(b) in server_blocks() for b in content)


def _opened_with(results: list[dict], msg: dict) -> dict:
    """A user message with the tool_results of the answer before it in front of its own content."""
    content = msg.get("content")
    rest = content if isinstance(content, list) else ([{"type": "text", "text": content}] if content else [])
    return {**msg, "content": results + rest}


def _split_answer(msg: dict, names: dict[str, str], cite: bool, kept: Kept) -> tuple[list[dict], list[dict]]:
    """One assistant message with server blocks as the turns it becomes, and the tool_results
    still owed to the user turn after it."""
    content = msg["content"]
    inputs = {b.get("id"): as_dict(b.get("input")) for b in content if isinstance(b, dict) and b.get("type") == "server_tool_use"}
    ids = set(inputs)
    # Numbered as when this answer was made (one counter per answer, pages only when they were cited), so the
    # model reads the same text again (CITATIONS=off: unnumbered, as then).
    sources = Sources() if cite else None
    out: list[dict] = []
    seg: list[dict] = []
    results: list[dict] = []
    for b in content:
        kind = V.kind(b)
        row = row_for_result(kind)
        if row is not None:
            results.append(_replayed_result(b, row, inputs, sources, kept))
            continue
        if kind == "server_tool_use":
            # A search after a run whose results are all in was written after reading them: a new turn.
            cut = bool(results) and not _pending(seg, results, ids)
            tool = names.get(b.get("name")) or next(iter(names.values()))
            block = {"type": "tool_use", "id": b.get("id"), "name": tool, "input": b.get("input") or {}}
        else:
            # Text (or a client's tool call) after a search was written after reading its result: a new turn.
            cut = bool(results) or _pending(seg, results, ids)
            block = b
        if cut:
            out += [{**msg, "content": seg}, {"role": "user", "content": _complete(seg, results, ids)}]
            seg, results = [], []
        seg.append(block)
    if seg:
        out.append({**msg, "content": seg})
    return out, _complete(seg, results, ids) if results or _pending(seg, results, ids) else []


def _replayed_result(block: dict, row, inputs: dict, sources: Sources | None, kept: Kept) -> dict:
    """A server tool's result block as the tool_result the model first read: rebuilt by its row's replay, or, for a
    failure the block keeps only the code of, the live sentence while this worker keeps it."""
    tid = block.get("tool_use_id")
    record = kept(tid) if isinstance(tid, str) else None
    if isinstance(record, dict) and isinstance(record.get("output"), str):
        return {"type": "tool_result", "tool_use_id": tid, "content": record["output"]}
    return {"type": "tool_result", "tool_use_id": tid, "content": row.replayed(block.get("content"), inputs.get(tid, {}), sources)}


def _searches_of(seg, ids) -> list[dict]:
    # Only the rewritten server calls: a client tool_use gets its result from the client.
    return [b for b in seg if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") in ids]


def _pending(seg, results, ids) -> bool:
    """True while a search of this segment still waits for its result."""
    done = {r["tool_use_id"] for r in results}
    return any(b.get("id") not in done for b in _searches_of(seg, ids))


def _complete(seg, results, ids) -> list[dict]:
    """Results in call order, with a stand-in for a search whose result was not replayed."""
    by_id = {r["tool_use_id"]: r for r in results}
    return [by_id.get(b.get("id")) or {"type": "tool_result", "tool_use_id": b.get("id"),
                                       "content": "No result was recorded for this call."}
            for b in _searches_of(seg, ids)]
