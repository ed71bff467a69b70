"""URL provenance for web_fetch and Codex's `open` (issues 33 and 39): gathering URLs from text and JSON values, the
per-request Ledger of the URLs a fetch may read (each with its origin, link depth and root), and the check that
refuses any other URL before a name is looked up. Pure but for the per-client memory it is handed
(proxy/tools/client_reads.py). Tested by tests/test_provenance.py (`tests/run.sh tests/test_provenance.py`).

The rule is Anthropic's for its own web_fetch ("To minimize exfiltration risks"): the model may read a URL the user
gave, or one a tool result or a search result held, never one it built, since a built URL (or host name, or query)
is a message to whoever runs that server or its DNS. Links of pages read are allowed too, but only a short chain
of them and only a few per given URL (counted per client over an hour, since agents make many requests): a page
that links /h/a ... /h/z would otherwise let the model spell a secret by the links it follows (docs/web-tools.md, Security, has
the bound in bits).

Provenance is by author, not by presence (issue 39): what the model wrote anywhere in the visible conversation (its
text, reasoning, tool-call arguments JSON-decoded, search queries, a compaction summary) marks those URLs and their
sites, and text a client generated (tool output, system-reminder blocks, tool output sent back as user text, the
system prompt) gives no URL on a marked site: a client tool that echoes, reshapes or re-cases what the model wrote
cannot make it given. Only a person's own words give a URL whoever wrote it first.
"""
from __future__ import annotations

import json
import re
import string
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

from proxy.backends.pages.netguard import parse_url
from proxy.tools.client_reads import DOWN, ROOT, ClientReads, Reads

# Who put a URL in the conversation. "user" is a person's own words and always gives; "system" and "tool" are what
# a client generated, and give what the model did not write; "search" is what the proxy's tools found or read. MODEL
# gives nothing: it marks what the model wrote. READ is a page an earlier request read (a fetch result, a completed
# open_page, a citation): given, but at the depth it was read at.
GIVEN_ORIGINS = ("user", "system", "tool", "search")
CLIENT_ORIGINS = ("system", "tool")
MODEL = "model"
READ = "read"
LINK = "link"
# A page an earlier fetch result holds, its value (url, text): its links are learnt as a page read's (budgeted), after
# the rest of the conversation, and never remembered (the history resends it).
PAGE = "page"

# Refusal reasons, also the metric's labels (proxy/observe/metrics.py).
NOT_GIVEN = "not_given"
LINK_DEPTH = "link_depth"
LINK_BUDGET = "link_budget"
REASONS = (NOT_GIVEN, LINK_DEPTH, LINK_BUDGET)

KEY_CHARS = 2048  # longer URLs still get a key (the fetcher refuses past its own limit, with its own sentence)

_SCHEMED = re.compile(r"""https?://[^\s<>"'`\\^{|}]+""", re.IGNORECASE)
# A host name with a dot and a letter-only top-level label, maybe a port and a path: "docs.python.org/3/".
_BARE = re.compile(r"""(?<![\w@/.:-])((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,24}(?::\d{1,5})?"""
                   r"""(?:/[^\s<>"'`\\^{|}]*)?)(?![\w@-])""", re.IGNORECASE)
# A Markdown link's or image's target: ](target) or ](<target>), with or without a "title".
_MD_TARGET = re.compile(r"""\]\(\s*<?([^\s()<>]*(?:\([^\s()<>]*\)[^\s()<>]*)*)>?(?:\s+["'][^"']*["'])?\s*\)""")
# A reference-style link's definition, one a line: "[3]: https://example.org/page" (the extraction's own form).
_MD_REFERENCE = re.compile(r"""^[ \t]*\[[^\]\n]+\]:[ \t]*<?([^\s<>]+)>?""", re.MULTILINE)
_TRAILING = ".,;:!?'\")]}*_"


def _variants(url: str) -> list[str]:
    """The URL and the shorter readings of its end, since prose puts punctuation after a URL ("see https://x/a.")
    and a model copying it may or may not take that along. Every variant is text that was written, none is made."""
    out = [url]
    while url and url[-1] in _TRAILING:
        url = url[:-1]
        out.append(url)
    return out


