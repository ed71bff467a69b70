"""PDF to text for web_fetch with pdfminer.six (its layout analysis puts a page's columns in reading order), run by
the extraction pool's children (proxy/backends/pages/extract.py) under the same CPU, memory, size and time limits as HTML; pure
functions, tested in-process by tests/test_pdf.py (`tests/run.sh tests/test_pdf.py`).

A PDF is hostile like any page: streams that inflate to gigabytes (the child's memory limit), page trees that loop
(pdfminer skips a page object it has seen), thousands of pages (the text stops at the budget and at a share of the
CPU limit, the rest noted as cut short). A PDF that needs a password, or whose pages are images with no text, is a
PdfRefused with the web_fetch error code and the sentence the model reads.
"""
from __future__ import annotations

import io
import logging
import re
import time


class PdfRefused(Exception):
    """A PDF whose text cannot be read; `code` is Anthropic's web_fetch error code, `message` the model's sentence."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def pdf_to_text(data: bytes, max_chars: int | None = None, cpu_budget: float | None = None,
                ) -> tuple[str | None, str, bool, int]:
    """(title, text, cut, pages): the text of a PDF's pages in reading order, each page after a "[page N]" line, the
    first line saying how many pages there are and which were read. Reading stops once about `max_chars` are
    written or `cpu_budget` seconds of CPU are spent (then `cut`); raises PdfRefused for what cannot be read."""
    # pdfminer warns per odd object ("Ignoring (part of) ToUnicode map") and per page on loud PDFs.
    logging.getLogger("pdfminer").setLevel(logging.ERROR)
    from pdfminer.pdftypes import resolve1

    started = time.process_time()
    doc = _document(data)
    title = _title(doc)
    total = _page_count(doc, resolve1)
    limit = max_chars + max_chars // 4 if max_chars is not None else None
    pages, read, blank, cut = _read_pages(doc, lambda so_far: bool(  # whether to stop before the next page
        (limit is not None and sum(map(len, so_far)) >= limit)
        or (cpu_budget is not None and time.process_time() - started > cpu_budget)))
    total = max(total, read)
    if read == 0:
        raise PdfRefused("unsupported_content_type", "the PDF has no pages the proxy can read.")
    if blank == read and not cut:
        raise PdfRefused("unsupported_content_type", f"the PDF's {total} page{'s' if total != 1 else ''} hold no "
                         "text, only images (a scan?); web_fetch does not read text in images.")
    text = "\n\n".join(pages)
    if limit is not None and len(text) > limit:
        text, cut = text[:limit], True
    head = f"PDF, {total} page{'s' if total != 1 else ''}"
    if cut or read < total:
        cut = True
        head += f"; the text of {'page 1' if read == 1 else f'pages 1-{read}'} follows, the rest was cut short"
    return title, head + ".\n\n" + text, cut, total


def _document(data: bytes):
    """The parsed PDF, or PdfRefused saying why it cannot be read (encrypted, cut off, not a PDF)."""
    from pdfminer.pdfdocument import PDFDocument, PDFEncryptionError, PDFPasswordIncorrect
    from pdfminer.pdfparser import PDFParser, PDFSyntaxError
    from pdfminer.psparser import PSEOF, PSException

    try:
        return PDFDocument(PDFParser(io.BytesIO(data)))
    except (PDFPasswordIncorrect, PDFEncryptionError) as e:
        raise PdfRefused("unsupported_content_type", "the PDF is encrypted and needs a password to be read "
                         f"({type(e).__name__}).") from None
    except PSEOF:
        # The cross-reference table and trailer are at a PDF's end: a file cut by WEB_FETCH_MAX_BYTES has neither.
        raise PdfRefused("unsupported_content_type", "the PDF is cut off before its end (a file over the proxy's "
                         "WEB_FETCH_MAX_BYTES is read only in part, and a PDF cannot be read without its end).") from None
    except (PDFSyntaxError, PSException, ValueError, KeyError, TypeError) as e:
        raise PdfRefused("unsupported_content_type", f"the file is not a PDF the proxy can read ({e}).") from None


def _read_pages(doc, enough) -> tuple[list[str], int, int, bool]:
    """(each page's text after its "[page N]" line, pages read, blank ones among them, cut): page by page until
    `enough(pages so far)` says stop (at least one page first); a broken page costs that page, a broken page tree the rest."""
    from pdfminer.converter import TextConverter
    from pdfminer.layout import LAParams
    from pdfminer.pdfinterp import PDFPageInterpreter, PDFResourceManager
    from pdfminer.pdfpage import PDFPage
    from pdfminer.psparser import PSException

    rsrc = PDFResourceManager(caching=True)
    out = io.StringIO()
    device = TextConverter(rsrc, out, laparams=LAParams())
    interpreter = PDFPageInterpreter(rsrc, device)
    pages: list[str] = []
    read = blank = 0
    cut = False
    try:
        for number, page in enumerate(PDFPage.create_pages(doc), 1):
            if pages and enough(pages):
                cut = True
                break
            out.seek(0)
            out.truncate()
            try:
                interpreter.process_page(page)
            except (PSException, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
                # One broken page (a bad font, a stream cut by the byte cap) costs that page, not the document.
                pages.append(f"[page {number}]\n(this page cannot be read: {type(e).__name__})")
                read = number
                continue
            text = _tidy(out.getvalue())
            blank += not text
            pages.append(f"[page {number}]\n{text}" if text else f"[page {number}]")
            read = number
    except (PSException, ValueError, KeyError, TypeError) as e:
        if not pages:
            raise PdfRefused("unsupported_content_type", f"the PDF's pages cannot be read ({e}).") from None
        cut = True  # the page tree broke part way (often a file cut by WEB_FETCH_MAX_BYTES): what was read stays
    finally:
        device.close()
    return pages, read, blank, cut


def _tidy(text: str) -> str:
    """pdfminer's page text: form feeds and trailing spaces off, at most one blank line in a row."""
    text = "\n".join(line.rstrip() for line in text.replace("\x0c", "").splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _page_count(doc, resolve1) -> int:
    """The catalog's page count, for the head only (a hostile file can state any number)."""
    try:
        count = resolve1(resolve1(doc.catalog["Pages"])["Count"])
        return count if isinstance(count, int) and 0 <= count < 1_000_000 else 0
    except Exception:  # any broken catalog: the count is then the pages read
        return 0


def _title(doc) -> str | None:
    from pdfminer.pdftypes import resolve1
    from pdfminer.utils import decode_text
    try:
        raw = resolve1(doc.info[0].get("Title")) if doc.info else None
        title = decode_text(raw) if isinstance(raw, bytes) else raw if isinstance(raw, str) else None
    except Exception:  # a metadata dictionary of any shape: no title then
        return None
    title = " ".join(title.replace("\x00", "").split()) if title else ""
    return title[:300] or None

