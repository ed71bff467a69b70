"""Scores HTML extractors on several public benchmarks, each by its own scoring code, with F1, empty outputs and time
a page (median, p95), all engines side by side in one run, the tuning set and the held-out sets labelled.
Run: python scripts/bench_articles.py DATA_DIR [--sets a,b] [--every N] [--only a,b] [--against DIR] [--per-type]
[--worst N]
in a venv with the proxy's requirements (trafilatura among them) plus readability-lxml and html_text
(docs/performance.md gives the pins). Nothing here is committed data: DATA_DIR is a checkout made by hand:

  DATA_DIR/wcxb         git clone https://github.com/Murrough-Foley/web-content-extraction-benchmark (CC-BY-4.0)
  DATA_DIR/scrapinghub  git clone https://github.com/scrapinghub/article-extraction-benchmark (MIT)
  DATA_DIR/trafilatura  git clone https://github.com/adbar/trafilatura (Apache-2.0; tests/evaldata.json, tests/cache,
                        tests/eval are used)

The sets and their scoring:
- wcxb-dev (TUNING: the proxy's rules were tuned on it) and wcxb-test (HELD OUT): WCXB's evaluate.py `word_f1`,
  token counts of `\\w+` in lower case, precision and recall per page, F1 per page, averaged over pages (a page with
  empty ground truth scores 1 only when the output is empty too). The 139 dev pages whose HTML is byte for byte a
  test page are left out of dev.
- trafilatura-tune (TUNING) and trafilatura-test (HELD OUT): trafilatura's evaluation set (990 pages, news, blogs,
  government and company pages in many languages; its own set, so it favours trafilatura) halved by the last byte of
  the SHA-1 of each file name (500 / 490 pages): the first half may be looked at page by page, the second is not. Its
  tests/eval_common.py `count_item`, whitespace-normalised substring matching of the `with` and `without` snippets,
  tp/fp/fn pooled over all pages, F1 = 2tp / (2tp + fp + fn).
- scrapinghub (HELD OUT now; the first own picker was tuned on it): its evaluate.py shingle F1,
  4-word shingles of `\\w+` tokens matched as multisets, tp/fp/fn normalised per page, precision and recall averaged
  over pages, F1 from the two averages.

Every engine reads the same str: the page's bytes decoded as the proxy decodes a download without a charset header
(proxy/backends/pages/pagetext.py decode_text: a byte-order mark, then <meta charset>, then UTF-8). "links as text" reads
the proxy's Markdown as plain text, as the other engines write it (links_as_text: link targets, `[n]` marks and the
list of link URLs gone, labels without brackets, no heading, bullet, quote or table marks). An empty output is one with
no `\\w` word. The proxy's time includes its hidden-element pass (proxy/backends/pages/invisible.py's drop_hidden, run by
extract_page). `--against DIR` adds the proxy of another checkout, run in a child process beside this one. Time is the CPU time of one extraction in this process (time.process_time: on a shared
machine wall time measures the neighbours), after a warm-up page, the engines taking turns page by page (the order
rotating) so what drift remains falls on all of them alike.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOKEN = re.compile(r"\w+", re.UNICODE | re.MULTILINE | re.IGNORECASE | re.DOTALL)
WORD = re.compile(r"\w")


@dataclass
class Page:
    key: str
    url: str
    html: str
    truth: object  # the set's own ground truth: a body text, or a {"with": [...], "without": [...]} item
    kind: str = ""  # WCXB's page type


@dataclass
class Bench:
    name: str
    role: str  # "tuning" or "held out"
    score: Callable[[list[Page], list[str]], float]
    pages: list[Page] = field(default_factory=list)


# -- scrapinghub's evaluate.py ---------------------------------------------------------------------

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


def scrapinghub_score(pages: list[Page], outputs: list[str]) -> float:
    return f1([tp_fp_fn(str(p.truth), o) for p, o in zip(pages, outputs, strict=True)])[0]


# -- WCXB's evaluate.py ----------------------------------------------------------------------------

def word_f1(predicted: str, reference: str) -> float:
    """evaluate.py's word_f1 (its F1 only)."""
    pred, ref = re.findall(r"\w+", predicted.lower()), re.findall(r"\w+", reference.lower())
    if not ref:
        return 1.0 if not pred else 0.0
    if not pred:
        return 0.0
    overlap = sum((Counter(pred) & Counter(ref)).values())
    precision, recall = overlap / len(pred), overlap / len(ref)
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def wcxb_score(pages: list[Page], outputs: list[str]) -> float:
    return statistics.mean(word_f1(o, str(p.truth)) for p, o in zip(pages, outputs, strict=True))


# -- trafilatura's tests/eval_common.py ------------------------------------------------------------

