"""The pure rules that turn a downloaded body into text: media type and charset, the kind of page, sniffing,
the one bounded gzip/deflate decoder (the Fetcher's and SearXNG's answers both), decoding and the token budget.

No network and no state; tested in tests/test_fetch.py and tests/test_rules.py.
"""
from __future__ import annotations

import codecs
import re

CHARS_PER_TOKEN = 4  # the usual estimate for English text and code; no tokenizer is loaded for it
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
# XHTML names its encoding in the XML declaration only, often without a <meta charset> (older government and
# university sites in ISO-8859-1): read after <meta>, which a text/html page's browser obeys first.
XML_ENCODING = re.compile(rb"""^\s*<\?xml[^>]+encoding\s*=\s*["']([A-Za-z0-9._:-]+)""")


def decode_text(body: bytes, header_charset: str | None, html: bool) -> str:
    """Bytes -> str: a byte-order mark, then the header's charset, then <meta charset> or the XML declaration's encoding
    (HTML), then UTF-8 with replacement."""
    for bom, name in ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")):
        if body.startswith(bom):
            return body[len(bom):].decode(name, "replace")
    charset = _lookup(header_charset)
    if charset is None and html:
        m = META_CHARSET.search(body[:4096]) or XML_ENCODING.match(body[:1024])
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
