"""A tiny PDF writer for the tests (tests/test_pdf.py, tests/test_fetch.py): text pages in Helvetica, pages with no text,
two-column pages, encrypted and bomb files, written byte by byte so no binary comes from elsewhere; not run on its own.
"""
from __future__ import annotations

import zlib


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def text_page(*lines: str) -> bytes:
    """A content stream writing `lines` top to bottom."""
    ops = ["BT /F1 12 Tf 14 TL 72 750 Td"]
    ops += [f"({_escape(line)}) '" for line in lines]
    ops.append("ET")
    return "\n".join(ops).encode("latin-1")


def two_column_page(left: list[str], right: list[str]) -> bytes:
    """Two columns drawn row by row (left line, right line, ...), as table-driven generators write them: the content
    stream's order is not the reading order."""
    ops = []
    for i, (a, b) in enumerate(zip(left, right, strict=True)):
        y = 750 - 14 * i
        ops.append(f"BT /F1 11 Tf 50 {y} Td ({_escape(a)}) Tj ET")
        ops.append(f"BT /F1 11 Tf 320 {y} Td ({_escape(b)}) Tj ET")
    return "\n".join(ops).encode("latin-1")


def image_page() -> bytes:
    """A page with only drawing on it (a scan's page holds an image: no text either way)."""
    return b"0.5 g 72 72 400 600 re f"


def build(pages: list[bytes], title: str | None = None, encrypted: bool = False, compress: bool = False,
          page_count: int | None = None) -> bytes:
    """A PDF of the given content streams. `encrypted`: a /Standard security handler whose user password is not
    empty (random /O and /U), so no reader opens it without one. `page_count`: what the page tree claims."""
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in below, once the page tree's number is known
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    tree = add(b"")
    kids = []
    for content in pages:
        data = zlib.compress(content) if compress else content
        filt = b" /Filter /FlateDecode" if compress else b""
        stream = add(b"<< /Length %d%s >>\nstream\n" % (len(data), filt) + data + b"\nendstream")
        kids.append(add(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                        b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (tree, stream, font)))
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % tree
    objects[tree - 1] = (b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % k for k in kids)
                         + b"] /Count %d >>" % (len(kids) if page_count is None else page_count))
    info = add(b"<< /Title (" + _escape(title).encode("latin-1") + b") >>") if title else None
    encrypt = None
    if encrypted:
        encrypt = add(b"<< /Filter /Standard /V 1 /R 2 /O <" + b"ab" * 32 + b"> /U <" + b"cd" * 32 + b"> /P -4 >>")
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    trailer = b"<< /Size %d /Root %d 0 R" % (len(objects) + 1, catalog)
    if info:
        trailer += b" /Info %d 0 R" % info
    if encrypt:
        trailer += b" /Encrypt %d 0 R /ID [<" % encrypt + b"01" * 16 + b"> <" + b"01" * 16 + b">]"
    out += b"trailer\n" + trailer + b" >>\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def bomb(megabytes: int = 300) -> bytes:
    """One page whose content stream inflates from a few hundred KB to `megabytes` MB of spaces."""
    return build([b" " * (megabytes * 1024 * 1024)], compress=True)
