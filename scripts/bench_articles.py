"""Scores HTML extractors on scrapinghub's article-extraction-benchmark (181 news and blog pages with human-written
article bodies) by the benchmark's own shingle F1, with median and p90 milliseconds a page, all engines side by side in
one run; run: python scripts/bench_articles.py DATA_DIR [--runs N] [--only a,b] in a venv with the proxy's requirements
plus trafilatura, html_text and selectolax (docs/performance.md gives the pins).

DATA_DIR holds the benchmark's `ground-truth.json` and `html/*.html.gz` (MIT licence, not committed here). Get them with
`git clone https://github.com/scrapinghub/article-extraction-benchmark` (the directory itself is then DATA_DIR).

Quality: `shingle_counts` and `f1` below are the benchmark's evaluate.py (`string_shingle_matching`, `_tokenize`,
`_ngrams`, `metrics_from_tp_fp_fns`) rewritten without its bootstrap: each page's 4-word shingles of `\\w+` tokens are
matched as multisets, tp/fp/fn normalised per page so long pages weigh no more, precision and recall averaged over
pages, F1 from the two averages. "links as text" reads Markdown as its words: link targets, the proxy's `[n]` markers
and its list of link URLs are removed first (a URL's words are not the article's); "as written" scores the output as
it is, URLs included.

Speed: wall time of one extraction in this process, after one warm-up round; the engines take turns page by page (the
order rotating) so a noisy machine's drift falls on all of them alike.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKEN = re.compile(r"\w+", re.UNICODE | re.MULTILINE | re.IGNORECASE | re.DOTALL)


def shingle_counts(text: str, n: int = 4) -> Counter:
    """evaluate.py's _all_shingles: 4-grams of \\w+ tokens; a text shorter than n is one shorter shingle."""
    tokens = TOKEN.findall(text or "")
    return Counter(tuple(tokens[i:i + n]) for i in range(max(1, len(tokens) - n + 1)) if tokens[i:i + n])


def tp_fp_fn(true: str, pred: str) -> tuple[float, float, float]:
    """evaluate.py's string_shingle_matching, normalised to sum 1 per page."""
    t, p = shingle_counts(true), shingle_counts(pred)
    tp = fp = fn = 0.0
    for key in set(t) | set(p):
        tc, pc = t.get(key, 0), p.get(key, 0)
        tp += min(tc, pc)
        fp += max(0, pc - tc)
        fn += max(0, tc - pc)
    s = tp + fp + fn
    return (tp / s, fp / s, fn / s) if s > 0 else (tp, fp, fn)


def _precision(tp: float, fp: float, fn: float) -> float:
    if fp == fn == 0:
        return 1.0
    return 0.0 if tp == fp == 0 else tp / (tp + fp)


def _recall(tp: float, fp: float, fn: float) -> float:
    if fp == fn == 0:
        return 1.0
    return 0.0 if tp == fn == 0 else tp / (tp + fn)