def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def snippet_counts(item: dict, result: str) -> tuple[int, int, int]:
    """count_item: (tp, fp, fn) by whitespace-normalised substring matching."""
    res = _norm(result)
    tp = sum(1 for w in item["with"] if _norm(w) in res)
    fp = sum(1 for w in item["without"] if _norm(w) in res)
    return tp, fp, len(item["with"]) - tp


def snippet_score(pages: list[Page], outputs: list[str]) -> float:
    tp = fp = fn = 0
    for p, o in zip(pages, outputs, strict=True):
        a, b, c = snippet_counts(p.truth, o)  # type: ignore[arg-type]
        tp, fp, fn = tp + a, fp + b, fn + c
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


# -- loading ---------------------------------------------------------------------------------------

def _decode(raw: bytes) -> str:
    from proxy.backends.pages.pagetext import decode_text
    return decode_text(raw, None, html=True)


def _wcxb_split(root: Path, split: str) -> list[Page]:
    pages = []
    for gt in sorted((root / split / "ground-truth").glob("*.json")):
        data = json.loads(gt.read_text("utf-8"))
        truth = data.get("ground_truth")
        if not isinstance(truth, dict):
            continue  # as evaluate.py's load_ground_truth
        kind = ((data.get("_internal") or {}).get("page_type") or {})
        kind = kind.get("primary", "article") if isinstance(kind, dict) else str(kind or "article")
        raw = gzip.decompress((root / split / "html" / f"{gt.stem}.html.gz").read_bytes())
        pages.append(Page(gt.stem, data.get("url") or "", raw, truth.get("main_content") or "",  # type: ignore[arg-type]
                          "collection" if kind == "category" else kind))
    return pages


def load_wcxb(root: Path) -> tuple[Bench, Bench]:
    test = _wcxb_split(root, "test")
    seen = {hashlib.sha1(p.html).hexdigest() for p in test}  # type: ignore[arg-type]
    dev = [p for p in _wcxb_split(root, "dev") if hashlib.sha1(p.html).hexdigest() not in seen]  # type: ignore[arg-type]
    for p in dev + test:
        p.html = _decode(p.html)  # type: ignore[arg-type]
    return (Bench("wcxb-dev", "tuning", wcxb_score, dev), Bench("wcxb-test", "held out", wcxb_score, test))


def load_trafilatura(root: Path) -> tuple[Bench, Bench]:
    data = json.loads((root / "tests" / "evaldata.json").read_text("utf-8"))
    pages = []
    for url, item in sorted(data.items()):
        path = next((p for p in (root / "tests" / "cache" / item["file"], root / "tests" / "eval" / item["file"])
                     if p.is_file()), None)
        if path is None:
            sys.exit(f"bench_articles: {item['file']} of trafilatura's evaldata.json is missing under {root}/tests")
        pages.append(Page(item["file"], url, _decode(path.read_bytes()), item))
    # Halves by a hash of the file name: one to look at pages and tune on, one nobody looks at.
    tune = [p for p in pages if hashlib.sha1(p.key.encode()).digest()[-1] % 2 == 0]
    test = [p for p in pages if hashlib.sha1(p.key.encode()).digest()[-1] % 2 == 1]
    return (Bench("trafilatura-tune", "tuning", snippet_score, tune),
            Bench("trafilatura-test", "held out", snippet_score, test))


def load_scrapinghub(root: Path) -> Bench:
    truth = json.loads((root / "ground-truth.json").read_text("utf-8"))
    pages = [Page(key, item.get("url") or "", _decode(gzip.decompress((root / "html" / f"{key}.html.gz").read_bytes())),
                  item.get("articleBody") or "") for key, item in sorted(truth.items())]
    return Bench("scrapinghub", "held out", scrapinghub_score, pages)


def load(data: Path, names: list[str]) -> list[Bench]:
    out: list[Bench] = []
    for name in names:
        if name not in SETS:
            sys.exit(f"bench_articles: no set {name!r}; sets: {', '.join(SETS)}")
    if {"wcxb-dev", "wcxb-test"} & set(names):
        dev, test = load_wcxb(data / "wcxb")
        out += [b for b in (dev, test) if b.name in names]
    if {"trafilatura-tune", "trafilatura-test"} & set(names):
        out += [b for b in load_trafilatura(data / "trafilatura") if b.name in names]
    if "scrapinghub" in names:
        out.append(load_scrapinghub(data / "scrapinghub"))
    return out


SETS = ("wcxb-dev", "wcxb-test", "trafilatura-tune", "trafilatura-test", "scrapinghub")

# -- the engines -----------------------------------------------------------------------------------

