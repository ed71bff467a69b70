"""JSON in and out of the proxy: orjson for speed, the standard library for its corner cases.

Used by every handler; not run on its own. A 250k-token prompt is about 1 MB of JSON, which
the standard library takes ~8 ms to parse and ~4 ms to write; orjson takes under 1.5 ms for
both (scripts/proxy_overhead.py, case 4). orjson refuses what the standard library accepts
in two corners that clients may legally send: lone surrogate escapes ("\\ud800") and
integers beyond 64 bits. Those fall back to the standard library, so behaviour is unchanged.
"""
from __future__ import annotations

import json

import orjson


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


def as_dict(value) -> dict:
    """A JSON value where an object is expected: itself if it is one, else empty (clients send anything)."""
    return value if isinstance(value, dict) else {}


def as_list(value) -> list:
    """A JSON value where an array is expected: itself if it is one, else empty."""
    return value if isinstance(value, list) else []