def urls_in_text(text: str, bare: bool = False) -> list[str]:
    """Every http(s) URL written in `text` (with its readings without trailing punctuation); with `bare`, host names
    written without a scheme ("docs.python.org/3/") too, as https:// and http://. Pure."""
    if not isinstance(text, str) or ("." not in text):
        return []
    text = text.replace("\\_", "_").replace("\\*", "*")  # Markdown escapes inside a written URL
    found: list[str] = []
    for m in _SCHEMED.finditer(text):
        found.extend(_variants(m.group(0)))
    if bare:
        for m in _BARE.finditer(text):
            for v in _variants(m.group(1)):
                found.extend(("https://" + v, "http://" + v))
    return found


def urls_in_value(value, bare: bool = False, _depth: int = 0) -> list[str]:
    """urls_in_text over every string in a JSON value (a tool result's object, a message's content parts). Pure."""
    if isinstance(value, str):
        return urls_in_text(value, bare)
    if _depth > 64:  # a client's JSON nested deeper than anything real; what is below it counts for nothing
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [u for v in value for u in urls_in_value(v, bare, _depth + 1)]
    return []


def links_in_page(text: str, base: str) -> list[str]:
    """The links a page's text shows the model: Markdown link targets, inline or as reference definitions (relative
    ones resolved against the page's URL, as a browser would), and URLs written out. Pure."""
    if not isinstance(text, str):
        return []
    text = text.replace("\\_", "_").replace("\\*", "*")
    found = urls_in_text(text)
    for m in [*_MD_TARGET.finditer(text), *_MD_REFERENCE.finditer(text)]:
        target = m.group(1)
        if not target or target.startswith("#"):
            continue
        try:
            found.extend(_variants(urllib.parse.urljoin(base, target)))
        except ValueError:
            continue
    return found


# What a URL may hold unescaped; anything else (a page's raw "ß", a space a model escaped) is compared %-escaped.
_URL_SAFE = "!#$%&'()*+,-./:;=?@[]~_" + string.ascii_letters + string.digits


def key(url) -> str | None:
    """The URL as the fetcher will fetch it (netguard.parse_url's normal form: scheme and host lower-case, default
    port dropped, dot segments resolved, no fragment; the query exactly as written), with characters a URL cannot
    carry raw %-escaped as they go on the wire, or None when it is not a URL. Two URLs are the same only when their
    keys are."""
    target, _ = parse_url(url, max_chars=KEY_CHARS)
    return urllib.parse.quote(target.url, safe=_URL_SAFE) if target is not None else None


def site(url_key: str) -> str:
    """The registrable part of a key's host, roughly (the last two labels, three under a two-letter country code's
    short second level, such as co.uk); an IP address is its own. What the link budget is counted per."""
    host = urllib.parse.urlsplit(url_key).hostname or ""
    labels = host.split(".")
    if host.replace(".", "").isdigit() or ":" in host or len(labels) <= 2:
        return host
    keep = 3 if len(labels[-1]) == 2 and len(labels[-2]) <= 3 else 2
    return ".".join(labels[-keep:])


# -- what the model wrote, as a client tool may give it back ------------------------------------------------------

_UNICODE_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")
_RESHAPING = re.compile(r"""['"`\\]""")  # what a shell's quoting or a JSON encoder adds or takes away


def _strings(value, depth: int = 0) -> list[str]:
    """Every string in a JSON value, and the strings of the JSON a string holds (a tool call's `arguments`),
    decoded, so `http:\\/\\/` and `\\u0026` are read as the client tool will read them."""
    if depth > 64:
        return []
    if isinstance(value, str):
        out = [value]
        text = value.strip()
        if len(text) > 1 and text[0] in "{[\"":
            try:
                inner = json.loads(text)
            except (ValueError, RecursionError):
                inner = None
            if isinstance(inner, (dict, list, str)):
                out.extend(_strings(inner, depth + 1))
        return out
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [s for v in value for s in _strings(v, depth + 1)]
    return []


def written_keys(value) -> set[str]:
    """The keys of every URL and host name the model wrote in `value`: read as written, and read as a shell or a
    JSON decoder would echo it (\\uXXXX decoded; quotes, backticks and backslashes taken out, so `sk-ab''cd` and
    `http:\\/\\/` are the URL they print). Pure."""
    found: set[str] = set()
    for text in _strings(value):
        plain = _RESHAPING.sub("", _UNICODE_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text))
        for form in {text, plain}:
            found.update(k for k in map(key, urls_in_text(form, bare=True)) if k)
    return found


