"""What a chat completions request body gives web_fetch, pure (issue 33): its parts in order, each with who wrote
it (proxy/tools/provenance.py's Given), so the Ledger admits URLs from system, developer and user messages, client
tool results and the proxy's own citations, and never from what the model wrote. Tested by tests/test_provenance.py.
"""
from __future__ import annotations

from proxy.apis.given import client_given, user_given
from proxy.tools.provenance import MODEL, READ, Given

ROLES = {"system": "system", "developer": "system", "tool": "tool", "function": "tool"}


def given(body) -> list[Given]:
    """The request's messages as Given parts, in the conversation's order. Pure."""
    out: list[Given] = []
    messages = body.get("messages") if isinstance(body, dict) else None
    for msg in messages if isinstance(messages, list) else []:
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if role == "assistant":
            # The model's text and tool calls allow nothing; the citations the proxy added to an earlier answer
            # are the pages its searches and fetches read (a model cannot write an annotation), at their depth.
            out.append(Given(MODEL, [msg.get("content"), msg.get("tool_calls"), msg.get("function_call"),
                                     msg.get("reasoning_content"), msg.get("reasoning")]))
            notes = msg.get("annotations")
            for a in notes if isinstance(notes, list) else []:
                cite = a.get("url_citation") if isinstance(a, dict) else None
                if isinstance(cite, dict):
                    out.append(Given(READ, cite.get("url")))
        elif role == "user":  # a person's words, or what a client put in their place (proxy/apis/given.py)
            out.extend(user_given(msg.get("content")))
        elif isinstance(role, str) and role in ROLES:  # the system prompt and tool results: a client's, but for a compaction summary in them
            out.extend(client_given(ROLES[role], msg.get("content")))
    return out
