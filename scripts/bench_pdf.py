"""Compares PDF text extractors (pdfminer.six as proxy/backends/pages/pdftext.py uses it, pypdf, and PyMuPDF for reference only: it is
AGPL) on speed and reading order; run: python scripts/bench_pdf.py [FILE.pdf ...] in a venv with pdfminer.six, pypdf and
pymupdf (and orjson for proxy.backends.pages.extract's imports).

Reading order is judged on a generated two-column page whose content stream draws the columns row by row (left line,
right line, ...), as table-driven generators do: an extractor reads it in order when every left-column line comes
before the first right-column line. Speed: the best of 3 extractions of each file, in this process.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def engines() -> dict[str, Callable[[bytes], str]]:
    from proxy.backends.pages.pdftext import pdf_to_text
    out: dict[str, Callable[[bytes], str]] = {"pdfminer.six (proxy.backends.pages.pdftext)": lambda data: pdf_to_text(data)[1]}
    try:
        import pypdf
        out["pypdf"] = lambda data: "\n".join(p.extract_text() or "" for p in pypdf.PdfReader(io.BytesIO(data)).pages)
    except ImportError:
        print("pypdf is not installed: left out")
    try:
        import pymupdf
        out["pymupdf (AGPL, reference)"] = lambda data: "\n".join(
            p.get_text() for p in pymupdf.open(stream=data, filetype="pdf"))
    except ImportError:
        print("pymupdf is not installed: left out")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="PDF files to time")
    args = ap.parse_args()
    from standins import pdf_files
    left = [f"Left column line {i} about admission control." for i in range(30)]
    right = [f"Right column line {i} about cache eviction." for i in range(30)]
    two_columns = pdf_files.build([pdf_files.two_column_page(left, right)])
    docs = [("two columns, drawn row by row", two_columns)]
    docs += [(os.path.basename(f), open(f, "rb").read()) for f in args.files]
    fns = engines()
    print(f"{'extractor':30} {'reading order':>13} " + " ".join(f"{name[:26]:>28}" for name, _ in docs[1:]))
    for label, fn in fns.items():
        text = fn(two_columns)
        in_order = max(text.find(line) for line in left) < text.find(right[0])
        cells = []
        for _name, data in docs[1:]:
            best, chars = float("inf"), 0
            for _ in range(3):
                start = time.perf_counter()
                chars = len(fn(data))
                best = min(best, time.perf_counter() - start)
            cells.append(f"{best * 1000:8.0f} ms {chars:8,d} ch")
        print(f"{label:30} {'yes' if in_order else 'no':>13} " + " ".join(f"{c:>28}" for c in cells))


if __name__ == "__main__":
    main()
