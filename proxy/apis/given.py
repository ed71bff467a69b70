"""What a list of OpenAI Responses input items gives web_fetch, pure (issue 33), shared by the Responses API
(proxy/apis/responses/given.py) and Codex's /v1/alpha/search, whose `input` is the same items: each part in order
with who wrote it (proxy/tools/provenance.py's Given). System, developer and user messages, every client tool's
output item, and the sources, completed page reads and citations of earlier searches give URLs; the model's
messages, calls and reasoning give none. Tested by tests/test_provenance.py.

Also every API's reader of a user-role message (issue 39): what in it a person typed, and what a client generated
into it, recognised by the clients' own formats (samples in tests/test_provenance.py): a compaction summary is the
model's own text; Claude Code's system-reminder blocks and command output, Codex's environment context and AGENTS.md,
Cline-style tool output sent as user text are a client's, which gives no URL the model wrote.

A compaction summary is recognised by each client's own wrapper, read from its source (issue 50; samples with their
repository, path and commit in tests/data/compaction/), wherever the client puts it: a user message (Claude Code,
Codex, aider, Cline 4, Kilo Code, Qwen Code, Crush), the system prompt (Continue) or a tool result (Cline 3). opencode
and Kilo's CLI send theirs as an assistant message, the model's already. A summary in no format listed here reads as
what carries it (a person's words in a user message): docs/web-tools.md says so.
"""
from __future__ import annotations

import re

from proxy.core.codec import as_dict
from proxy.tools.provenance import MODEL, READ, Given

# A client's compaction: the summary the model wrote of the conversation so far, sent back in the client's wrapper.
# From where one of these opens, the text is the model's.
_SUMMARY = re.compile(
    r"This session is being continued from a previous conversation"  # Claude Code; Cline 3's summarize_task result
    r"|Another language model started to solve this problem"          # Codex
    r"|I spoke to you previously about a number of things\."          # aider
    r"|^Context summary:\n"                                           # Cline 4
    r"|^## Conversation Summary\n"                                    # Kilo Code (Roo Code's condense)
    r"|Previous conversation summary:\n"                              # Continue
    r"|<state_snapshot>",                                             # Qwen Code, as Gemini CLI
    re.MULTILINE)
# What each of _SUMMARY's openings must hold, as plain text: a text holding none of them opens no summary. `in` finds
# that at memory speed, where the alternation steps through every character (a 1 MB history: ~60 ms, ~5 ms this way).
_SUMMARY_MARKS = ("This session is being continued from a previous conversation",
                  "Another language model started to solve this problem", "I spoke to you previously",
                  "Context summary:\n", "## Conversation Summary\n", "Previous conversation summary:\n",
                  "<state_snapshot>")
# Qwen Code ends the summary with its own sentence; what the model wrote above it opens any way it likes.
_SUMMARY_TRAILERS = ("Resume the prior task using the summary above.",)
# Crush sends the model's summary itself as a user message, no wrapper: its template's sections (three of them) say so.
_CRUSH_SECTIONS = ("## Current State", "## Files & Changes", "## Technical Context", "## Strategy & Approach",
                   "## Exact Next Steps")
# Cline and its forks send each tool's output as user text: "[execute_command for 'ls'] Result:".
_TOOL_OUTPUT = re.compile(r"\A\s*\[[\w-]+(?: for '.*?')?\] Result:", re.DOTALL)
_INJECTED = ("# AGENTS.md instructions",)  # Codex's project instructions, read from a file the model may have written
# Blocks a client wraps around what it adds to a user's message (Claude Code, Codex, Cline).
_CLIENT_BLOCK = re.compile(
    r"<(system-reminder|environment_details|environment_context|user_instructions|local-command-stdout|"
    r"local-command-stderr|bash-stdout|bash-stderr|command-message|command-args)>.*?(?:</\1>|\Z)", re.DOTALL)


def summary_at(text: str) -> int:
    """Where a compaction summary starts in `text`, or -1 when it holds none. Pure."""
    if any(t in text for t in _SUMMARY_TRAILERS) or sum(s in text for s in _CRUSH_SECTIONS) >= 3:
        return 0
    if not any(mark in text for mark in _SUMMARY_MARKS):
        return -1
    found = _SUMMARY.search(text)
    return found.start() if found else -1


_NESTED = ("text", "content", "output")  # where a part or block keeps its text


