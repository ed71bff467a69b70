"""Measures HTML-to-text extractors (speed, main text kept, navigation dropped) on documentation pages found offline on this machine; run: python scripts/bench_extract.py [--per-corpus N] in a venv with trafilatura, readability-lxml, html2text and markdownify.

How it judges a page: each corpus is a documentation generator whose markup names its main
content and its navigation (mdBook's <main> and sidebar, rustdoc, Node's API docs, npm's docs,
Sphinx, Texinfo). From that markup it takes the main content's paragraphs, list items and
code blocks, and the navigation's link texts that never occur in the main content. An
extractor keeps a paragraph (or code block) when its first 8 words appear, in order, in the
extractor's output; it leaks a navigation item when that item's words appear there. Speed is
wall time of one extraction, after one warm-up page, on one core.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import time

import lxml.html

RUST = os.path.expanduser("~/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/share/doc/rust/html")
# (name, glob, XPath of the main content, XPath of navigation)
CORPORA = [
    ("mdbook", f"{RUST}/book/ch*.html", "//main", "//nav[@id='mdbook-sidebar'] | //div[@id='mdbook-menu-bar'] | //nav[contains(@class,'nav-wrapper')]"),
    ("mdbook-ref", f"{RUST}/reference/*.html", "//main", "//nav[@id='mdbook-sidebar'] | //div[@id='mdbook-menu-bar']"),
    ("rustdoc", f"{RUST}/std/*/struct.*.html", "//main//section[@id='main-content']", "//nav[contains(@class,'sidebar')]"),
    ("nodejs", "/usr/share/doc/nodejs/api/*.html", "//div[@id='apicontent']", "//div[@id='column2'] | //div[@id='gtoc']"),
    ("npm", "/usr/lib/node_modules/npm/docs/output/commands/*.html", "//div[@id='_content']", "//header | //div[@id='logobar'] | //div[@id='banner']"),
    ("sphinx", "/root/.pyenv/versions/*/lib/python3.1*/idlelib/help.html", "//div[@class='body']", "//div[@class='sphinxsidebar'] | //div[@class='related']"),
    ("texinfo", "/usr/share/doc/libffi8/html/*.html", "//body", "//div[@class='nav-panel'] | //div[@class='header']"),
]


def words(text: str) -> list[str]:
    text = re.sub(r"\]\([^)]*\)", "]", text)  # markdown link targets are not page text
    return re.findall(r"\w+", text.lower())


def contains(haystack: str, needle: list[str]) -> bool:
    return " " + " ".join(needle) + " " in haystack


def truth(doc, main_xp: str, nav_xp: str):
    mains = doc.xpath(main_xp)
    if not mains:
        return None
    main = mains[0]
    main_words = " " + " ".join(words(main.text_content())) + " "
    paras = [words(e.text_content())[:8] for e in main.iter("p", "li", "dd")]
    paras = [w for w in paras if len(w) >= 8]
    code = [words(e.text_content())[:8] for e in main.iter("pre")]
    code = [w for w in code if len(w) >= 4]
    nav = set()
    for n in doc.xpath(nav_xp):
        for a in n.iter("a"):
            w = words(a.text_content())
            if len(w) >= 2 and not contains(main_words, w):
                nav.add(tuple(w))
    return paras, code, [list(w) for w in nav]


def extractors():
    import html2text
    import markdownify
    import trafilatura
    from readability import Document

    def h2t(html):
        h = html2text.HTML2Text()
        h.body_width = 0
        h.ignore_images = True
        return h.handle(html)

    return {
        "trafilatura(txt)": lambda html: trafilatura.extract(html, output_format="txt", include_tables=True,
                                                             include_comments=False, favor_recall=True) or "",
        "trafilatura(md)": lambda html: trafilatura.extract(html, output_format="markdown", include_tables=True,
                                                            include_comments=False, include_formatting=True,
                                                            favor_recall=True) or "",
        "readability+html2text": lambda html: h2t(Document(html).summary(html_partial=True)),
        "readability+markdownify": lambda html: markdownify.markdownify(Document(html).summary(html_partial=True)),
        "html2text(whole page)": h2t,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-corpus", type=int, default=8, help="pages per corpus, spread evenly over its files")
    args = ap.parse_args()
    pages = []
    for name, pattern, main_xp, nav_xp in CORPORA:
        files = sorted(f for f in glob.glob(pattern) if os.path.getsize(f) > 4000)
        step = max(1, len(files) // args.per_corpus)
        for path in files[::step][:args.per_corpus]:
            html = open(path, "rb").read().decode("utf-8", "replace")
            t = truth(lxml.html.fromstring(html), main_xp, nav_xp)
            if t and (t[0] or t[1]):
                pages.append((name, path, html, *t))
    print(f"{len(pages)} pages, {sum(len(p[2]) for p in pages) / len(pages) / 1024:.0f} KiB on average, "
          f"from {', '.join(sorted({p[0] for p in pages}))}")
    print(f"{'extractor':26} {'median ms':>9} {'p90 ms':>7} {'paras kept':>10} {'code kept':>9} {'nav leaked':>10} {'empty':>5}")
    per_corpus: dict[tuple[str, str], list[int]] = {}
    for label, fn in extractors().items():
        fn(pages[0][2])  # warm-up: imports, lazy tables
        times, kept, total, ckept, ctotal, leaked, ntotal, empty = [], 0, 0, 0, 0, 0, 0, 0
        for name, _path, html, paras, code, nav in pages:
            start = time.perf_counter()
            out = fn(html)
            times.append((time.perf_counter() - start) * 1000)
            hay = " " + " ".join(words(out)) + " "
            k = sum(contains(hay, p) for p in paras)
            c = sum(contains(hay, p) for p in code)
            leak = sum(contains(hay, n) for n in nav)
            kept, total, ckept, ctotal = kept + k, total + len(paras), ckept + c, ctotal + len(code)
            leaked, ntotal, empty = leaked + leak, ntotal + len(nav), empty + (len(out.strip()) < 200)
            acc = per_corpus.setdefault((label, name), [0, 0, 0, 0])
            acc[0] += k
            acc[1] += len(paras)
            acc[2] += leak
            acc[3] += len(nav)
        times.sort()
        print(f"{label:26} {statistics.median(times):9.1f} {times[int(len(times) * 0.9)]:7.1f} "
              f"{kept / total:10.1%} {ckept / max(ctotal, 1):9.1%} {leaked / max(ntotal, 1):10.1%} {empty:5d}")
    print("\nper corpus: paragraphs kept / navigation leaked")
    names = sorted({n for _, n in per_corpus})
    print(f"{'extractor':26} " + " ".join(f"{n:>15}" for n in names))
    for label in extractors():
        cells = []
        for n in names:
            k, t, leak, nt = per_corpus.get((label, n), [0, 0, 0, 0])
            cells.append(f"{k / max(t, 1):6.0%} / {leak / max(nt, 1):5.0%}")
        print(f"{label:26} " + " ".join(f"{c:>15}" for c in cells))


if __name__ == "__main__":
    main()
