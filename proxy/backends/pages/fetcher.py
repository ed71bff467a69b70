"""The one fetch core behind every API's web_fetch: checks a model-written URL against the SSRF
policy (proxy/backends/pages/netguard.py), downloads the page from the checked address only, and returns its
main text (HTML as Markdown, a PDF's text) cut to a token budget.

Used by the web_fetch tool (proxy/tools/web_fetch.py) and Codex's alpha search through `Fetcher(config).fetch(url)`; not run on its own. The tool's wire types are in
proxy/tools/web_fetch.py, the pure body-to-text rules in proxy/backends/pages/pagetext.py, and the domain filters in proxy/backends/pages/netguard.py,
so tests/test_fetch.py checks those without a network, and the Fetcher against loopback servers.
"""
from __future__ import annotations

import copy
import ipaddress
import logging
import socket
import time
import urllib.parse
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from proxy.backends.pages import netguard
from proxy.backends.pages.extract import ExtractError, ExtractPool
from proxy.backends.pages.invisible import strip_invisible
from proxy.backends.pages.pagetext import (
    CHARS_PER_TOKEN,
    OPAQUE_TYPES,
    cut_to_budget,
    decode_text,
    kind_of,
    media_type,
    sniff_type,
)
from proxy.backends.state.cache import TTLCache
from proxy.core.config import Config
from proxy.runtime import concurrency as runtime
from proxy.runtime.cancel import GONE, TIMEOUT, Cancel
from proxy.transport import webclient

log = logging.getLogger("proxy.fetch")

USER_AGENT = "coding-stack-proxy/1.0 (web_fetch tool of a self-hosted LLM stack)"
REQUEST_HEADERS = (
    ("Accept", "text/html,application/xhtml+xml,application/pdf,text/plain;q=0.9,application/json;q=0.9,text/*;q=0.8"),
    ("Accept-Encoding", "gzip, deflate"),
    ("Accept-Language", "en-US,en;q=0.9"),
    ("User-Agent", USER_AGENT),
    ("Connection", "close"),
)
MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)