def f1(counts: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """evaluate.py's metrics_from_tp_fp_fns: (F1, precision, recall) over pages."""
    p = statistics.mean(_precision(*c) for c in counts if c[0] + c[1] > 0)
    r = statistics.mean(_recall(*c) for c in counts if c[0] + c[2] > 0)
    return (2 * p * r / (p + r) if p + r else 0.0), p, r


LINK_TARGET = re.compile(r"\]\((?:[^()\s]|\([^()\s]*\))*(?:\s+\"[^\"]*\")?\)")  # [text](url "title") -> [text]
REF_MARK = re.compile(r"\]\[\d+\]")  # [text][3] -> [text]
REF_LIST = re.compile(r"^\[\d+\]: \S+.*$", re.M)  # the proxy's link list at the end


def links_as_text(markdown: str) -> str:
    return REF_LIST.sub("", REF_MARK.sub("]", LINK_TARGET.sub("]", markdown)))


# -- the engines ----------------------------------------------------------------------------------

def proxy_before() -> Callable[[str, str], str]:
    """The proxy before issue 34 (its proxy/extract.py at that time, here so it stays comparable): readability-lxml
    picks the content, markdownify writes it, and pages over 512 KiB of raw HTML take the fast rule instead."""
    import lxml.html
    import markdownify
    from readability import Document

    def run(html: str, url: str) -> str:
        if len(html) > 512 * 1024:
            root = lxml.html.fromstring(html)
            for el in root.xpath("//script|//style|//nav|//header|//footer|//aside|//form|//noscript|//template"
                                 "|//iframe|//svg|//button|//comment()|//processing-instruction()"):
                el.drop_tree()
            content = (root.xpath("//main|//article") or root.xpath("//body") or [root])[0]
        else:
            content = lxml.html.fromstring(Document(html, url=url).summary(html_partial=True))
        partial = lxml.html.tostring(content, encoding="unicode")
        return markdownify.markdownify(partial, heading_style="ATX", bullets="-", strip=["img"])
    return run


def engines() -> dict[str, Callable[[str, str], str]]:
    import logging
    logging.disable(logging.CRITICAL)  # readability logs every page
    from proxy.backends import readable as extract
    out: dict[str, Callable[[str, str], str]] = {
        "proxy before (readability+markdownify)": proxy_before(),
        "proxy now (proxy.backends.readable)": lambda html, url: extract.extract_page(html, url)[1],
        "proxy now, links inline": lambda html, url: extract.extract_page(html, url, links="inline")[1],
    }
    try:
        import trafilatura
        out["trafilatura (default, txt)"] = lambda html, url: trafilatura.extract(html, url=url) or ""
        out["trafilatura (favor_precision, txt)"] = (
            lambda html, url: trafilatura.extract(html, url=url, favor_precision=True) or "")
        out["trafilatura (precision, md+links)"] = lambda html, url: trafilatura.extract(
            html, url=url, favor_precision=True, output_format="markdown", include_links=True,
            include_formatting=True) or ""
    except ImportError:
        print("trafilatura is not installed: left out")
    try:
        import html_text
        from readability import Document
        out["readability-lxml + html_text"] = (
            lambda html, url: html_text.extract_text(Document(html, url=url).summary(html_partial=True)))
    except ImportError:
        print("html_text is not installed: left out")
    try:
        from selectolax.lexbor import LexborHTMLParser

        def lexbor(html: str, url: str) -> str:
            tree = LexborHTMLParser(html)
            for node in tree.css("script, style, nav, header, footer, aside, form, noscript, template, iframe, svg, "
                                 "button"):
                node.decompose()
            root = tree.css_first("article") or tree.css_first("main") or tree.body or tree.root
            for node in root.css("p, li, pre, h1, h2, h3, h4, h5, h6, div, tr, blockquote"):
                node.insert_after("\n")
            return root.text(separator="")
        out["selectolax lexbor (article/main rule)"] = lexbor
    except ImportError:
        print("selectolax is not installed: left out")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="the benchmark's directory (ground-truth.json and html/)")
    ap.add_argument("--runs", type=int, default=1, help="timed extractions of each page by each engine (median kept)")
    ap.add_argument("--only", default="", help="comma-separated words: engines whose names hold one of them")
    ap.add_argument("--worst", type=int, default=0, help="also list the N pages where the proxy scores worst")
    args = ap.parse_args()
    truth = json.loads((args.data / "ground-truth.json").read_text("utf-8"))
    pages = []
    for key, item in sorted(truth.items()):
        raw = gzip.decompress((args.data / "html" / f"{key}.html.gz").read_bytes())
        # The benchmark's pages are UTF-8 (its own extractors read them so); bad bytes replaced, as the proxy does.
        pages.append((key, item.get("url") or "", raw.decode("utf-8", "replace"), item.get("articleBody") or ""))
    fns = engines()
    if args.only:
        words = args.only.split(",")
        fns = {k: v for k, v in fns.items() if any(w in k for w in words)}
    names = list(fns)
    for name in names:  # warm-up: imports, compiled selectors
        fns[name](pages[0][2], pages[0][1])
    times: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[str]] = {n: [] for n in names}
    for i, (_key, url, html, _body) in enumerate(pages):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            best, out = float("inf"), ""
            for _ in range(args.runs):
                start = time.perf_counter()
                out = fns[name](html, url)
                best = min(best, time.perf_counter() - start)
            times[name].append(best * 1000)
            outputs[name].append(out)
    kib = statistics.median(len(p[2].encode()) for p in pages) / 1024
    print(f"{len(pages)} pages (median {kib:.0f} KiB of HTML); Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs; ms: {'min of ' + str(args.runs) + ' runs' if args.runs > 1 else 'one run'} a page")
    print(f"{'engine':40} {'F1 links-as-text':>16} {'(P / R)':>13} {'F1 as written':>13} {'median ms':>9} "
          f"{'p90 ms':>7} {'chars':>9}")
    for name in names:
        plain = f1([tp_fp_fn(p[3], links_as_text(o)) for p, o in zip(pages, outputs[name], strict=True)])
        written = f1([tp_fp_fn(p[3], o) for p, o in zip(pages, outputs[name], strict=True)])
        ts = sorted(times[name])
        print(f"{name:40} {plain[0]:16.3f} {plain[1]:6.3f}/{plain[2]:.3f} {written[0]:13.3f} "
              f"{statistics.median(ts):9.1f} {ts[int(len(ts) * 0.9)]:7.1f} {sum(map(len, outputs[name])):9,d}")
    if args.worst:
        name = next(n for n in names if n.startswith("proxy now"))
        scored = sorted((f1([tp_fp_fn(p[3], links_as_text(o))])[0], p[0][:10], p[1], len(p[2]) // 1024)
                        for p, o in zip(pages, outputs[name], strict=True))
        for row in scored[:args.worst]:
            print("  %.3f %s %4d KiB %s" % (row[0], row[1], row[3], row[2]))


if __name__ == "__main__":
    main()
