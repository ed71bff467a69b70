"""The pure rules that turn a downloaded body into text: media type and charset, the kind of page, sniffing,
the one bounded gzip/deflate decoder (the Fetcher's and SearXNG's answers both), decoding and the token budget.

No network and no state; tested in tests/test_fetch.py and tests/test_rules.py.
"""
from __future__ import annotations

import codecs
import re
import zlib
from typing import Any

from .fetch_wire import FetchError

CHARS_PER_TOKEN = 4  # the usual estimate for English text and code; no tokenizer is loaded for it
READ_CHUNK = 64 * 1024  # one receive's bytes: the byte cap and the deadline are checked between reads
HTML_TYPES = ("text/html", "application/xhtml+xml")
PDF_TYPES = ("application/pdf", "application/x-pdf")
# What servers send a download as; the body's first bytes then tell whether it is a PDF (or text) after all.
OPAQUE_TYPES = ("application/octet-stream", "binary/octet-stream", "application/download",
                "application/force-download", "application/x-download")


def media_type(header: str | None) -> tuple[str, str | None]:
    """Content-Type header -> (lower-case media type, charset parameter or None)."""
    if not header:
        return "", None
    mime, _, params = header.partition(";")
    charset = None
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip("\"'")
    return mime.strip().lower(), charset


def kind_of(mime: str) -> str | None:
    """"html", "pdf", "text" (passed through) or None (unsupported) for a media type."""
    if mime in HTML_TYPES:
        return "html"
    if mime in PDF_TYPES:
        return "pdf"
    if mime.startswith("text/") or mime == "application/json" or mime.endswith("+json"):
        return "text"
    return None


def sniff_type(body: bytes) -> str:
    """A media type for a body sent without Content-Type (or as an opaque download): a PDF by its signature, HTML if
    it starts like HTML, text if it has no NUL bytes."""
    if b"%PDF-" in body[:1024]:  # PDF readers accept the signature anywhere in the first KiB
        return "application/pdf"
    head = body[:1024].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html")) or b"<html" in head:
        return "text/html"
    return "text/plain" if b"\x00" not in body[:4096] else "application/octet-stream"


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
            raise FetchError("unsupported_content_type", f"The server sent the page in an encoding the proxy cannot decode ({encoding}).")
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


# Codecs Python knows but no web page is written in: a page naming one (charset=rot13, base64, hex, zlib,
# or the idna/punycode/escape codecs) is read as UTF-8 instead, like a name Python does not know.
NOT_PAGE_CODECS = frozenset({"undefined", "idna", "punycode", "unicode-escape", "raw-unicode-escape"})


def _lookup(name: str | None) -> str | None:
    """The codec a charset label names, when it is a text encoding a page may use; else None."""
    if not name:
        return None
    try:
        info = codecs.lookup(name.strip())
    except (LookupError, ValueError):
        return None
    # bytes-to-bytes and str-to-str codecs (base64, zlib, rot13) are not text encodings: bytes.decode refuses them.
    if not getattr(info, "_is_text_encoding", True) or info.name in NOT_PAGE_CODECS:
        return None
    return info.name


META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.I)


def decode_text(body: bytes, header_charset: str | None, html: bool) -> str:
    """Bytes -> str: a byte-order mark, then the header's charset, then <meta charset> (HTML), then UTF-8 with replacement."""
    for bom, name in ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")):
        if body.startswith(bom):
            return body[len(bom):].decode(name, "replace")
    charset = _lookup(header_charset)
    if charset is None and html:
        m = META_CHARSET.search(body[:4096])
        charset = _lookup(m.group(1).decode("ascii")) if m else None
    try:
        return body.decode(charset or "utf-8", "replace")
    except (LookupError, UnicodeError, ValueError, TypeError):
        return body.decode("utf-8", "replace")  # a codec that fails even with "replace": the page's bytes as UTF-8


def cut_to_budget(text: str, tokens: int) -> tuple[str, bool]:
    """Text of at most `tokens` tokens (CHARS_PER_TOKEN characters each), cut at a line or word end when one is near."""
    limit = tokens * CHARS_PER_TOKEN
    if len(text) <= limit:
        return text, False
    cut = text[:limit]
    for sep in ("\n", " "):
        at = cut.rfind(sep)
        if at > limit * 0.9:
            return cut[:at].rstrip(), True
    return cut, True
