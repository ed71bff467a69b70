"""URL provenance for web_fetch and Codex's `open`, pure (issue 33): gathering URLs from text and JSON values, the
per-request Ledger of the URLs a fetch may read (each with its origin and link depth), and the check that refuses
any other URL before a name is looked up. Tested by tests/test_provenance.py (`tests/run.sh tests/test_provenance.py`).

The rule is Anthropic's for its own web_fetch ("To minimize exfiltration risks"): the model may read a URL the user
gave, or one a tool result or a search result held, never one it built, since a built URL (or host name, or query)
is a message to whoever runs that server or its DNS. Links of pages read are allowed too, but only a short chain
of them and only a few per request: a page that links /h/a ... /h/z would otherwise let the model spell a secret by
the links it follows (README, Security, has the bound in bits).
"""
from __future__ import annotations

import re
import string
import threading
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.backends.netguard import parse_url

# Who put a URL in the conversation. "model" adds nothing: it marks URLs the model wrote, so that a client tool
# echoing them back (a shell's `echo`) does not make them given.
GIVEN_ORIGINS = ("user", "system", "tool", "search")
MODEL = "model"
LINK = "link"

# Refusal reasons, also the metric's labels (proxy/observe/metrics.py).
NOT_GIVEN = "not_given"
LINK_DEPTH = "link_depth"
LINK_BUDGET = "link_budget"
REASONS = (NOT_GIVEN, LINK_DEPTH, LINK_BUDGET)

MODES = ("given", "any")
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


@dataclass(frozen=True)
class Given:
    """Something the conversation holds, in order: who wrote it (GIVEN_ORIGINS, or MODEL) and the text or JSON."""
    origin: str
    value: object


@dataclass(frozen=True)
class Entry:
    origin: str  # GIVEN_ORIGINS, or LINK for a link of a page read
    depth: int   # 0 for a given URL; n for a link n pages away from one


@dataclass(frozen=True)
class Refusal:
    reason: str   # one of REASONS
    message: str  # what the model reads, after "Fetch failed: "


@dataclass(frozen=True)
class Rules:
    """WEB_FETCH_URLS, WEB_FETCH_LINK_DEPTH and WEB_FETCH_LINK_BUDGET (proxy/core/config.py)."""
    mode: str = "given"
    link_depth: int = 2
    link_budget: int = 2

    @classmethod
    def of(cls, cfg) -> Rules:
        """The rules a proxy.core.config.Config sets."""
        return cls(cfg.web_fetch_urls, cfg.web_fetch_link_depth, cfg.web_fetch_link_budget)


class Ledger:
    """The URLs one client request may fetch. Built from the conversation (given()), it learns the URLs of search
    results and the links of each page read as the request goes on; admit() is the check, run before the fetcher
    looks anything up. Thread-safe: the calls of one round run side by side."""

    def __init__(self, rules: Rules | None = None, given: Iterable[Given] = ()):
        self.rules = rules or Rules()
        self._entries: dict[str, Entry] = {}
        self._written: set[str] = set()  # keys the model wrote before anything gave them
        self.link_fetches = 0
        self._lock = threading.Lock()
        # Read at the first check, not here: most requests never fetch, and a long conversation takes milliseconds.
        self._pending: list[Given] | None = list(given)
        self._reading = threading.Lock()  # a round's calls wait for the one reading it

    @property
    def checking(self) -> bool:
        return self.rules.mode != "any"

    def _read_conversation(self) -> None:
        """Take in the conversation given at construction, once, before anything else happens to the ledger."""
        if self._pending is None:
            return
        with self._reading:
            if self._pending is None:
                return  # another call read it while this one waited
            for g in self._pending:
                self._add(g)
            self._pending = None

    def add(self, given: Given) -> None:
        """Take in one part of the conversation, in the conversation's order."""
        self._read_conversation()
        self._add(given)

    def _add(self, given: Given) -> None:
        if not self.checking:
            return  # WEB_FETCH_URLS=any: nothing to check against, so nothing to gather
        # Scheme-less host names count only where people write them (messages, tool output), not in page links.
        keys = {k for k in map(key, urls_in_value(given.value, bare=given.origin != "search")) if k}
        with self._lock:
            if given.origin == MODEL:
                self._written.update(k for k in keys if k not in self._entries)
                return
            for k in keys:
                if given.origin == "tool" and k in self._written:
                    continue  # the model wrote it first: a tool that prints it back does not make it given
                self._put(k, Entry(given.origin, 0))

    def allow(self, urls: Iterable[str], origin: str) -> None:
        """URLs given outright (a search's results, a ref id's URL): each at depth 0."""
        if not self.checking:
            return
        self._read_conversation()
        with self._lock:
            for k in filter(None, map(key, urls)):
                self._put(k, Entry(origin, 0))

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
        """None when `url` may be fetched now (a link fetch is counted against the budget), else why not. A URL that
        does not parse is admitted here: the fetcher refuses it with its own sentence, before any lookup."""
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
                    "this request showed them (a changed path or query is another URL). If you need this page, ask "
                    "the user for its URL."))
            if entry.depth == 0:
                return None
            if entry.depth > self.rules.link_depth:
                return Refusal(LINK_DEPTH, (
                    f"not fetched: {k} is a link {entry.depth} pages away from the URLs the user, a tool or a search "
                    f"gave, and links are followed at most {self.rules.link_depth} deep (WEB_FETCH_LINK_DEPTH). "
                    "Ask the user for the URL if you need it."))
            if self.link_fetches >= self.rules.link_budget:
                return Refusal(LINK_BUDGET, (
                    f"not fetched: this request already followed {self.link_fetches} links of pages it read, the "
                    f"most one request may (WEB_FETCH_LINK_BUDGET). Read URLs the user, a tool or a search gave, "
                    "or ask the user for this one."))
            # Every link fetch counts, a repeat too: how often a link is read is a signal as well as which.
            self.link_fetches += 1
            return None

    def learn_page(self, requested: str, final: str, text: str) -> None:
        """A page was read: its final URL (after redirects, which the server chose) stands where the requested one
        did, and its links are one page further away."""
        if not self.checking:
            return
        self._read_conversation()
        kr, kf = key(requested), key(final)
        with self._lock:
            entry = self._entries.get(kr) if kr else None
            depth = entry.depth if entry is not None else 0  # unchecked mode: every read URL counts as given
            if kf and entry is not None:
                self._put(kf, entry)
            for k in filter(None, map(key, links_in_page(text, final))):
                self._put(k, Entry(LINK, depth + 1))

    def __len__(self) -> int:
        self._read_conversation()
        with self._lock:
            return len(self._entries)