# The proxy writes Markdown; the sets score plain text (trafilatura's own output is plain text). Its text is read as a
# reader sees the rendered page: a link as its words, without the Markdown marks around them. WCXB's and ScrapingHub's
# \w+ tokens never see a mark, but trafilatura's set matches snippets as substrings, where "[Nicole Hacohen]" or a
# "- " between two list items would count as a miss.
LINK_TARGET = re.compile(r"\]\((?:[^()\s]|\([^()\s]*\))*(?:\s+\"[^\"]*\")?\)")  # [text](url "title") -> [text]
REF_MARK = re.compile(r"\]\[\d+\]")  # [text][3] -> [text]
REF_LIST = re.compile(r"^\[\d+\]: \S+.*$", re.M)  # the proxy's link list at the end
LINK_LABEL = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\x00")  # [text] -> text (a label may hold [1])
# Headings, quotes, definitions, bullets; an ordered list's numbers stay: a browser shows them, and so does trafilatura.
LINE_MARKS = re.compile(r"^(?:#{1,6} |> |: |[-*] )+", re.M)
TABLE_ROW = re.compile(r"^\| (.*) \|$", re.M)
TABLE_RULE = re.compile(r"^\|?(?:\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*$|^(?:```\S*|---)$", re.M)  # |---|---|, fences, rules


def links_as_text(markdown: str) -> str:
    """The proxy's Markdown read as plain text: link targets, [n] marks and the link list gone, labels without their
    brackets, no heading, quote, bullet or table marks, no code ticks."""
    text = REF_LIST.sub("", REF_MARK.sub("]\x00", LINK_TARGET.sub("]\x00", markdown)))
    text = LINE_MARKS.sub("", TABLE_RULE.sub("", LINK_LABEL.sub(r"\1", text)))
    text = TABLE_ROW.sub(lambda m: m.group(1).replace(" | ", " "), text)  # a literal "|" in a sentence stays
    return text.replace("\x00", "").replace("`", "")


NO_TEXT_PREFIX = "(The page has no readable text:"


def engines() -> dict[str, Callable[[str, str], str]]:
    import logging
    logging.disable(logging.CRITICAL)  # readability logs every page
    from proxy.backends.pages import readable

    def proxy(html: str, url: str) -> str:
        text = readable.extract_page(html, url).text
        return "" if text.startswith(NO_TEXT_PREFIX) else links_as_text(text)  # the note saying why is no text

    def patched(name: str, value: object) -> Callable[[str, str], str]:
        """The proxy with one of readable's names replaced, for what that part is worth."""
        def run(html: str, url: str) -> str:
            kept = getattr(readable, name)
            setattr(readable, name, value)
            try:
                return proxy(html, url)
            finally:
                setattr(readable, name, kept)
        return run

    def trafilatura_written(html: str, url: str) -> str:
        from proxy.backends.pages.markdown import MarkdownWriter
        content = readable.second_opinion(readable._visible_root(html), url)
        return links_as_text(MarkdownWriter(url).write(content)) if content is not None else ""

    out: dict[str, Callable[[str, str], str]] = {
        "proxy (links as text)": proxy,
        "proxy, its rules only": patched("SECOND_OPINION_SHARE", 0.0),
        # What the hidden-element defence costs: WCXB counts text in hidden tabs, accordions and fade-in wrappers
        # (opacity:0 until a script runs) as content. extract_page still drops hidden= and display:none itself.
        "proxy without invisible.py's pass": patched("drop_hidden", lambda root: 0),
        "trafilatura's pick, proxy's writer": trafilatura_written,
    }
    try:
        import trafilatura
        out["trafilatura 2.3.1 (default, txt)"] = lambda html, url: trafilatura.extract(html, url=url) or ""
    except ImportError:
        print("trafilatura is not installed: left out")
    try:
        import html_text
        from readability import Document
        out["readability-lxml + html_text"] = (
            lambda html, url: html_text.extract_text(Document(html, url=url).summary(html_partial=True)))
    except ImportError:
        print("readability-lxml or html_text is not installed: left out")
    return out


# The engine of another checkout (--against DIR), in a child of its own: two revisions of the `proxy` package cannot
# share one interpreter. The child times each extraction itself, so the pipe's cost is not counted.
AGAINST_CHILD = r"""
import json, logging, sys, time
sys.path.insert(0, sys.argv[1])
logging.disable(logging.CRITICAL)
try:
    from proxy.backends.pages import readable
except ImportError:  # a checkout from before backends/ was split into rooms
    from proxy.backends import readable
try:  # before the hidden-element pass moved into extract_page
    from proxy.backends.invisible import visible_html
except ImportError:
    visible_html = None
for line in sys.stdin:
    job = json.loads(line)
    start = time.process_time()
    html = visible_html(job["html"])[0] if visible_html else job["html"]
    text = readable.extract_page(html, job["url"])[1]
    print(json.dumps({"text": text, "ms": (time.process_time() - start) * 1000}), flush=True)
"""