def client_given(origin: str, value, _depth: int = 0) -> list[Given]:
    """What a client generated (its system prompt, a tool's result) as Given parts of `origin`, but for a compaction
    summary in it, which is the model's. Pure."""
    if isinstance(value, str):
        at = summary_at(value)
        return [Given(origin, value)] if at < 0 else [Given(origin, value[:at]), Given(MODEL, value[at:])]
    if _depth > 64:  # deeper than any client's JSON: gives nothing (provenance.urls_in_value stops there too)
        return []
    if isinstance(value, list):
        return [g for v in value for g in client_given(origin, v, _depth + 1)]
    if isinstance(value, dict):  # a content part or block: its text and content read as above, the rest as it is
        nested = [g for k in _NESTED if k in value for g in client_given(origin, value[k], _depth + 1)]
        return [*nested, Given(origin, {k: v for k, v in value.items() if k not in _NESTED})]
    return [Given(origin, value)]


def typed(text: str) -> list[Given]:
    """A user-role text as Given parts: what a person typed ("user"), what a client generated ("tool"), and a
    compaction summary (the model's). Pure."""
    at = summary_at(text)
    if at >= 0:  # the summary and all after it are the model's, wherever a client put it in the text
        return [*(typed(text[:at]) if text[:at].strip() else []), Given(MODEL, text[at:])]
    start = text.lstrip()
    if _TOOL_OUTPUT.match(text) or start.startswith(_INJECTED):
        return [Given("tool", text)]
    blocks = [m.group(0) for m in _CLIENT_BLOCK.finditer(text)]
    person = _CLIENT_BLOCK.sub(" ", text) if blocks else text
    return [Given("user", person), *(Given("tool", b) for b in blocks)]


def user_given(content) -> list[Given]:
    """A user-role message's content (a string, or parts of any API's shapes) as Given parts. Pure."""
    out: list[Given] = []
    for part in content if isinstance(content, list) else [content]:
        text = part if isinstance(part, str) else as_dict(part).get("text")
        if isinstance(text, str):
            out.extend(typed(text))
        elif str(as_dict(part).get("type") or "").endswith("tool_result"):
            out.extend(client_given("tool", part))
        else:
            out.append(Given("user", part))  # an image's URL, a document the user attached
    return out

ROLES = {"system": "system", "developer": "system"}


def input_given(items) -> list[Given]:
    """A Responses `input` (a string is the user's) as Given parts. Pure."""
    if isinstance(items, str):
        return [Given("user", items)]
    out: list[Given] = []
    for item in items if isinstance(items, list) else []:
        item = as_dict(item)
        kind = str(item.get("type") or ("message" if "role" in item else ""))
        if kind == "message" and item.get("role") == "user":
            out.extend(user_given(item.get("content")))
        elif kind == "message" and item.get("role") in ROLES:
            out.extend(client_given(ROLES[str(item["role"])], item.get("content")))
        elif kind.endswith("_output"):  # function_call_output, custom_tool_call_output, local_shell_call_output, ...
            out.extend(client_given("tool", item.get("output")))
        elif kind == "web_search_call":
            # What the proxy's searches found, as it showed them, and the pages it read (an earlier web_fetch result,
            # which Anthropic's rule allows too); a search's query and a failed read's URL are only the model's words.
            action = as_dict(item.get("action"))
            sources = action.get("sources")
            out.append(Given("search", [as_dict(s).get("url") for s in sources] if isinstance(sources, list) else []))
            if action.get("type") in ("open_page", "find_in_page") and item.get("status") == "completed":
                out.append(Given(READ, action.get("url")))  # read earlier: at the depth it was read at
            else:
                out.append(Given(MODEL, action))
        else:
            out.append(Given(MODEL, {k: v for k, v in item.items() if k != "content"} if kind == "message" else item))
            if kind == "message":
                out.extend(_citations(item))
    return out


def _citations(message: dict) -> list[Given]:
    """The url_citation annotations the proxy put on an earlier answer (the text they sit on is the model's)."""
    content = message.get("content")
    parts: list = content if isinstance(content, list) else []
    out = [Given(MODEL, [as_dict(p).get("text") for p in parts] or content)]
    for part in parts:
        notes = as_dict(part).get("annotations")
        if isinstance(notes, list):
            out.extend(Given(READ, as_dict(a).get("url")) for a in notes)
    return out
