"""Measures HTML-to-text extractors (speed, main text kept, navigation dropped) on documentation pages found offline on this machine, or with --big on 1-5 MB pages built from them (with the proxy's own paths and a selectolax one); run: python scripts/bench_extract.py [--per-corpus N | --big] in a venv with trafilatura, readability-lxml, html2text and markdownify (plus orjson and lxml for proxy.backends.pages.extract, and selectolax for --big).

How it judges a page: each corpus is a documentation generator whose markup names its main
content and its navigation (mdBook's <main> and sidebar, rustdoc, Node's API docs, npm's docs,
Sphinx, Texinfo). From that markup it takes the main content's paragraphs, list items and
code blocks, and the navigation's link texts that never occur in the main content. An
extractor keeps a paragraph (or code block) when its first 8 words appear, in order, in the
extractor's output; it leaks a navigation item when that item's words appear there. Speed is
wall time of one extraction, after one warm-up page, on one core.

--big: the pages the proxy's fast path exists for (over proxy.backends.pages.readable.FAST_PATH_CHARS). For each of
three corpora, one page's shell (head, navigation, footer) with the main content of the corpus's pages,
in file order, appended into its main element until the page reaches 1, 2 and 5 MB; judged by the
same rules, except that a navigation item is a run of 3 consecutive links. It times the proxy's
scoring path (proxy.backends.pages.readable.extract_page with the threshold raised), the
proxy's fast path (extract_page itself, on the whole text and with the max_chars the proxy passes),
trafilatura, and a selectolax (lexbor) pipeline written here; each time is the median of --runs
extractions, reported as seconds per MB (MiB) of HTML.
"""
from __future__ import annotations

import argparse
import glob
import importlib
import os
import re
import statistics
import sys
import time
from collections.abc import Callable

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
    text = re.sub(r"\]\[\d+\]", "]", text)  # nor the proxy's link references [text][n]
    text = re.sub(r"^\[\d+\]: \S+$", "", text, flags=re.M)  # nor its list of their URLs
    return re.findall(r"\w+", text.lower())


def contains(haystack: str, needle: list[str]) -> bool:
    return " " + " ".join(needle) + " " in haystack


def truth(doc, main_xp: str, nav_xp: str, nav_run: int = 1):
    """(paragraphs, code blocks, navigation items) as word lists; a navigation item is `nav_run` consecutive links
    of one navigation element (--big: a big page's main content holds most single link texts, not their runs)."""
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
        links = [words(a.text_content()) for a in n.iter("a")]
        for i in range(len(links) - nav_run + 1):
            w = sum(links[i:i + nav_run], [])
            if len(w) >= 2 and not contains(main_words, w):
                nav.add(tuple(w))
    return paras, code, [list(w) for w in nav]


def score(out: str, paras, code, nav) -> tuple[int, int, int]:
    """(paragraphs kept, code blocks kept, navigation items leaked) of one extraction."""
    hay = " " + " ".join(words(out)) + " "
    return (sum(contains(hay, p) for p in paras), sum(contains(hay, c) for c in code),
            sum(contains(hay, n) for n in nav))


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

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from proxy.backends.pages import readable as extract
    return {
        "proxy (proxy.backends.pages.readable)": lambda html: extract.extract_page(html, "https://docs.example/")[1],
        "trafilatura(txt)": lambda html: trafilatura.extract(html, output_format="txt", include_tables=True,
                                                             include_comments=False, favor_recall=True) or "",
        "trafilatura(md)": lambda html: trafilatura.extract(html, output_format="markdown", include_tables=True,
                                                            include_comments=False, include_formatting=True,
                                                            favor_recall=True) or "",
        "readability+html2text": lambda html: h2t(Document(html).summary(html_partial=True)),
        "readability+markdownify": lambda html: markdownify.markdownify(Document(html).summary(html_partial=True)),
        "html2text(whole page)": h2t,
    }


# --big: corpora big enough to fill 5 MB of main content without repeating a page, and the page sizes.
BIG_CORPORA = ("mdbook-ref", "nodejs", "rustdoc")
BIG_SIZES_MB = (1, 2, 5)
MB = 1024 * 1024  # as proxy.backends.pages.readable.FAST_PATH_CHARS counts
# The elements a page's text never comes from (the proxy's fast path drops the same list: proxy.backends.pages.readable.NOT_CONTENT).
LEXBOR_DROP = "script, style, nav, header, footer, aside, form, noscript, template, iframe, svg, button"
LEXBOR_BLOCKS = "p, li, dd, dt, pre, h1, h2, h3, h4, h5, h6, div, section, tr, table, blockquote"


def big_page(name: str, pattern: str, main_xp: str, size: int) -> str:
    """The first page of a corpus with the main content of its pages, in file order, in its main element, to `size` bytes."""
    files = sorted(f for f in glob.glob(pattern) if os.path.getsize(f) > 4000)
    doc = lxml.html.fromstring(open(files[0], "rb").read())
    main = doc.xpath(main_xp)[0]
    for child in list(main):
        main.remove(child)
    shell = len(lxml.html.tostring(doc))
    used = shell
    for path in files:
        mains = lxml.html.fromstring(open(path, "rb").read()).xpath(main_xp)
        for child in list(mains[0]) if mains else []:
            if used >= size:
                break
            used += len(lxml.html.tostring(child))
            main.append(child)
        if used >= size:
            break
    if used < size:
        raise SystemExit(f"{name}: its pages hold only {used} bytes of main content, not {size}")
    return "<!DOCTYPE html>\n" + lxml.html.tostring(doc, encoding="unicode")