# -- search results that echo the query ---------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")
_VOWELS = frozenset("aeiouy")


def _distinctive(word: str) -> bool:
    """A query word of 8 or more no dictionary has: digits among letters (a key, a hex string), a run of five
    consonants, or almost no vowels (random letters). Shorter ones are model names and versions as often as not
    (qwen3, gpt4o). A heuristic: docs/web-tools.md, Security, says what it misses."""
    if len(word) < 8 or word.isdigit():
        return False
    if not word.isalpha():
        return True
    vowels = sum(c in _VOWELS for c in word)
    return vowels / len(word) < 0.2 or re.search(r"[^aeiouy]{5}", word) is not None


def echoes_query(url: str, query) -> bool:
    """True when a search result's URL carries the query's own text, which is the model's: the whole query (8
    characters or more) in its host or query string (a site's own /search?q= page, a host name built from it), or
    in its path when the query is one string without spaces (a key, not words a slug would hold), or a distinctive
    word of it anywhere. Pure."""
    if not isinstance(query, str) or not isinstance(url, str):
        return False
    words = _WORD.findall(query.casefold())
    parts = urllib.parse.urlsplit(urllib.parse.unquote_plus(url).casefold())
    flat = "".join(_WORD.findall(f"{parts.netloc} {parts.path} {parts.query}"))
    whole = "".join(words)
    if len(whole) >= 8:
        where = flat if len(query.split()) == 1 else "".join(_WORD.findall(f"{parts.netloc} {parts.query}"))
        if whole in where:
            return True
    return any(_distinctive(w) and w in flat for w in words)


@dataclass(frozen=True)
class Given:
    """Something the conversation holds, in order: who wrote it (GIVEN_ORIGINS, MODEL or READ) and the text or
    JSON."""
    origin: str
    value: object


@dataclass(frozen=True)
class Entry:
    origin: str  # GIVEN_ORIGINS, READ, or LINK for a link of a page read
    depth: int   # 0 for a given URL; n for a link n pages away from one
    root: str    # the given URL the chain started from: what link fetches are charged to


@dataclass(frozen=True)
class Refusal:
    reason: str   # one of REASONS
    message: str  # what the model reads, after "Fetch failed: "


@dataclass(frozen=True)
class Rules:
    """WEB_FETCH_URLS, WEB_FETCH_LINK_DEPTH, WEB_FETCH_LINK_BUDGET and WEB_FETCH_LINKS_PER_HOUR
    (proxy/core/config.py)."""
    mode: str = "given"
    link_depth: int = 2
    link_budget: int = 2       # link fetches from one given URL, per client and hour
    links_per_hour: int = 24   # link fetches in all, per client and hour

    @classmethod
    def of(cls, cfg) -> Rules:
        """The rules a proxy.core.config.Config sets."""
        return cls(cfg.web_fetch_urls, cfg.web_fetch_link_depth, cfg.web_fetch_link_budget,
                   cfg.web_fetch_links_per_hour)


