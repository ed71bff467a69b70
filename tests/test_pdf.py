"""PDFs through web_fetch: what the model reads of a PDF (text in reading order, page count, cut short), the clear errors
for PDFs without readable text, sniffing, and the extraction pool's limits applying to PDFs as to pages; the PDFs are
written by standins/pdf_files.py. Run: tests/run.sh tests/test_pdf.py
"""
from __future__ import annotations

import pytest

from proxy.backends.pages.fetcher import Fetcher
from proxy.backends.pages.pagetext import sniff_type
from proxy.backends.pages.pdftext import PdfRefused, pdf_to_text
from proxy.tools.web_fetch import FetchError
from standins import pdf_files as P
from tests.test_fetch import code_of, make, url


def long_pdf(pages: int = 10) -> bytes:
    return P.build([P.text_page(*[f"line {i} of page {n + 1} about admission control" for i in range(40)])
                    for n in range(pages)])


def test_a_pdf_reads_as_its_text_with_title_and_page_count():
    data = P.build([P.text_page("Scheduler notes", "Admission waits for cache room."), P.text_page("Second page.")],
                   title="Notes (draft)")
    title, text, cut, pages = pdf_to_text(data)
    assert title == "Notes (draft)" and pages == 2 and not cut
    assert text == ("PDF, 2 pages.\n\n[page 1]\nScheduler notes\nAdmission waits for cache room.\n\n"
                    "[page 2]\nSecond page.")


def test_two_columns_come_out_in_reading_order():
    """Drawn row by row across both columns; pdfminer's layout analysis reads the left column, then the right."""
    left = [f"Left column line {i} on admission." for i in range(8)]
    right = [f"Right column line {i} on eviction." for i in range(8)]
    _, text, _, _ = pdf_to_text(P.build([P.two_column_page(left, right)]))
    assert text.index("Left column line 7") < text.index("Right column line 0")
    assert text.index("Left column line 0") < text.index("Left column line 1")


def test_a_long_pdf_is_cut_at_the_budget_and_says_which_pages_it_holds():
    title, text, cut, pages = pdf_to_text(long_pdf(10), max_chars=3000)
    assert cut and pages == 10 and title is None
    first = text.split("\n", 1)[0]
    assert first.startswith("PDF, 10 pages; the text of pages 1-") and first.endswith("the rest was cut short.")
    read = int(first.split("pages 1-")[1].split(" ")[0])
    assert 1 < read < 10 and f"[page {read}]" in text and f"[page {read + 1}]" not in text
    assert len(text) < 3000 * 1.5


def test_reading_stops_at_its_share_of_the_cpu_limit_after_the_first_page():
    _, text, cut, pages = pdf_to_text(long_pdf(5), cpu_budget=0)
    assert cut and pages == 5 and text.startswith("PDF, 5 pages; the text of page 1 follows, the rest was cut short.")
    assert "line 39 of page 1" in text and "[page 2]" not in text


def test_a_page_count_the_file_lies_about_is_not_believed():
    _, text, _, pages = pdf_to_text(P.build([P.text_page("only page")], page_count=10 ** 9))
    assert pages == 1 and text.startswith("PDF, 1 page.")


@pytest.mark.parametrize("data, phrase", [
    (P.build([P.text_page("a secret")], encrypted=True), "encrypted and needs a password"),
    (P.build([P.image_page(), P.image_page()]), "2 pages hold no text, only images"),
    (b"%PDF-1.7 \x00\x01" * 1000, "not a PDF the proxy can read"),
    (long_pdf(3)[:2000], "cut off before its end"),
])
def test_a_pdf_without_readable_text_is_a_clear_refusal(data, phrase):
    with pytest.raises(PdfRefused) as e:
        pdf_to_text(data)
    assert e.value.code == "unsupported_content_type" and phrase in e.value.message


def test_a_pdf_is_sniffed_by_its_signature():
    assert sniff_type(P.build([P.text_page("x")])) == "application/pdf"
    assert sniff_type(b"\r\n junk before %PDF-1.4 the signature") == "application/pdf"
    assert sniff_type(b"<html><body>%PDF- mentioned</body></html>"[:10] + b"x" * 2000 + b"%PDF-") == "text/html"


# -- through the fetcher and its extraction pool --------------------------------------------------

@pytest.mark.parametrize("headers", [{"Content-Type": "application/pdf"}, {},
                                     {"Content-Type": "application/octet-stream"}])
def test_web_fetch_reads_a_pdf_served_or_sniffed(site, headers):
    site.route("/paper.pdf", P.build([P.text_page("Attention is what you need.")], title="A paper"), headers=headers)
    page = make().fetch(url(site, "/paper.pdf"))
    assert page.content_type == "application/pdf" and page.title == "A paper" and not page.truncated
    assert page.text == "PDF, 1 page.\n\n[page 1]\nAttention is what you need."
    assert "application/pdf" in site.requests[0].headers["accept"]


def test_web_fetch_notes_a_pdf_cut_to_the_budget(site):
    site.route("/long.pdf", long_pdf(10), headers={"Content-Type": "application/pdf"})
    page = make(web_fetch_max_tokens=500).fetch(url(site, "/long.pdf"))
    assert page.truncated and "the rest was cut short" in page.text.split("\n", 1)[0]
    assert "[page 1]" in page.text and "[page 10]" not in page.text


def test_web_fetch_refuses_an_encrypted_pdf_with_a_tool_error(site):
    site.route("/locked.pdf", P.build([P.text_page("a secret")], encrypted=True), headers={"Content-Type": "application/pdf"})
    e = code_of(lambda: make().fetch(url(site, "/locked.pdf")))
    assert e.code == "unsupported_content_type" and "encrypted" in e.message and "/locked.pdf" in e.message
    # A refusal is not a failure of the child: the next document is read by the same pool.
    site.route("/ok.pdf", P.build([P.text_page("readable")]), headers={"Content-Type": "application/pdf"})
    assert "readable" in make().fetch(url(site, "/ok.pdf")).text


def test_the_pools_memory_limit_applies_to_a_pdf(site):
    """A content stream that inflates to 300 MB, read by a child limited to 150 MiB: the limit is named, and the
    next PDF is read by a fresh child."""
    site.route("/bomb.pdf", P.bomb(300), headers={"Content-Type": "application/pdf"})
    fetcher: Fetcher = make(web_fetch_extract_memory_mb=150)
    e: FetchError = code_of(lambda: fetcher.fetch(url(site, "/bomb.pdf")))
    assert e.code == "url_not_accessible" and "150 MiB of memory (WEB_FETCH_EXTRACT_MEMORY_MB)" in e.message
    site.route("/after.pdf", P.build([P.text_page("after the bomb")]), headers={"Content-Type": "application/pdf"})
    assert "after the bomb" in fetcher.fetch(url(site, "/after.pdf")).text


def test_an_opaque_download_that_is_not_a_pdf_is_still_refused(site):
    site.route("/blob", b"PK\x03\x04\x00\x01" * 1000, headers={"Content-Type": "application/octet-stream"})
    e = code_of(lambda: make().fetch(url(site, "/blob")))
    assert e.code == "unsupported_content_type" and "application/octet-stream" in e.message
