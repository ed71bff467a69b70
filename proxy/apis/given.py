"""What a list of OpenAI Responses input items gives web_fetch, pure (issue 33), shared by the Responses API
(proxy/apis/responses/given.py) and Codex's /v1/alpha/search, whose `input` is the same items: each part in order
with who wrote it (proxy/tools/provenance.py's Given). System, developer and user messages, every client tool's
output item, and the sources, completed page reads and citations of earlier searches give URLs; the model's
messages, calls and reasoning give none. Tested by tests/test_provenance.py.
"""
from __future__ import annotations

from proxy.core.codec import as_dict
from proxy.tools.provenance import MODEL, Given

ROLES = {"system": "system", "developer": "system", "user": "user"}


def input_given(items) -> list[Given]:
    """A Responses `input` (a string is the user's) as Given parts. Pure."""
    if isinstance(items, str):
        return [Given("user", items)]
    out: list[Given] = []
    for item in items if isinstance(items, list) else []:
        item = as_dict(item)
        kind = str(item.get("type") or ("message" if "role" in item else ""))
        if kind == "message" and item.get("role") in ROLES:
            out.append(Given(ROLES[str(item["role"])], item.get("content")))
        elif kind.endswith("_output"):  # function_call_output, custom_tool_call_output, local_shell_call_output, ...
            out.append(Given("tool", item.get("output")))
        elif kind == "web_search_call":
            # What the proxy's searches found, as it showed them, and the pages it read (an earlier web_fetch result,
            # which Anthropic's rule allows too); a search's query and a failed read's URL are only the model's words.
            action = as_dict(item.get("action"))
            sources = action.get("sources")
            out.append(Given("search", [as_dict(s).get("url") for s in sources] if isinstance(sources, list) else []))
            if action.get("type") in ("open_page", "find_in_page") and item.get("status") == "completed":
                out.append(Given("search", action.get("url")))
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
            out.extend(Given("search", as_dict(a).get("url")) for a in notes)
    return out