class Ledger:
    """The URLs one client request may fetch. Built from the conversation (given()), it learns the URLs of search
    results and the links of each page read as the request goes on; admit() is the check, run before the fetcher
    looks anything up. The client's memory (`reads`, proxy/tools/client_reads.py) carries link depths and link
    charges from one request to the next; without one, the ledger has its own. Thread-safe: the calls of one round
    run side by side."""

    def __init__(self, rules: Rules | None = None, given: Iterable[Given] | Callable[[], Iterable[Given]] = (),
                 reads: Reads | None = None, client: str = ""):
        self.rules = rules or Rules()
        self.reads: Reads = reads if reads is not None else ClientReads()
        self.client = client
        self._entries: dict[str, Entry] = {}
        self._written: set[str] = set()        # keys the model wrote, case-folded
        self._written_sites: set[str] = set()  # and their sites
        self.link_fetches = 0                  # this request's
        self._lock = threading.Lock()
        # Read at the first check, not here: most requests never fetch, and a long conversation takes milliseconds
        # (gathering its parts too: `given` may be the function that gathers them, called then).
        self._pending: list[Given] | Callable[[], Iterable[Given]] | None = given if callable(given) else list(given)
        self._reading = threading.Lock()  # a round's calls wait for the one reading it

    @property
    def checking(self) -> bool:
        return self.rules.mode != "any"

    def _read_conversation(self) -> None:
        """Take in the conversation given at construction, once, before anything else happens to the ledger: what
        the model wrote anywhere first (authorship does not depend on order), then what others gave, then the
        pages earlier requests read, which keep the depth they were read at."""
        if self._pending is None:
            return
        with self._reading:
            if self._pending is None:
                return  # another call read it while this one waited
            pending, self._pending = self._pending, None
            if not self.checking:
                return  # WEB_FETCH_URLS=any: nothing to check against, so nothing to gather
            parts = list(pending() if callable(pending) else pending)
            with self._lock:
                for k in (k for g in parts if g.origin == MODEL for k in written_keys(g.value)):
                    self._written.add(k.casefold())
                    self._written_sites.add(site(k))
                for g in parts:
                    if g.origin in GIVEN_ORIGINS:
                        self._give(g)
                for g in parts:
                    if g.origin == READ:
                        for k in filter(None, map(key, urls_in_value(g.value))):
                            self._read_before(k)
                            self._read_on(k)
                for g in parts:
                    if g.origin == PAGE:
                        url, text = cast(tuple[str, str], g.value)
                        self._learn(url, url, text)

    def _by_model(self, k: str) -> bool:
        return k.casefold() in self._written or site(k) in self._written_sites

    def _give(self, given: Given) -> None:
        # Scheme-less host names count only where people write them (messages, tool output), not in page links.
        for k in filter(None, map(key, urls_in_value(given.value, bare=given.origin != "search"))):
            if given.origin in CLIENT_ORIGINS and self._by_model(k):
                continue  # a client echoing what the model wrote, however reshaped: not given
            self._put(k, self._root(given.origin, k))

    def _root(self, origin: str, k: str) -> Entry:
        """A given URL's entry: a root of its own at depth 0, unless the client read it as a link within the hour
        (a person's words excepted), which keeps that depth and root."""
        recalled = self.reads.recall(self.client, k) if origin != "user" else None
        return Entry(origin, *recalled) if recalled is not None else Entry(origin, 0, k)

    def _read_before(self, k: str) -> None:
        """A page an earlier request read: at the depth the client's memory has for it, or, unknown (another worker,
        or more than an hour ago), as far as links go, so its own links are not followed."""
        if k in self._entries:
            return
        recalled = self.reads.recall(self.client, k)
        self._put(k, Entry(READ, *recalled) if recalled else Entry(READ, self.rules.link_depth, "site:" + site(k)))

    def _read_on(self, k: str) -> None:
        """The links page `k` showed when the client read it (its memory, shared with STATE_URL), one page further
        on the same root: a later request, on any worker, reads on from a page as the request that read it could."""
        entry = self._entries.get(k)
        if entry is not None:
            for link in self.reads.links(self.client, k):
                self._link(link, entry)

    def _link(self, k: str, page: Entry) -> None:
        old = self._entries.get(k)
        if old is None or page.depth + 1 <= old.depth:  # as deep: on the root just read from, the latest
            self._entries[k] = Entry(LINK, page.depth + 1, page.root)

    def read_before(self, urls: Iterable[str]) -> None:
        """Pages earlier requests read, that the client's history does not show as such (Codex's opened ref ids):
        each as a given URL is, or at the depth it was read at, and the links it showed, one page further."""
        if not self.checking:
            return
        self._read_conversation()
        with self._lock:
            for k in filter(None, map(key, urls)):
                if k not in self._entries:
                    self._read_before(k)
                self._read_on(k)

    def allow(self, urls: Iterable[str], origin: str, query: str | None = None) -> None:
        """URLs given outright (a search's results, a ref id's URL): each at depth 0, unless remembered as a link.
        With `query`, a result whose URL echoes it is the model's words, not given (unless already given)."""
        if not self.checking:
            return
        self._read_conversation()
        with self._lock:
            for url in urls:
                k = key(url)
                if k is None:
                    continue
                if query is not None and echoes_query(k, query):
                    continue
                self._put(k, self._root(origin, k))

    def _put(self, k: str, entry: Entry) -> None:
        old = self._entries.get(k)
        if old is None or entry.depth < old.depth:
            self._entries[k] = entry

    def entry(self, url) -> Entry | None:
        self._read_conversation()
        k = key(url)
        with self._lock:
            return self._entries.get(k) if k else None

    def admit(self, url) -> Refusal | None:
        """None when `url` may be fetched now (a link fetch is charged to its root, for the client), else why not.
        A URL that does not parse is admitted here: the fetcher refuses it with its own sentence, before any
        lookup."""
        if not self.checking:
            return None
        self._read_conversation()
        k = key(url)
        if k is None:
            return None
        with self._lock:
            entry = self._entries.get(k)
            if entry is None:
                return Refusal(NOT_GIVEN, (
                    f"not fetched: {k} did not appear in this conversation before this call. web_fetch reads only "
                    "URLs exactly as the user gave them or as a tool result, a web_search result or a page read in "
                    "this conversation showed them (a changed path or query is another URL; a URL you wrote "
                    "yourself, even echoed back by a tool, is not given). If you need this page, ask the user for "
                    "its URL."))
            if entry.depth > self.rules.link_depth:
                return Refusal(LINK_DEPTH, (
                    f"not fetched: {k} is a link {entry.depth} pages away from the URLs the user, a tool or a search "
                    f"gave, and links are followed at most {self.rules.link_depth} deep (WEB_FETCH_LINK_DEPTH). "
                    "Ask the user for the URL if you need it."))
            if entry.depth > 0:
                # Every link fetch counts, a repeat too: how often a link is read is a signal as well as which.
                over = self.reads.charge(self.client, entry.root, self.rules.link_budget, self.rules.links_per_hour)
                if over is not None:
                    return Refusal(LINK_BUDGET, _budget_message(k, over, self.rules))
                self.link_fetches += 1
            self.reads.remember(self.client, k, entry.depth, entry.root)
            return None

    def learn_page(self, requested: str, final: str, text: str, remember: bool = True) -> None:
        """A page was read: its final URL (after redirects, which the server chose) stands where the requested one
        did, and its links are one page further away, on the same root. `remember`: the client's memory keeps the
        links for later requests (not for a page the history itself holds, which every later request resends)."""
        if not self.checking:
            return
        self._read_conversation()
        with self._lock:
            kr, kf, links = self._learn(requested, final, text)
        for page in dict.fromkeys(k for k in (kr, kf) if k and remember):  # outside the lock: a call to the store
            self.reads.remember_links(self.client, page, links)

    def _learn(self, requested: str, final: str, text: str) -> tuple[str | None, str | None, list[str]]:
        """learn_page's work under the lock: (the requested and final keys, the page's links' keys; none when the
        page was not read through this ledger)."""
        kr, kf = key(requested), key(final)
        entry = self._entries.get(kr) if kr else None
        if entry is None:
            return None, None, []  # not read through this ledger: nothing it links to is given
        if kf:
            self._put(kf, entry)
            self.reads.remember(self.client, kf, entry.depth, entry.root)
        links = list(filter(None, map(key, links_in_page(text, final))))
        for k in links:
            self._link(k, entry)
        return kr, kf, links

    def __len__(self) -> int:
        self._read_conversation()
        with self._lock:
            return len(self._entries)


def _budget_message(k: str, over: str, rules: Rules) -> str:
    if over == DOWN:
        return (f"not fetched: {k} is a link of a page read, and links followed are counted in the proxy's shared "
                "store (STATE_URL), which is not answering, so no link is followed until it is back. URLs the user, "
                "a tool or a search gave are still read; ask the user for this one if you need it now.")
    if over == ROOT:
        return (f"not fetched: {k} is a link of pages read from a given URL whose links were already followed "
                f"{rules.link_budget} times within the hour (a repeat counts), the most allowed "
                "(WEB_FETCH_LINK_BUDGET). Read URLs the user, a tool or a search gave, or ask the user for this one.")
    return (f"not fetched: this client already followed {rules.links_per_hour} links of pages within the hour, the "
            "most allowed (WEB_FETCH_LINKS_PER_HOUR). Read URLs the user, a tool or a search gave, or ask the user "
            "for this one.")
