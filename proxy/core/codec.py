"""The proxy's wire codecs, in one place: JSON bodies (orjson, with the standard library for its corner cases)
and server-sent events (read without touching them, and written as vLLM frames them).

Used by every API module; not run on its own (tests: tests/run.sh tests/test_rules.py).

JSON: a 250k-token prompt is about 1 MB of JSON, which the standard library takes ~8 ms to parse and
~4 ms to write; orjson takes under 1.5 ms for both (scripts/proxy_overhead.py, case 4), so every API's
bodies go through loads/dumps here. orjson refuses what the standard library accepts in two corners that
clients may legally send: lone surrogate escapes ("\\ud800") and integers beyond 64 bits. Those fall back to
the standard library, so what is accepted is unchanged.
"""
from __future__ import annotations

import json

import orjson

# ---- JSON ---------------------------------------------------------------------------------------

def loads(data):
    """Parse bytes or str; raises ValueError (or UnicodeDecodeError, RecursionError) as json does."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(obj) -> bytes:
    """Compact UTF-8 JSON, as vLLM writes it; a lone surrogate goes out as the escape it came in as."""
    try:
        return orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError):
        try:
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
        except UnicodeEncodeError:
            return json.dumps(obj, separators=(",", ":")).encode()


_UNREAD = object()


class Decoded:
    """A request body and its JSON, decoded at most once however many readers ask for it (the session key, the API's
    handler): a 1 MB agent history takes a millisecond or more to decode. The value is shared, so a reader that
    changes it (a handler making vLLM's request) goes last; `members` keeps the object's members as they were decoded,
    whatever a handler later sets on it, for encoded_over."""

    __slots__ = ("raw", "_value", "_error", "members")

    def __init__(self, raw: bytes):
        self.raw = raw
        self._value = _UNREAD
        self._error: BaseException | None = None
        self.members: dict | None = None  # a shallow copy of the object as decoded (None: not read, or not an object)

    def value(self):
        """The body's JSON; raises what loads() raised (ValueError, UnicodeDecodeError, RecursionError) every time."""
        if self._value is _UNREAD:
            try:
                self._value = loads(self.raw)
            except (ValueError, RecursionError) as e:
                self._value, self._error = None, e
            if isinstance(self._value, dict):
                self.members = dict(self._value)  # a dozen keys: the history stays shared, not copied
        if self._error is not None:
            raise self._error
        return self._value


# How many places a member's key is tried at, from the end, before encoding the whole body after all.
_CUT_TRIES = 8


def encoded_over(new, client: Decoded | None) -> bytes:
    """`new` as JSON, written over the client's body it was made from: the client's own bytes for the run of leading
    members `new` still holds (the same objects, so a 1 MB history is not encoded again: half a millisecond), then
    the rest encoded. dumps(new) when nothing leads unchanged, or where the run ends cannot be told cheaply.

    The cut is only taken where it is certain: the members after it, read back from the client's bytes, must be
    exactly the ones the body was decoded with after the run, and what they close must be the whole body. Meaning is
    as dumps(new) gives it for every parser that keeps the last of duplicate keys (vLLM's); a key the client itself
    sent twice inside the run stays twice. The run's objects must not have been changed in place: every API's rewrite
    copies what it changes, and returns what it left alone as the same object (tests/test_codec_over.py for the cut,
    tests/test_decode_once.py for each API's first turn)."""
    if client is None or not client.members or not isinstance(new, dict):
        return dumps(new)
    members = client.members
    keys = list(members)
    kept = 0
    for key in keys:
        if key not in new or new[key] is not members[key]:
            break
        kept += 1
    cut = _cut_after(client.raw, members, keys, kept) if kept else None
    if cut is None:
        return dumps(new)
    leading = set(keys[:kept])
    rest = {k: v for k, v in new.items() if k not in leading}
    return client.raw[:cut] + (b"," + dumps(rest)[1:] if rest else b"}")


def _cut_after(raw: bytes, members: dict, keys: list, kept: int) -> int | None:
    """Where in `raw` (a JSON object decoded as `members`, its keys in order `keys`) the first `kept` members end, or
    None when that cannot be told without reading most of the body again."""
    if kept == len(keys):
        last = _before_space(raw, len(raw))
        return _before_space(raw, last - 1) if raw[last - 1:last] == b"}" else None
    following = keys[kept:]
    wanted = {k: members[k] for k in following}
    needle = dumps(following[0])  # the next member's key as the client most likely wrote it
    end = len(raw)
    for _ in range(_CUT_TRIES):
        at = raw.rfind(needle, 0, end)
        if at < 0:
            return None
        end = at
        comma = _before_space(raw, at)  # the byte after the key's separator, if it is one
        if comma == 0 or raw[comma - 1:comma] != b",":
            continue
        if 2 * (len(raw) - comma) > len(raw):
            return None  # the rest is most of the body: reading it again saves nothing
        try:
            read = loads(b"{" + raw[comma:])
        except (ValueError, RecursionError):
            continue  # a key of the same name inside a later member
        if read == wanted:
            return comma - 1
    return None


def _before_space(raw: bytes, end: int) -> int:
    """Where the JSON whitespace that ends at `end` starts (slicing a megabyte to strip it would copy it)."""
    while end and raw[end - 1] in b" \t\r\n":
        end -= 1
    return end


def as_dict(value) -> dict:
    """A JSON value where an object is expected: itself if it is one, else empty (clients send anything)."""
    return value if isinstance(value, dict) else {}


def as_list(value) -> list:
    """A JSON value where an array is expected: itself if it is one, else empty."""
    return value if isinstance(value, list) else []


def tool_arguments(raw):
    """A tool call's arguments decoded: chat and Responses carry them as a JSON string (empty meaning none), Messages
    as the object itself. Raises ValueError for a string that is not JSON; the caller checks the type it needs."""
    if isinstance(raw, str):
        return loads(raw) if raw.strip() else {}
    return raw


def arguments_text(obj) -> str:
    """A tool call's arguments as the string vLLM's tool parsers write (json.dumps with its default spacing,
    non-ASCII kept): what a client sees in `arguments` must not depend on which side made the call."""
    return json.dumps(obj, ensure_ascii=False)


# ---- server-sent events: reading ------------------------------------------------------------------

def iter_frame_batches(chunks):
    """For each network read, the events it completed (their bytes, blank-line terminator
    included), as a list, possibly empty.

    Network reads split and merge events freely; relaying whole events unchanged keeps the
    client's bytes identical to vLLM's while letting the proxy look at each one, and a
    read's events together can leave in one write. A tail without its blank line (a stream
    cut short) comes last, alone.
    """
    buf = b""
    for chunk in chunks:
        buf = buf + chunk if buf else chunk
        # One read can hold hundreds of events: step through it, don't re-slice what's left.
        frames, start = [], 0
        while True:
            cut = buf.find(b"\n\n", start)
            if cut < 0:
                break
            frames.append(buf[start:cut + 2])
            start = cut + 2
        buf = buf[start:]
        yield frames
    if buf:
        yield [buf]


def iter_frames(chunks):
    """Each complete event as it completes (see iter_frame_batches)."""
    for frames in iter_frame_batches(chunks):
        yield from frames


def data_of(frame: bytes) -> bytes | None:
    """The payload of a one-line `data:` event, or None for comments and other fields."""
    if frame.startswith(b"data: "):
        return frame[6:].rstrip(b"\r\n")
    if frame.startswith(b"data:"):
        return frame[5:].rstrip(b"\r\n")
    return None


def event_and_data(frame: bytes) -> tuple[str | None, bytes | None]:
    """The `event:` name and `data:` payload of a named event (Anthropic and Responses style)."""
    event = data = None
    for line in frame.split(b"\n"):
        line = line.rstrip(b"\r")
        if line.startswith(b"event:"):
            event = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            part = line[5:]
            part = part[1:] if part.startswith(b" ") else part
            data = part if data is None else data + b"\n" + part
    return event, data


# ---- server-sent events: writing, as vLLM frames them (compact JSON, one data line, a blank line) --

DONE = b"data: [DONE]\n\n"


def data(obj) -> bytes:
    """An unnamed event (chat completions' chunks and errors)."""
    return b"data: " + dumps(obj) + b"\n\n"


def event(name: str, obj) -> bytes:
    """A named event (Anthropic Messages and Responses)."""
    return b"event: " + name.encode() + b"\ndata: " + dumps(obj) + b"\n\n"


def raw_event(name: str, payload: bytes) -> bytes:
    """A named event around JSON someone else wrote (vLLM's own error body): one line, as SSE needs."""
    return b"event: " + name.encode() + b"\ndata: " + payload.strip().replace(b"\n", b" ") + b"\n\n"


def comment(text: str) -> bytes:
    """An SSE comment line: every client ignores it, and it keeps idle timeouts at bay."""
    return b": " + text.replace("\n", " ").encode("utf-8", "replace") + b"\n\n"  # a query a model wrote may hold a lone surrogate
