"""Checks of a client's JSON at the point a handler reads it: a field of the wrong JSON type (a
list where a string belongs, a number where a list belongs) raises Invalid, which each API
answers as a 400 in its own error shape, so nothing further in reads a type it does not expect.

Used by the API handlers (proxy/apis/*/); pure, not run on its own. Fields the
proxy only relays are not checked here: vLLM judges those and its 400 is relayed.
"""
from __future__ import annotations

_NAMES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
          list: "an array", dict: "an object"}


def type_name(value) -> str:
    return _NAMES.get(type(value), type(value).__name__)


class Invalid(ValueError):
    """A field of the wrong type: `param` is its path (`tools[0].function.name`), `problem` what it must be."""

    def __init__(self, param: str, expected: str, value, problem: str | None = None):
        self.param = param
        self.problem = problem or f"must be {expected}, not {type_name(value)}"
        super().__init__(self.openai_message)

    @property
    def openai_message(self) -> str:
        return f"`{self.param}` {self.problem}."

    @property
    def anthropic_message(self) -> str:
        """Anthropic names the field first (`tools.0.name: Input should be ...`)."""
        return f"{self.param}: {self.problem}"


def kind(value) -> str | None:
    """The `type` of a JSON object when it is a string, else None: only a string names a tool or
    block kind, and a list or object there must not reach a set or dict lookup (unhashable)."""
    t = value.get("type") if isinstance(value, dict) else None
    return t if isinstance(t, str) else None


def obj(value, param: str) -> dict:
    """An object, or {} for null/absent."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Invalid(param, "an object", value)
    return value


def objects(value, param: str) -> list[dict]:
    """An array of objects, or [] for null/absent."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Invalid(param, "an array of objects", value)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise Invalid(f"{param}[{i}]", "an object", item)
    return value


def string(value, param: str) -> str | None:
    """A string, or None for null/absent."""
    if value is not None and not isinstance(value, str):
        raise Invalid(param, "a string", value)
    return value


def encodable(value, param: str) -> str | None:
    """A string that UTF-8 can encode, or None for null/absent. JSON lets a client (and a model) write a lone
    surrogate (`"\\ud800"`), which Python keeps in a str and no URL, header or log line can carry; text that goes
    there is refused here, at the edge, rather than raising deep inside (issue 55)."""
    if string(value, param) is not None and not is_encodable(value):
        raise Invalid(param, "text", value, "must be valid Unicode text, not a lone surrogate (\\ud800-\\udfff)")
    return value


def is_encodable(text: str) -> bool:
    """Whether UTF-8 can encode `text` (no lone surrogate in it). Pure."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_ITEM_STRINGS = ("type", "role", "id", "call_id", "name", "status")  # an input item's fields read as strings
_STRING_OR_NULL = (str, type(None))


def input_items(value, param: str = "input") -> None:
    """A Responses `input` (also Codex's alpha search's): a string, or an array of items whose `type`, `role`, `id`,
    `call_id`, `name` and `status`, when present, are strings (as OpenAI's schema has them), since the readers look
    them up in tables and match calls to outputs by them (apis/given.py, apis/responses/output.py)."""
    if value is None or isinstance(value, str):
        return
    for i, item in enumerate(objects(value, param)):
        if not typed_item(item):  # the path is built only for an item that fails: a 1 MB history holds ~600
            fields(item, f"{param}[{i}]", **dict.fromkeys(_ITEM_STRINGS, string))


def typed_item(item) -> bool:
    """Whether a Responses input item is an object whose _ITEM_STRINGS fields are strings where present: what
    input_items asks, as one answer (the Responses survey's, which decides whether input_items runs). Pure."""
    if not isinstance(item, dict):
        return False
    get, ok = item.get, _STRING_OR_NULL
    # Written out rather than a loop over _ITEM_STRINGS: it runs once per item of every history.
    return (isinstance(get("type"), ok) and isinstance(get("role"), ok) and isinstance(get("id"), ok)
            and isinstance(get("call_id"), ok) and isinstance(get("name"), ok) and isinstance(get("status"), ok))


def typed_role(message) -> bool:
    """Whether a message is an object whose `role` is a string where present: what roles() asks of it, as one answer
    (the chat and Messages surveys', which decide whether roles() runs). Pure."""
    return isinstance(message, dict) and isinstance(message.get("role"), _STRING_OR_NULL)


def roles(messages: list, param: str, sep: str = "[") -> None:
    """Each message's `role` a string when present (each API's readers look it up in tables); `sep` "[" names the
    field OpenAI's way (`messages[0].role`), "." Anthropic's (`messages.0.role`)."""
    for i, msg in enumerate(messages):
        if isinstance(msg, dict) and not typed_role(msg):
            string(msg.get("role"), f"{param}[{i}].role" if sep == "[" else f"{param}.{i}.role")


def strings(value, param: str) -> list[str]:
    """An array of strings, or [] for null/absent."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Invalid(param, "an array of strings", value)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise Invalid(f"{param}[{i}]", "a string", item)
    return value


def boolean(value, param: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise Invalid(param, "true or false", value)
    return value


def fields(item: dict, param: str, **checks) -> None:
    """Each named field of `item` through its check: fields(tool, "tools[0]", name=string)."""
    for key, check in checks.items():
        check(item.get(key), f"{param}.{key}")
