"""Server-sent-event framing: split a byte stream into whole events without touching them.

Used by the streaming search loops; not run on its own.
"""
from __future__ import annotations


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


def comment(text: str) -> bytes:
    """An SSE comment line: every client ignores it, and it keeps idle timeouts at bay."""
    return b": " + text.replace("\n", " ").encode() + b"\n\n"
