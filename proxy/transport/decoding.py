"""Content-Encoding undone within a byte limit (gzip and deflate; a zip bomb stops at the limit): the one decoder
under the web client (SearXNG's answers, pages) and the vLLM client's turns. Pure; tests/test_fetch.py and
tests/test_upstream.py check it through both clients.
"""
from __future__ import annotations

import zlib
from typing import Any


class UnknownEncoding(ValueError):
    """A Content-Encoding the decoder cannot undo (br, zstd, ...); its message is one sentence for a reader."""


class Decoder:
    """Undoes Content-Encoding gzip/deflate incrementally, never producing more than asked for (zip bombs)."""

    def __init__(self, encoding: str):
        encoding = (encoding or "identity").strip().lower()
        self._z: Any  # a zlib decompressor, "deflate" until the first bytes pick one, or None
        if encoding in ("", "identity"):
            self._z = None
        elif encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._z = "deflate"  # zlib-wrapped or raw: decided on the first bytes
        else:
            raise UnknownEncoding(f"The server sent the page in an encoding the proxy cannot decode ({encoding}).")
        self._pending = b""

    def feed(self, data: bytes, limit: int) -> bytes:
        """Decoded bytes of `data` (plus what earlier calls held back), at most `limit` of them."""
        if self._z is None:
            out = self._pending + data
            self._pending = out[limit:]
            return out[:limit]
        if self._z == "deflate":
            # RFC 9110's deflate is zlib-wrapped, but some servers send raw deflate: a zlib header says which.
            wrapped = len(data) >= 2 and (data[0] & 0x0F) == 8 and int.from_bytes(data[:2], "big") % 31 == 0
            self._z = zlib.decompressobj() if wrapped else zlib.decompressobj(-zlib.MAX_WBITS)
        data = self._pending + data
        out = self._z.decompress(data, limit) if limit > 0 else b""
        self._pending = self._z.unconsumed_tail if limit > 0 else data
        return out


class BoundedDecoder:
    """A Decoder over a whole body that refuses more than `limit` decoded bytes in all; take() raises ValueError
    past the limit or on a body that does not decompress (for a gateway's answers to the search loop)."""

    def __init__(self, encoding: str, limit: int):
        self._decoder = Decoder(encoding)
        self._left = limit

    def take(self, data: bytes) -> bytes:
        try:
            out = self._decoder.feed(data, self._left + 1)
        except zlib.error as e:
            raise ValueError(f"the body does not decompress ({e})") from None
        if len(out) > self._left:
            raise ValueError("the decompressed body is over the proxy's limit (MAX_BODY_BYTES)")
        self._left -= len(out)
        return out