class FetchError(Exception):
    """A fetch that produced no page; `code` is Anthropic's web_fetch error code, `message` one sentence for the model."""

    def __init__(self, code: str, message: str, timed_out: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.timed_out = timed_out  # the page's server (or its name lookup) did not answer within WEB_FETCH_TIMEOUT


@dataclass(frozen=True)
class Page:
    url: str            # final URL after redirects
    title: str | None
    text: str           # extracted text, already cut to the token budget
    content_type: str   # "text/html", "text/plain", "application/json", ...
    retrieved_at: str   # ISO 8601 UTC, e.g. "2026-12-03T16:20:00Z"
    truncated: bool
    invisible: int = 0  # invisible code points removed from its text (proxy/backends/pages/invisible.py)
    hidden: int = 0     # hidden elements dropped from its HTML


def status_error(status: int, reason: str, url: str) -> FetchError:
    """The FetchError for a non-2xx final answer."""
    if status == 429:
        return FetchError("too_many_requests", f"{url} answered 429 Too Many Requests; do not retry right away.")
    text = f"HTTP {status} {reason}".rstrip()
    return FetchError("url_not_accessible", f"{url} answered {text}.")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the cache ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fetched:
    """A page as the cache keeps it: its text cut only by the byte cap, not by any token budget, and every URL
    of its redirect chain, so each request's domain filters are applied to a cached page too."""
    page: Page
    hops: tuple
    status: int  # the final answer's HTTP status, for the log line


def fetched_json(f: Fetched) -> dict:
    """A cached page as the shared page cache keeps it (proxy/backends/state/state.py). Pure."""
    return {"page": asdict(f.page), "hops": list(f.hops), "status": f.status}


_PAGE_TYPES: dict[str, type | tuple[type, ...]] = {"url": str, "title": (str, type(None)), "text": str, "content_type": str, "retrieved_at": str,
               "truncated": bool, "invisible": int, "hidden": int}


def fetched_from_json(doc) -> Fetched | None:
    """What fetched_json wrote, or None for anything else the shared store handed back (a miss). Pure."""
    if not isinstance(doc, dict):
        return None
    page, hops, status = doc.get("page"), doc.get("hops"), doc.get("status")
    if (not isinstance(page, dict) or set(page) != set(_PAGE_TYPES)
            or any(not isinstance(page[k], t) for k, t in _PAGE_TYPES.items())
            or not isinstance(hops, list) or not hops or not all(isinstance(h, str) for h in hops)
            or isinstance(status, bool) or not isinstance(status, int)):
        return None
    return Fetched(Page(**page), tuple(hops), status)


def fetched_size(f: Fetched) -> int:
    """Roughly the bytes a cached page holds. Pure."""
    return len(f.page.text.encode("utf-8", "replace")) + len(f.page.url) + 200


@dataclass(frozen=True)
class Body:
    """A page as downloaded: the final URL, its bytes (at most max_bytes, decoded from gzip/deflate),
    its media type and charset, whether it was cut, and the answer's status."""
    url: str
    data: bytes
    mime: str
    charset: str | None
    cut: bool
    status: int


class FetchObserver:
    """What a Fetcher tells whoever watches it (proxy/observe/metrics.py counts it); this base hears nothing.
    Handed to the Fetcher where the worker is put together, so the fetcher knows no meter."""

    def looked_up(self, how: str, age: float | None) -> None:
        """A page cache lookup: "hit", "miss" or "shared" (waited for an identical download in flight)."""

    def fetched(self, error: FetchError | None, seconds: float) -> None:
        """A fetch this call made itself (not a cached or shared page): None when it gave a page."""

    def read(self, nbytes: int) -> None:
        """Body bytes read from a web server (after decompression)."""


class PageFetcher(Protocol):
    """What the tools read pages by (proxy/tools/base.py's Backends): Fetcher, or a test's stand-in."""

    def fetch(self, url: str, *, max_tokens: int | None = None, allowed_domains: list[str] | None = None,
              blocked_domains: list[str] | None = None, cancel: Cancel | None = None) -> Page:
        """The page at `url`, its text cut to `max_tokens` (or the fetcher's own budget) and read only from allowed
        domains; every failure raises FetchError, nothing else. `cancel` stops it when the client leaves."""
        ...

    def scoped(self, scope: str) -> PageFetcher:
        """This fetcher with a page cache of `scope`'s own (a person's key name)."""
        ...


class Fetcher:
    """Fetches one URL per call; `fetch()` returns a Page or raises FetchError, never anything else.

    Proxy environment variables (HTTPS_PROXY, HTTP_PROXY, NO_PROXY) are ignored on purpose: a
    forward proxy resolves the name itself, so the address checked here would not be the one
    connected to. urllib3 reads no environment, so nothing has to be switched off.
    """

    def __init__(self, config: Config, resolver=socket.getaddrinfo, extractor: ExtractPool | None = None,
                 observer: FetchObserver | None = None):
        self.allowed = config.web_fetch_allowed_networks  # parsed once, by Config
        self.timeout = config.web_fetch_timeout
        self.max_bytes = config.web_fetch_max_bytes
        self.max_tokens = config.web_fetch_max_tokens
        self.ca_file = config.web_fetch_ca_file or None
        self.resolver = resolver
        # Pages under the same cache rules as searches (proxy/backends/state/cache.py): a TTL, entries and bytes bounded, one
        # download in flight per URL, failures never kept.
        self.cache: TTLCache[Fetched] = TTLCache(config.web_fetch_cache_ttl, config.web_fetch_cache_entries,
                                                 config.web_fetch_cache_bytes, fetched_size)
        self.extractor = extractor or ExtractPool.from_config(config)
        self.max_per_turn = config.web_fetch_max_per_turn  # the caps ToolSession applies to a request's calls
        self.max_per_request = config.web_fetch_max_per_request
        self.observer = observer or FetchObserver()

    scope = ""  # whose page cache this view reads and fills: "" is everyone's (see scoped)

    def scoped(self, scope: str) -> Fetcher:
        """This fetcher with a page cache of `scope`'s own (a person's key name): nobody learns from a hit, its
        Retrieved time or its speed which pages another person read, and when. Pure."""
        view = copy.copy(self)
        view.scope = scope
        return view

    def _cache_key(self, url: str) -> str:
        return f"{self.scope}\n{url}" if self.scope else url

    def fetch(self, url: str, *, max_tokens: int | None = None,
              allowed_domains: list[str] | None = None, blocked_domains: list[str] | None = None,
              cancel: Cancel | None = None) -> Page:
        """The page at `url`; `cancel` (the caller's, so its client's leaving stops the fetch) gets the
        fetch's deadline over connect, head and body of every redirect."""
        started = time.monotonic()
        host, status, size = "-", "error", 0
        how = "miss"  # until the cache says otherwise, this call is a download of its own (or a refusal before one)
        error: FetchError | None = None
        cancel = cancel or Cancel()
        try:
            if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
                raise FetchError("invalid_tool_input", "max_tokens must be a positive whole number.")
            budget = min(self.max_tokens, max_tokens or self.max_tokens)
            target = self._target(url)
            host = target.host
            found = self.cache.get_or_compute(
                self._cache_key(target.url), lambda: self._fetched(target, started, cancel, allowed_domains, blocked_domains),
                lambda _: True, wait=self.timeout + 2 * self.extractor.wall_seconds + 5)
            how = found.how
            if self.cache.enabled:
                self.observer.looked_up(how, found.age)
            page = found.value.page
            if found.how == "miss":
                status = str(found.value.status)
                if page.url != target.url:
                    self.cache.put(self._cache_key(page.url), found.value)  # a later request for where it redirected
            else:  # another request's download: this request's own domain filters still apply, to every hop
                self._check_domains(found.value.hops, allowed_domains, blocked_domains)
                status = "cached" if found.how == "hit" else "shared"
            size = len(page.text)
            text, cut = cut_to_budget(page.text, budget)
            return replace(page, text=text, truncated=page.truncated or cut)
        except FetchError as e:
            status, error = e.code, e
            raise
        except Exception:
            # A library's surprise on a hostile page must not end the client's turn: the model reads a
            # failure and the log keeps the traceback (one line per fetch stays the rule otherwise).
            status = "unavailable"
            log.exception("fetch %s: unexpected failure", host)
            error = FetchError("unavailable", "The proxy could not read this page (an internal error); try another URL.")
            raise error from None
        finally:
            if how == "miss":  # a page from the cache, or from another request's download, is no fetch
                self.observer.fetched(error, time.monotonic() - started)
            # Host and sizes only: the page and the URL's path and query come from the prompt.
            log.info("fetch %s -> %s (%d chars, %.0f ms)", host, status, size, (time.monotonic() - started) * 1000)

    def _fetched(self, target: netguard.Target, started: float, cancel: Cancel, allowed, blocked) -> Fetched:
        """Download and extract one page, within the fetch's deadline (extraction has limits of its own)."""
        cancel.arm(self.timeout)
        try:
            body, hops = self._download(target, started, cancel, allowed, blocked)
        finally:
            cancel.disarm()  # extraction has limits of its own (proxy/backends/pages/extract.py)
        return Fetched(self._page(body, cancel), tuple(hops), body.status)

    # Each step below raises FetchError with the sentence the model reads.

    @staticmethod
    def _target(url) -> netguard.Target:
        target, problem = netguard.parse_url(url)
        if target is None:  # parse_url gives exactly one of the two
            raise FetchError(*(problem or ("invalid_tool_input", "The URL cannot be read.")))
        return target

    @staticmethod
    def _check_domains(hops, allowed, blocked) -> None:
        for hop in hops:
            why = netguard.domain_refusal(hop, allowed, blocked)
            if why:
                raise FetchError("url_not_allowed", f"Not fetched: {why}.")

    def _interrupted(self, url: str, cancel: Cancel) -> FetchError | None:
        """The error for a fetch its Cancel ended (the deadline, or the client leaving), else None."""
        if cancel.reason == TIMEOUT:
            return FetchError("url_not_accessible", f"{url} did not answer within {self.timeout:g} s.", timed_out=True)
        if cancel.reason == GONE:
            return FetchError("url_not_accessible", "Not fetched: the client closed the request.")
        return None

    def _resolve(self, target: netguard.Target, started: float, cancel: Cancel):
        """getaddrinfo within the fetch's deadline. Under gevent a timeout ends the wait (the lookup
        itself finishes in gevent's resolver); in a plain thread the resolver's own timeouts bound it."""
        try:
            return runtime.within(self._remaining(started, target.url, cancel),
                                  lambda: self.resolver(target.host, target.port, 0, socket.SOCK_STREAM))
        except TimeoutError:  # an OSError: the caller would take it for a failed lookup
            raise FetchError("url_not_accessible",
                             f"{target.url} did not answer within {self.timeout:g} s (name lookup).", timed_out=True) from None

    def _addresses(self, target: netguard.Target, started: float, cancel: Cancel) -> list[str]:
        """The addresses to connect to: the host's, every one of which passed the SSRF policy.

        All must pass, not just some: a name that answers with a public and a private address
        is either misconfigured or a rebinding attempt, and picking the public one would hide it.
        """
        if _is_ip(target.host):
            addresses = [target.host]
        else:
            try:
                infos = self._resolve(target, started, cancel)
            except (OSError, UnicodeError) as e:
                raise FetchError("url_not_accessible", f"The host {target.host} cannot be resolved ({e}).") from None
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
            if not addresses:
                raise FetchError("url_not_accessible", f"The host {target.host} has no address.")
        for address in addresses:
            why = netguard.address_refusal(address, self.allowed)
            if why:
                where = "" if address == target.host else f" resolves to {address}, which"
                raise FetchError("url_not_allowed", f"Not fetched: {target.host}{where} is {why}; web_fetch only reads public addresses.")
        return addresses

    def _remaining(self, started: float, url: str, cancel: Cancel) -> float:
        stop = self._interrupted(url, cancel)
        if stop is not None:
            raise stop
        left = self.timeout - (time.monotonic() - started)
        if left <= 0:
            raise FetchError("url_not_accessible", f"{url} did not answer within {self.timeout:g} s.", timed_out=True)
        return left

    def _open(self, target: netguard.Target, address: str, started: float, cancel: Cancel) -> webclient.Opened:
        """One request to `address`, with the name of `target` in Host, SNI and the certificate check."""
        headers = {"Host": target.host_header, **dict(REQUEST_HEADERS)}
        return webclient.get(target.scheme, address, target.port, target.request_target, headers,
                             self._remaining(started, target.url, cancel), cancel, host=target.host, ca_file=self.ca_file)

    def _connect(self, target: netguard.Target, started: float, cancel: Cancel) -> webclient.Opened:
        last = ""
        for address in self._addresses(target, started, cancel):
            try:
                return self._open(target, address, started, cancel)
            except webclient.WebError as e:
                stop = self._interrupted(target.url, cancel)
                if stop is not None:
                    raise stop from None
                if e.kind == "tls":
                    raise FetchError("url_not_accessible", f"{target.url}: the TLS connection failed ({e.detail}).") from None
                if e.kind == "timeout":
                    raise FetchError("url_not_accessible", f"{target.url} did not answer within {self.timeout:g} s.", timed_out=True) from None
                # Refused, unreachable, or a head that is not HTTP: try the host's next address (IPv6
                # is often listed first and unreachable in a container).
                last = e.detail
        raise FetchError("url_not_accessible", f"{target.url} cannot be reached ({last}).")

    def _download(self, target: netguard.Target, started: float, cancel: Cancel, allowed, blocked) -> tuple[Body, list]:
        hops = []
        for _ in range(MAX_REDIRECTS + 1):
            hops.append(target.url)
            self._check_domains([target.url], allowed, blocked)
            opened = self._connect(target, started, cancel)
            try:
                if opened.status in REDIRECTS and opened.header("Location"):
                    target = self._redirect_target(target, opened.header("Location"))
                    continue
                if not 200 <= opened.status < 300:
                    raise status_error(opened.status, opened.reason, target.url)
                mime, charset = media_type(opened.header("Content-Type") or None)
                if mime and kind_of(mime) is None and mime not in OPAQUE_TYPES:
                    raise FetchError("unsupported_content_type", f"{target.url} is {mime}; web_fetch reads HTML, PDF, plain text and JSON.")
                data, cut = self._read_body(target, opened, started, cancel)
                return Body(target.url, data, mime, charset, cut, opened.status), hops
            finally:
                opened.close()
        raise FetchError("url_not_accessible", f"{hops[0]} redirected more than {MAX_REDIRECTS} times.")

    def _redirect_target(self, current: netguard.Target, location: str) -> netguard.Target:
        try:
            joined = urllib.parse.urljoin(current.url, location.strip())
        except ValueError as e:  # http://[::1 and other URLs urlsplit cannot read
            raise FetchError("url_not_allowed", f"{current.url} redirected to a URL that cannot be read ({e}).") from None
        nxt, problem = netguard.parse_url(joined)
        if nxt is None:  # parse_url gives exactly one of the two
            code, why = problem or ("invalid_tool_input", "it cannot be read")
            code = "url_not_allowed" if code == "invalid_tool_input" else code
            raise FetchError(code, f"{current.url} redirected to a URL that is not fetched: {why}")
        return nxt

    def _page(self, body: Body, cancel: Cancel) -> Page:
        """The downloaded bytes as the Page the model reads: decoded, and HTML extracted to Markdown."""
        mime = body.mime if body.mime and body.mime not in OPAQUE_TYPES else sniff_type(body.data)
        kind = kind_of(mime)
        if kind is None:
            raise FetchError("unsupported_content_type", f"{body.url} sent {body.mime or 'no Content-Type'} and does not look like text.")
        title: str | None = None
        cut, hidden = body.cut, 0
        if kind in ("html", "pdf"):
            try:
                # Only what the largest budget can hold is written (the cache keeps that much); a PDF goes to the
                # same pool, under the same limits, as its bytes.
                budget = self.max_tokens * CHARS_PER_TOKEN
                if kind == "html":
                    title, text, trimmed, hidden = self.extractor.extract(
                        decode_text(body.data, body.charset, True), body.url, cancel, budget)
                else:
                    title, text, trimmed = self.extractor.extract_pdf(body.data, body.url, cancel, budget)
            except ExtractError as e:
                raise self._interrupted(body.url, cancel) or FetchError(e.code, f"{body.url}: {e.message}") from None
            cut = cut or trimmed
        else:
            text = decode_text(body.data, body.charset, False)
        # Every kind carries invisible code points as well as HTML does (a PDF's text too); the title is read too.
        text, invisible = strip_invisible(text)
        if title is not None:
            title, in_title = strip_invisible(title)
            invisible += in_title
        return Page(url=body.url, title=title, text=text, content_type=mime, retrieved_at=now_iso(), truncated=cut,
                    invisible=invisible, hidden=hidden)

    def _read_body(self, target: netguard.Target, opened: webclient.Opened, started: float, cancel: Cancel,
                   ) -> tuple[bytes, bool]:
        """At most max_bytes decoded bytes; stops reading (and downloading) once there are more."""
        try:
            body, cut = webclient.read_body(opened, self.max_bytes, cancel,
                                            before_each=lambda: self._remaining(started, target.url, cancel))
            self.observer.read(len(body))
            return body, cut
        except webclient.WebError as e:
            stop = self._interrupted(target.url, cancel)
            if stop is not None:
                raise stop from None  # the end of the body was the Cancel shutting the socket, not the server's
            if e.kind == "encoding":
                raise FetchError("unsupported_content_type", e.detail) from None
            if e.kind == "decode":
                raise FetchError("url_not_accessible", f"{target.url} sent a body that does not decompress ({e.detail}).") from None
            if e.kind == "timeout":
                raise FetchError("url_not_accessible", f"{target.url} did not answer within {self.timeout:g} s.", timed_out=True) from None
            raise FetchError("url_not_accessible", f"{target.url}: the connection broke while reading ({e.detail}).") from None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