def big_extractors() -> dict[str, Callable[[str], str]]:
    """The proxy's two paths (its own code), trafilatura, and selectolax's lexbor if installed."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from proxy.backends.pages import readable as extract
    from proxy.backends.pages.pagetext import CHARS_PER_TOKEN
    from proxy.core.config import Config
    served = Config.web_fetch_max_tokens * CHARS_PER_TOKEN

    def small_path(html: str) -> str:
        threshold, extract.FAST_PATH_CHARS = extract.FAST_PATH_CHARS, 1 << 62
        try:
            return extract.extract_page(html, "https://docs.example/")[1]
        finally:
            extract.FAST_PATH_CHARS = threshold

    def fast_path(html: str, max_chars: int | None = None) -> str:
        assert len(html) > extract.FAST_PATH_CHARS
        return extract.extract_page(html, "https://docs.example/", max_chars)[1]

    out: dict[str, Callable[[str], str]] = {
        "proxy scoring path (threshold raised)": small_path,
        "proxy fast path (whole text)": fast_path,
        f"proxy fast path as served (max_chars={served})": lambda html: fast_path(html, served),
    }
    import trafilatura
    out["trafilatura(md)"] = lambda html: trafilatura.extract(
        html, output_format="markdown", include_tables=True, include_comments=False, include_formatting=True,
        favor_recall=True) or ""
    try:
        lexbor = importlib.import_module("selectolax.lexbor")
    except ImportError:
        print("selectolax is not installed: no lexbor pipeline")
        return out

    def selectolax(html: str) -> str:
        tree = lexbor.LexborHTMLParser(html)
        for node in tree.css(LEXBOR_DROP):
            node.decompose()
        root = tree.css_first("main") or tree.css_first("article") or tree.body or tree.root
        for node in root.css(LEXBOR_BLOCKS):
            node.insert_after("\n")  # block ends are line ends; inline tags join their words
        return squeeze_blank_lines(root.text(separator=""))

    out["selectolax(lexbor) text"] = selectolax
    return out


def squeeze_blank_lines(text: str) -> str:
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


def main_big(runs: int) -> None:
    pages = []
    for name, pattern, main_xp, nav_xp in CORPORA:
        if name in BIG_CORPORA:
            for mb in BIG_SIZES_MB:
                html = big_page(name, pattern, main_xp, mb * MB)
                t = truth(lxml.html.fromstring(html), main_xp, nav_xp, nav_run=3)
                assert t is not None
                pages.append((name, mb, html, *t))
    print(f"{len(pages)} pages of {', '.join(f'{mb} MB' for mb in BIG_SIZES_MB)} from {', '.join(BIG_CORPORA)}; "
          f"{sum(len(p[3]) for p in pages)} paragraphs, {sum(len(p[4]) for p in pages)} code blocks, "
          f"{sum(len(p[5]) for p in pages)} navigation items; median of {runs} runs")
    fns = big_extractors()
    per_corpus: dict[tuple[str, str], list[int]] = {}
    print(f"{'extractor':48} {'s/MB':>6} {'s/MB 1,2,5':>16} {'paras kept':>10} {'code kept':>9} {'nav leaked':>10}")
    for label, fn in fns.items():
        fn(pages[0][2])  # warm-up
        secs: dict[int, float] = {}
        mbs: dict[int, float] = {}
        kept, total, ckept, ctotal, leaked, ntotal = 0, 0, 0, 0, 0, 0
        for name, mb, html, paras, code, nav in pages:
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                out = fn(html)
                times.append(time.perf_counter() - start)
            secs[mb] = secs.get(mb, 0.0) + statistics.median(times)
            mbs[mb] = mbs.get(mb, 0.0) + len(html.encode()) / MB
            k, c, leak = score(out, paras, code, nav)
            kept, total, ckept, ctotal = kept + k, total + len(paras), ckept + c, ctotal + len(code)
            leaked, ntotal = leaked + leak, ntotal + len(nav)
            acc = per_corpus.setdefault((label, name), [0, 0, 0, 0, 0, 0])
            for i, v in enumerate((k, len(paras), c, len(code), leak, len(nav))):
                acc[i] += v
        per_size = ",".join(f"{secs[mb] / mbs[mb]:.2f}" for mb in BIG_SIZES_MB)
        print(f"{label:48} {sum(secs.values()) / sum(mbs.values()):6.3f} {per_size:>16} {kept / total:10.1%} "
              f"{ckept / max(ctotal, 1):9.1%} {leaked / max(ntotal, 1):10.1%}", flush=True)
    print("\nper corpus: paragraphs kept / code blocks kept / navigation leaked")
    print(f"{'extractor':48} " + " ".join(f"{n:>20}" for n in BIG_CORPORA))
    for label in fns:
        cells = [f"{a[0] / max(a[1], 1):4.0%} /{a[2] / max(a[3], 1):4.0%} /{a[4] / max(a[5], 1):4.0%}"
                 for a in (per_corpus[label, n] for n in BIG_CORPORA)]
        print(f"{label:48} " + " ".join(f"{c:>20}" for c in cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-corpus", type=int, default=8, help="pages per corpus, spread evenly over its files")
    ap.add_argument("--big", action="store_true", help="1, 2 and 5 MB pages, the proxy's paths, seconds per MB")
    ap.add_argument("--runs", type=int, default=3, help="--big: extractions per page and extractor (the median counts)")
    args = ap.parse_args()
    if args.big:
        return main_big(args.runs)
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
            k, c, leak = score(out, paras, code, nav)
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