class Against:
    """The proxy's extraction at another checkout, called like an engine; `ms` is the child's CPU time of the last
    page."""

    def __init__(self, checkout: Path):
        import subprocess
        if not any((checkout / "proxy" / "backends" / room / "readable.py").is_file() for room in ("pages", "")):
            sys.exit(f"bench_articles: {checkout} is not a checkout of this repository (no proxy/backends/pages/readable.py)")
        self.proc = subprocess.Popen([sys.executable, "-c", AGAINST_CHILD, str(checkout)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, encoding="utf-8")
        self.ms = 0.0

    def __call__(self, html: str, url: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"html": html, "url": url}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"bench_articles: the --against child ended (exit status {self.proc.wait()})")
        answer = json.loads(line)
        self.ms = answer["ms"]
        text = answer["text"]
        return "" if text.startswith(NO_TEXT_PREFIX) else links_as_text(text)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def run(bench: Bench, fns: dict[str, Callable[[str, str], str]]) -> tuple[dict, dict]:
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[str]] = {n: [] for n in names}
    for i, page in enumerate(bench.pages):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            fn = fns[name]
            start = time.process_time()
            try:
                out = fn(str(page.html), page.url)
            except Exception as e:  # a crash is an empty answer, as trafilatura's evaluate.py counts it
                print(f"  {name} failed on {page.key}: {type(e).__name__}: {e}")
                out = ""
            times[name].append(fn.ms if isinstance(fn, Against) else (time.process_time() - start) * 1000)
            outputs[name].append(out)
    return times, outputs


def report(bench: Bench, times: dict, outputs: dict, per_type: bool, worst: int) -> None:
    print(f"\n{bench.name} ({bench.role.upper()}, {len(bench.pages)} pages)")
    print(f"  {'engine':36} {'F1':>6} {'empty':>6} {'median ms':>9} {'p95 ms':>7}")
    for name, outs in outputs.items():
        ts = sorted(times[name])
        empty = sum(1 for o in outs if not WORD.search(o))
        print(f"  {name:36} {bench.score(bench.pages, outs):6.3f} {empty:6d} {statistics.median(ts):9.1f} "
              f"{ts[min(len(ts) - 1, int(len(ts) * 0.95))]:7.1f}")
    if per_type and any(p.kind for p in bench.pages):
        for kind in sorted({p.kind for p in bench.pages}):
            idx = [i for i, p in enumerate(bench.pages) if p.kind == kind]
            row = "  ".join(f"{bench.score([bench.pages[i] for i in idx], [outs[i] for i in idx]):.3f}"
                            for outs in outputs.values())
            print(f"    {kind:14} {len(idx):4d} pages  {row}")
    if worst:
        first = next(iter(outputs))
        scored = sorted((bench.score([p], [o]), p.key, p.url, len(o)) for p, o in zip(bench.pages, outputs[first], strict=True))
        for score, key, url, chars in scored[:worst]:
            print(f"    {score:.3f} {key[:14]:14} {chars:6d} chars {url}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="the directory holding the checkouts (wcxb, trafilatura, scrapinghub)")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated sets ({', '.join(SETS)})")
    ap.add_argument("--every", type=int, default=1, help="every Nth page of each set only (a quick look)")
    ap.add_argument("--only", default="", help="comma-separated words: engines whose names hold one of them")
    ap.add_argument("--per-type", action="store_true", help="WCXB's page types, one F1 column per engine")
    ap.add_argument("--against", type=Path, help="a checkout of another revision (git worktree add DIR REV): its "
                    "proxy runs beside this one, page by page, for its F1 and time in the same run")
    ap.add_argument("--worst", type=int, default=0, help="also list the N pages where the first engine scores worst")
    args = ap.parse_args()
    if not args.data.is_dir():
        sys.exit(f"bench_articles: {args.data} is not a directory")
    benches = load(args.data, [s for s in args.sets.split(",") if s])
    fns = engines()
    if args.only:
        fns = {k: v for k, v in fns.items() if any(w in k for w in args.only.split(","))}
    if args.against:
        fns[f"proxy at {args.against.name} (links as text)"] = Against(args.against.resolve())
    if not fns:
        sys.exit("bench_articles: --only left no engine")
    for fn in fns.values():  # warm-up: imports, compiled selectors
        fn(str(benches[0].pages[0].html), benches[0].pages[0].url)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; CPU ms of one extraction a page, in this process")
    for bench in benches:
        bench.pages = bench.pages[::max(1, args.every)]
        times, outputs = run(bench, fns)
        report(bench, times, outputs, args.per_type, args.worst)
    for fn in fns.values():
        if isinstance(fn, Against):
            fn.close()


if __name__ == "__main__":
    main()
