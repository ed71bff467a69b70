"""The web_fetch core (proxy/backends/pages/fetcher.py, proxy/backends/pages/netguard.py): SSRF refusals table by table, and the
Fetcher against real HTTP(S) servers on 127.0.0.1, checking what it returned and what the server got.

Run: tests/run.sh tests/test_fetch.py
"""
from __future__ import annotations

import gzip
import logging
import re
import shutil
import socket
import subprocess
import time
import zlib

import pytest

from proxy.backends.pages.fetcher import Fetched, Fetcher, fetched_size
from proxy.backends.pages.netguard import address_refusal, domain_matches, parse_url
from proxy.backends.pages.readable import extract_page
from proxy.backends.state.cache import TTLCache
from proxy.core.config import Config, parse_networks
from proxy.runtime.concurrency import run_together
from proxy.tools.web_fetch import FETCH_TOOL_DESCRIPTION, URL_SCHEMA, FetchError, Page
from standins.web_pages import WebSite

ARTICLE = """<!doctype html><html><head><title>Ownership - The Book</title></head><body>
<nav class="sidebar"><ul><li><a href="/a">Getting Started With Everything</a></li>
<li><a href="/b">Common Programming Concepts Overview</a></li><li><a href="/c">Sidebar Navigation Item Three</a></li></ul></nav>
<main><article><h1>What Is Ownership?</h1>
<p>Ownership is a set of rules that govern how a program manages memory. All programs have to manage
the way they use a computer's memory while running, and this paragraph is long enough to be content.</p>
<p>Some languages have garbage collection that regularly looks for no-longer-used memory as the program
runs; in other languages the programmer must explicitly allocate and free the memory by hand.</p>
<pre><code>let s = String::from("hello");</code></pre>
<p>Rust uses a third approach: memory is managed through a system of ownership with a set of rules that
the compiler checks. If any of the rules are violated, the program won't compile at all.</p>
</article></main>
<footer><a href="/privacy">Privacy policy and cookie settings</a></footer></body></html>"""


def resolver_for(mapping: dict, calls: list | None = None):
    """A getaddrinfo stand-in: host -> one address or a list of them."""
    def resolve(host, port, family=0, type=0, *rest):
        if calls is not None:
            calls.append(host)
        if host not in mapping:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        addrs = mapping[host] if isinstance(mapping[host], list) else [mapping[host]]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addrs]
    return resolve


def config(**kw) -> Config:
    base = dict(web_fetch_allowed_networks=("127.0.0.0/8",), web_fetch_timeout=5.0, web_fetch_cache_ttl=0)
    return Config(**{**base, **kw})




def make(site=None, calls=None, names=None, **kw) -> Fetcher:
    mapping = {"pages.test": "127.0.0.1", "other.test": "127.0.0.1", **(names or {})}
    return Fetcher(config(**kw), resolver=resolver_for(mapping, calls))


def url(site, path="/", host="pages.test") -> str:
    return f"http://{host}:{site.port}{path}"


def code_of(fn) -> FetchError:
    with pytest.raises(FetchError) as e:
        fn()
    assert e.value.message and "Traceback" not in e.value.message and "\n" not in e.value.message
    return e.value


# -- netguard: addresses ------------------------------------------------------------------------

REFUSED = [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("172.31.255.255", "private"), ("192.168.1.1", "private"),
    ("fc00::1", "private"), ("fd12:3456::1", "private"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"), ("fe80::1%eth0", "link-local"),
    ("224.0.0.1", "multicast"), ("239.255.255.250", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "this network"), ("::", "unspecified"), ("0.1.2.3", "this network"),
    ("100.64.0.1", "shared"), ("100.127.255.254", "shared"), ("240.0.0.1", "reserved"), ("255.255.255.255", "broadcast"),
    ("192.0.2.1", "documentation"), ("198.18.0.1", "benchmarking"), ("2001:db8::1", "documentation"),
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"), ("100.100.100.200", "metadata"),
    ("168.63.129.16", "metadata"), ("169.254.170.2", "metadata"), ("fd20:ce::254", "metadata"),
    # IPv6 spellings of IPv4 addresses are judged as the IPv4 address
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:7f00:1", "loopback"), ("::127.0.0.1", "loopback"),
    ("::ffff:10.0.0.1", "private"), ("::ffff:192.168.0.1", "private"), ("::ffff:169.254.169.254", "metadata"),
    ("64:ff9b::127.0.0.1", "loopback"), ("64:ff9b::a9fe:a9fe", "metadata"), ("64:ff9b:1::1", "NAT64"),
    ("2002:7f00:1::", "loopback"), ("2002:a00:1::1", "private"), ("2002:a9fe:a9fe::", "metadata"),
    ("::ffff:0:7f00:1", "loopback"), ("2001:0:4136:e378::1", "Teredo"),
]


@pytest.mark.parametrize("address, why", REFUSED)
def test_refused_addresses(address, why):
    reason = address_refusal(address)
    assert reason and why.lower() in reason.lower(), reason


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "151.101.1.69", "2606:4700:4700::1111",
                                     "2a00:1450:4001:82a::200e", "::ffff:8.8.8.8", "2002:808:808::", "64:ff9b::808:808"])
def test_public_addresses_pass(address):
    assert address_refusal(address) is None


@pytest.mark.parametrize("address, networks, refused", [
    ("127.0.0.1", "127.0.0.0/8", False),
    ("::ffff:127.0.0.1", "127.0.0.0/8", False),  # the mapped form of an allowed address is allowed
    ("::1", "127.0.0.0/8", True),
    ("192.168.1.20", "192.168.1.0/24", False),
    ("192.168.2.20", "192.168.1.0/24", True),
    ("fd00::5", "fd00::/8", False),
    ("169.254.169.254", "169.254.0.0/16", True),  # metadata stays refused under a covering allow-list
    ("169.254.169.254", "0.0.0.0/0", True),
    ("fd00:ec2::254", "::/0", True),
    ("10.0.0.1", "0.0.0.0/0", False),
])
def test_allow_list(address, networks, refused):
    assert (address_refusal(address, parse_networks(networks)) is not None) is refused


def test_parse_networks():
    assert [str(n) for n in parse_networks(" 10.0.0.0/8, ,fd00::/8 ")] == ["10.0.0.0/8", "fd00::/8"]
    assert parse_networks("") == () and parse_networks(()) == ()
    assert [str(n) for n in parse_networks(("192.168.1.7/24",))] == ["192.168.1.0/24"]  # host bits tolerated
    with pytest.raises(ValueError, match="WEB_FETCH_ALLOWED_NETWORKS.*nonsense"):
        parse_networks("10.0.0.0/8,nonsense")


# -- netguard: URLs ---------------------------------------------------------------------------

@pytest.mark.parametrize("raw, code", [
    ("ftp://example.com/file", "invalid_tool_input"),
    ("file:///etc/passwd", "invalid_tool_input"),
    ("gopher://example.com/", "invalid_tool_input"),
    ("javascript:alert(1)", "invalid_tool_input"),
    ("example.com/page", "invalid_tool_input"),
    ("http://user:pass@example.com/", "invalid_tool_input"),
    ("http://user@example.com/", "invalid_tool_input"),
    ("http:///path", "invalid_tool_input"),
    ("http://exa mple.com/", "invalid_tool_input"),
    ("http://example.com/\r\nHost: evil", "invalid_tool_input"),
    ("http://example.com:99999/", "invalid_tool_input"),
    ("", "invalid_tool_input"),
    (None, "invalid_tool_input"),
    ("https://example.com/" + "a" * 231, "url_too_long"),  # 251 characters
])
def test_bad_urls(raw, code):
    target, problem = parse_url(raw)
    assert target is None and problem[0] == code


def test_url_limit_is_250_characters():
    raw = "https://example.com/" + "a" * 230
    assert len(raw) == 250 and parse_url(raw)[1] is None


@pytest.mark.parametrize("raw, normalised, host, port, target, header", [
    ("HTTPS://Docs.Python.org/3/library/?q=1#frag", "https://docs.python.org/3/library/?q=1", "docs.python.org", 443, "/3/library/?q=1", "docs.python.org"),
    ("http://example.com", "http://example.com/", "example.com", 80, "/", "example.com"),
    ("http://example.com:8080/x", "http://example.com:8080/x", "example.com", 8080, "/x", "example.com:8080"),
    ("http://bücher.example/", "http://xn--bcher-kva.example/", "xn--bcher-kva.example", 80, "/", "xn--bcher-kva.example"),
    ("http://[2606:4700::1111]:81/", "http://[2606:4700::1111]:81/", "2606:4700::1111", 81, "/", "[2606:4700::1111]:81"),
    ("http://example.com./", "http://example.com/", "example.com", 80, "/", "example.com"),
])
def test_good_urls(raw, normalised, host, port, target, header):
    t, problem = parse_url(raw)
    assert problem is None
    assert (t.url, t.host, t.port, t.request_target, t.host_header) == (normalised, host, port, target, header)


# -- the Fetcher refuses before connecting ----------------------------------------------------

@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.7", "192.168.1.1", "169.254.169.254", "::1",
                                     "::ffff:127.0.0.1", "fe80::1", "100.64.0.9", "0.0.0.0"])
def test_a_public_looking_name_resolving_to_a_refused_address_is_not_fetched(site, address):
    f = Fetcher(config(web_fetch_allowed_networks=()), resolver=resolver_for({"docs.example.com": address}))
    e = code_of(lambda: f.fetch(f"http://docs.example.com:{site.port}/"))
    assert e.code == "url_not_allowed" and address in e.message and "docs.example.com" in e.message
    assert site.requests == []


@pytest.mark.parametrize("literal", ["127.0.0.1", "[::ffff:127.0.0.1]", "[::1]", "169.254.169.254", "[fd00:ec2::254]",
                                     "2130706433", "0x7f.1"])
def test_address_literals_are_refused(literal):
    # The real resolver: numeric forms like 2130706433 and 0x7f.1 are read by getaddrinfo itself, never asked of DNS.
    f = Fetcher(config(web_fetch_allowed_networks=()))
    e = code_of(lambda: f.fetch(f"http://{literal}/"))
    assert e.code == "url_not_allowed"


def test_every_address_of_a_name_must_pass(site):
    site.route("/", ARTICLE)
    f = Fetcher(config(web_fetch_allowed_networks=()), resolver=resolver_for({"mixed.test": ["8.8.8.8", "127.0.0.1"]}))
    assert code_of(lambda: f.fetch(f"http://mixed.test:{site.port}/")).code == "url_not_allowed"
    assert site.requests == []


def test_metadata_is_refused_even_when_allow_listed():
    f = Fetcher(config(web_fetch_allowed_networks=("0.0.0.0/0", "::/0")), resolver=resolver_for({"meta.test": "169.254.169.254"}))
    e = code_of(lambda: f.fetch("http://meta.test/latest/meta-data/"))
    assert e.code == "url_not_allowed" and "metadata" in e.message


def test_an_unresolvable_name_is_not_accessible():
    e = code_of(lambda: make().fetch("http://nowhere.test/"))
    assert e.code == "url_not_accessible" and "nowhere.test" in e.message


def test_a_closed_port_is_not_accessible():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    e = code_of(lambda: make().fetch(f"http://pages.test:{port}/"))
    assert e.code == "url_not_accessible" and "cannot be reached" in e.message


# -- fetching ---------------------------------------------------------------------------------

def test_html_page_main_text_title_and_what_the_server_saw(site):
    site.route("/book/ownership?x=1", ARTICLE)
    calls = []
    page = make(calls=calls).fetch(url(site, "/book/ownership?x=1"))
    assert page.url == url(site, "/book/ownership?x=1")
    assert page.title == "Ownership - The Book" and page.content_type == "text/html" and not page.truncated
    assert "# What Is Ownership?" in page.text and "Rust uses a third approach" in page.text
    assert 'String::from("hello")' in page.text
    assert "Sidebar Navigation Item Three" not in page.text and "Privacy policy" not in page.text
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", page.retrieved_at)
    (seen,) = site.requests
    assert seen.path == "/book/ownership?x=1"
    assert seen.headers["host"] == f"pages.test:{site.port}"  # the name, though the connection went to 127.0.0.1
    assert seen.headers["user-agent"].startswith("coding-stack-proxy/") and "gzip" in seen.headers["accept-encoding"]
    assert calls == ["pages.test"]  # resolved once, and the connection used that answer


def test_tool_description_and_schema():
    assert URL_SCHEMA == {"type": "object", "properties": {"url": URL_SCHEMA["properties"]["url"]}, "required": ["url"]}
    assert URL_SCHEMA["properties"]["url"]["type"] == "string"
    assert "URL" in FETCH_TOOL_DESCRIPTION and len(FETCH_TOOL_DESCRIPTION) < 400


@pytest.mark.parametrize("content_type, body, expected_type, expected_text", [
    ("text/plain; charset=utf-8", "line one\nline two\n", "text/plain", "line one\nline two\n"),
    ("application/json", '{"a": [1, 2], "b": "ü"}', "application/json", '{"a": [1, 2], "b": "ü"}'),
    ("application/vnd.api+json", '{"data": null}', "application/vnd.api+json", '{"data": null}'),
    ("text/markdown", "# Title\n\nbody", "text/markdown", "# Title\n\nbody"),
    ("TEXT/PLAIN", "shouting", "text/plain", "shouting"),
    (None, "no header, just text", "text/plain", "no header, just text"),
])
def test_text_types_pass_through(site, content_type, body, expected_type, expected_text):
    site.route("/t", body, headers={"Content-Type": content_type} if content_type else {})
    page = make().fetch(url(site, "/t"))
    assert (page.content_type, page.text, page.title) == (expected_type, expected_text, None)


def test_html_without_content_type_is_sniffed(site):
    site.route("/h", ARTICLE, headers={})
    page = make().fetch(url(site, "/h"))
    assert page.content_type == "text/html" and "third approach" in page.text


@pytest.mark.parametrize("content_type", ["image/png", "video/mp4", "application/zip"])
def test_other_types_are_unsupported(site, content_type):
    site.route("/f", b"%PDF-1.7 \x00\x01" * 1000, headers={"Content-Type": content_type})
    e = code_of(lambda: make().fetch(url(site, "/f")))
    assert e.code == "unsupported_content_type" and content_type in e.message


def test_binary_without_content_type_is_unsupported(site):
    site.route("/b", b"\x89PNG\r\n\x1a\n\x00\x00\x00", headers={})
    assert code_of(lambda: make().fetch(url(site, "/b"))).code == "unsupported_content_type"


CAFE = "Café au lait, naïve façade, ½ price"


@pytest.mark.parametrize("headers, body", [
    ({"Content-Type": "text/plain; charset=iso-8859-1"}, CAFE.encode("latin-1")),
    ({"Content-Type": 'text/plain; charset="ISO-8859-1"'}, CAFE.encode("latin-1")),
    ({"Content-Type": "text/plain; charset=windows-1252"}, CAFE.encode("cp1252")),
    ({"Content-Type": "text/plain"}, CAFE.encode("utf-8")),
    ({"Content-Type": "text/plain"}, b"\xef\xbb\xbf" + CAFE.encode("utf-8")),
    ({"Content-Type": "text/plain; charset=utf-16"}, CAFE.encode("utf-16")),
    ({"Content-Type": "text/plain; charset=no-such-charset"}, CAFE.encode("utf-8")),
    # Codecs Python knows that are no text encoding, or fail even with "replace": read as UTF-8.
    ({"Content-Type": "text/plain; charset=rot13"}, CAFE.encode("utf-8")),
    ({"Content-Type": "text/plain; charset=base64"}, CAFE.encode("utf-8")),
    ({"Content-Type": "text/plain; charset=hex"}, CAFE.encode("utf-8")),
    ({"Content-Type": "text/plain; charset=zlib"}, CAFE.encode("utf-8")),
    ({"Content-Type": "text/plain; charset=undefined"}, CAFE.encode("utf-8")),
    ({"Content-Type": "text/plain; charset=idna"}, CAFE.encode("utf-8")),
    ({"Content-Type": "text/plain; charset=punycode"}, CAFE.encode("utf-8")),
])
def test_charsets_of_text(site, headers, body):
    site.route("/c", body, headers=headers)
    assert make().fetch(url(site, "/c")).text == CAFE


@pytest.mark.parametrize("codec", ["rot13", "base64", "hex", "zlib", "bz2", "uu", "undefined", "idna"])
def test_a_meta_charset_naming_no_text_encoding_is_read_as_utf8(site, codec):
    html = f"<html><head><meta charset={codec}><title>Caf\xe9</title></head><body><article><p>{CAFE}. " + "More words here. " * 20 + "</p></article></body></html>"
    site.route("/mc", html.encode("utf-8"), headers={"Content-Type": "text/html"})
    page = make().fetch(url(site, "/mc"))
    assert page.title == "Café" and CAFE in page.text


@pytest.mark.parametrize("meta", ['<meta charset="iso-8859-1">', "<meta charset=windows-1252>",
                                  '<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1">'])
def test_meta_charset(site, meta):
    html = f"<html><head>{meta}<title>Caf\xe9</title></head><body><article><p>{CAFE}. " + "More words here. " * 20 + "</p></article></body></html>"
    site.route("/m", html.encode("latin-1"), headers={"Content-Type": "text/html"})
    page = make().fetch(url(site, "/m"))
    assert page.title == "Café" and CAFE in page.text


def test_header_charset_wins_over_meta(site):
    html = '<html><head><meta charset="utf-8"><title>x</title></head><body><p>' + CAFE + " and more text to keep. " * 10 + "</p></body></html>"
    site.route("/hm", html.encode("latin-1"), headers={"Content-Type": "text/html; charset=latin-1"})
    assert CAFE in make().fetch(url(site, "/hm")).text


def test_invalid_utf8_is_replaced_not_fatal(site):
    site.route("/bad", b"ok \xff\xfe bytes", headers={"Content-Type": "text/plain"})
    assert make().fetch(url(site, "/bad")).text == "ok \ufffd\ufffd bytes"


@pytest.mark.parametrize("encoding, encode", [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some servers send it
    ("identity", lambda b: b),
])
def test_content_encoding(site, encoding, encode):
    site.route("/z", encode(ARTICLE.encode()), headers={"Content-Type": "text/html", "Content-Encoding": encoding})
    assert "third approach" in make().fetch(url(site, "/z")).text


def test_unknown_content_encoding_is_unsupported(site):
    site.route("/br", b"\x0b\x02\x80hello\x03", headers={"Content-Type": "text/plain", "Content-Encoding": "br"})
    assert code_of(lambda: make().fetch(url(site, "/br"))).code == "unsupported_content_type"


def test_corrupt_gzip_is_not_accessible(site):
    site.route("/cz", b"\x1f\x8b\x08\x00garbage-not-gzip", headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"})
    assert code_of(lambda: make().fetch(url(site, "/cz"))).code == "url_not_accessible"


def test_byte_cap_stops_reading(site):
    site.route("/big", b"x" * 2_000_000, headers={"Content-Type": "text/plain"})
    page = make(web_fetch_max_bytes=10_000, web_fetch_max_tokens=1_000_000).fetch(url(site, "/big"))
    assert page.text == "x" * 10_000 and page.truncated


def test_byte_cap_applies_to_decoded_bytes(site):
    bomb = gzip.compress(b"A" * 50_000_000)  # 50 MB that travel as ~50 KB
    site.route("/bomb", bomb, headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"})
    started = time.monotonic()
    page = make(web_fetch_max_bytes=100_000, web_fetch_max_tokens=1_000_000).fetch(url(site, "/bomb"))
    assert len(page.text) == 100_000 and page.truncated and time.monotonic() - started < 2


def test_token_budget_from_config_and_per_call(site):
    words = " ".join(f"word{i}" for i in range(5000))
    site.route("/long", words, headers={"Content-Type": "text/plain"})
    f = make(web_fetch_max_tokens=100)
    page = f.fetch(url(site, "/long"))
    assert page.truncated and 360 <= len(page.text) <= 400 and words.startswith(page.text)
    small = f.fetch(url(site, "/long"), max_tokens=10)
    assert small.truncated and len(small.text) <= 40
    assert len(f.fetch(url(site, "/long"), max_tokens=10_000).text) <= 400  # a call can lower the budget, not raise it
    short = make(web_fetch_max_tokens=100).fetch(url(site, "/long"), max_tokens=100)
    assert short.text == page.text


@pytest.mark.parametrize("bad", [0, -5, 1.5, "10", True])
def test_invalid_max_tokens(site, bad):
    assert code_of(lambda: make().fetch(url(site, "/"), max_tokens=bad)).code == "invalid_tool_input"


@pytest.mark.parametrize("route", [dict(stall=3.0), dict(drip=0.05)])
def test_total_timeout(site, route):
    site.route("/slow", "s" * 200, headers={"Content-Type": "text/plain"}, **route)
    started = time.monotonic()
    e = code_of(lambda: make(web_fetch_timeout=0.6).fetch(url(site, "/slow")))
    assert e.code == "url_not_accessible" and "0.6 s" in e.message
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize("status, code, phrase", [
    (429, "too_many_requests", "429"),
    (404, "url_not_accessible", "HTTP 404 Not Found"),
    (403, "url_not_accessible", "HTTP 403"),
    (500, "url_not_accessible", "HTTP 500"),
    (503, "url_not_accessible", "HTTP 503"),
    (302, "url_not_accessible", "HTTP 302"),  # a redirect without Location
])
def test_error_statuses(site, status, code, phrase):
    site.route("/e", "nope", status=status, headers={"Content-Type": "text/plain"})
    e = code_of(lambda: make().fetch(url(site, "/e")))
    assert e.code == code and phrase in e.message


# -- redirects --------------------------------------------------------------------------------

def test_redirects_are_followed_and_rechecked(site):
    site.route("/start", status=301, headers={"Location": f"http://other.test:{site.port}/middle"})
    site.route("/middle", status=307, headers={"Location": "/end?done=1"})
    site.route("/end?done=1", ARTICLE)
    calls = []
    page = make(calls=calls).fetch(url(site, "/start"))
    assert page.url == f"http://other.test:{site.port}/end?done=1" and "third approach" in page.text
    assert [(r.path, r.headers["host"]) for r in site.requests] == [
        ("/start", f"pages.test:{site.port}"), ("/middle", f"other.test:{site.port}"), ("/end?done=1", f"other.test:{site.port}")]
    assert calls == ["pages.test", "other.test", "other.test"]  # each hop resolved and checked again


@pytest.mark.parametrize("location, phrase", [
    ("http://internal.test/admin", "10.0.0.5"),         # a name that resolves to a private address
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://[::ffff:192.168.0.1]/", "private"),
    ("ftp://pages.test/file", "ftp"),
    ("http://user:pw@pages.test/", "credentials"),
    ("file:///etc/passwd", "file"),
    ("http://[::1", "cannot be read"),                   # urlsplit raises on it
    ("http://[::1]x/", "loopback"),                      # urlsplit reads it as [::1]
    ("http://pages.test:99999/", "cannot be"),
])
def test_a_redirect_to_a_refused_target_is_not_followed(site, location, phrase):
    site.route("/go", status=302, headers={"Location": location})
    f = make(names={"internal.test": "10.0.0.5"})
    e = code_of(lambda: f.fetch(url(site, "/go")))
    assert e.code == "url_not_allowed" and phrase in e.message
    assert [r.path for r in site.requests] == ["/go"]


def test_more_than_five_redirects(site):
    for i in range(7):
        site.route(f"/r{i}", status=302, headers={"Location": f"/r{i + 1}"})
    site.route("/r7", ARTICLE)
    e = code_of(lambda: make().fetch(url(site, "/r0")))
    assert e.code == "url_not_accessible" and "more than 5" in e.message
    assert [r.path for r in site.requests] == [f"/r{i}" for i in range(6)]


def test_five_redirects_are_fine(site):
    for i in range(5):
        site.route(f"/r{i}", status=308, headers={"Location": f"/r{i + 1}"})
    site.route("/r5", "done", headers={"Content-Type": "text/plain"})
    assert make().fetch(url(site, "/r0")).text == "done"


# -- client domain filters ------------------------------------------------------------------

@pytest.mark.parametrize("target, domains, matches", [
    ("https://example.com/x", ["example.com"], True),
    ("https://docs.example.com/x", ["example.com"], True),
    ("https://notexample.com/x", ["example.com"], False),
    ("https://example.com.evil.org/", ["example.com"], False),
    ("https://example.com/", ["docs.example.com"], False),
    ("https://EXAMPLE.com./", ["Example.COM"], True),
    ("https://example.com/blog/post", ["example.com/blog"], True),
    ("https://example.com/blog", ["example.com/blog/"], True),
    ("https://example.com/blogger", ["example.com/blog"], False),
    ("https://example.com/", ["https://example.com"], True),  # a scheme, though not documented, is tolerated
    ("https://xn--bcher-kva.example/", ["bücher.example"], True),
    ("https://example.com/", [], False),
    # Paths are compared as the server resolves them (dot segments, escapes of unreserved characters).
    ("https://example.com/docs/../secret", ["example.com/docs"], False),
    ("https://example.com/docs/%2e%2e/secret", ["example.com/docs"], False),
    ("https://example.com/docs/%2E%2E/secret", ["example.com/docs"], False),
    ("https://example.com/docs/./a/../b", ["example.com/docs"], True),
    ("https://example.com/%64ocs/b", ["example.com/docs"], True),
    ("https://example.com/secret", ["example.com/docs/../secret"], True),
    ("https://example.com/docs%2Fx", ["example.com/docs"], False),   # %2F is not a separator to match on
])
def test_domain_matches(target, domains, matches):
    assert domain_matches(target, domains) is matches


@pytest.mark.parametrize("target, domains, kept", [
    ("https://docs.example.com/x", ["example.com/other"], False),   # a path scopes search results too
    ("https://docs.example.com/other/page", ["example.com/other"], True),
    ("https://bücher.example/", ["xn--bcher-kva.example"], True),
    ("https://example.com:8443/x/y", ["https://example.com:8443/x"], True),
    ("https://evil.com/?q=example.com", ["example.com"], False),
])
def test_search_filters_use_the_fetch_rule(target, domains, kept):
    from proxy.backends.search.search import Hit, SearchOutcome, filter_domains
    outcome = filter_domains(SearchOutcome("q", "ok", hits=[Hit("t", target)]), allowed=domains)
    assert bool(outcome.hits) is kept is domain_matches(target, domains)


def test_a_path_scoped_allow_list_refuses_dot_segments_out_of_it(site):
    site.route("/docs/a", ARTICLE)
    f = make()
    for path in ("/docs/../secret", "/docs/%2e%2e/secret"):
        e = code_of(lambda path=path: f.fetch(url(site, path), allowed_domains=["pages.test/docs"]))
        assert e.code == "url_not_allowed"
    assert site.requests == []
    assert "third approach" in f.fetch(url(site, "/docs/./a"), allowed_domains=["pages.test/docs"]).text


def test_allowed_and_blocked_domains(site):
    site.route("/", ARTICLE)
    f = make()
    assert f.fetch(url(site), allowed_domains=["pages.test"]).title
    e = code_of(lambda: f.fetch(url(site), allowed_domains=["example.com"]))
    assert e.code == "url_not_allowed" and "allowed domains" in e.message
    e = code_of(lambda: f.fetch(url(site), blocked_domains=["test"]))
    assert e.code == "url_not_allowed" and "blocked domains" in e.message
    assert len(site.requests) == 1  # refused requests never reached the server


def test_a_redirect_off_the_allowed_domains_is_refused(site):
    site.route("/hop", status=302, headers={"Location": f"http://other.test:{site.port}/x"})
    e = code_of(lambda: make().fetch(url(site, "/hop"), allowed_domains=["pages.test"]))
    assert e.code == "url_not_allowed" and "other.test" in e.message
    assert [r.path for r in site.requests] == ["/hop"]


# -- the cache --------------------------------------------------------------------------------

def test_cache_hit_serves_without_a_request_and_the_budget_applies_after_it(site):
    site.route("/start", status=302, headers={"Location": "/final"})
    site.route("/final", " ".join(["word"] * 1000), headers={"Content-Type": "text/plain"})
    f = make(web_fetch_cache_ttl=60)
    first = f.fetch(url(site, "/start"), max_tokens=5)
    assert first.truncated and len(first.text) <= 20
    again = f.fetch(url(site, "/start"))
    assert not again.truncated and len(again.text) == 4999
    final = f.fetch(url(site, "/final"))  # the final URL is a key too
    assert final.url == url(site, "/final") and final.text == again.text
    assert [r.path for r in site.requests] == ["/start", "/final"]


def test_cache_hit_still_applies_domain_filters_to_every_hop(site):
    site.route("/start", status=302, headers={"Location": f"http://other.test:{site.port}/final"})
    site.route("/final", "text", headers={"Content-Type": "text/plain"})
    f = make(web_fetch_cache_ttl=60)
    assert f.fetch(url(site, "/start")).text == "text"
    assert code_of(lambda: f.fetch(url(site, "/start"), blocked_domains=["other.test"])).code == "url_not_allowed"
    assert len(site.requests) == 2


def test_cache_expiry(site):
    site.route("/p", "v1", headers={"Content-Type": "text/plain"})
    f = make(web_fetch_cache_ttl=60)
    now = [1000.0]
    f.cache = TTLCache(60, 500, 1 << 20, fetched_size, clock=lambda: now[0])
    assert f.fetch(url(site, "/p")).text == "v1"
    site.route("/p", "v2", headers={"Content-Type": "text/plain"})
    now[0] += 59
    assert f.fetch(url(site, "/p")).text == "v1"
    now[0] += 2
    assert f.fetch(url(site, "/p")).text == "v2"
    assert len(site.requests) == 2


def test_failures_are_not_cached(site):
    site.route("/flaky", "busy", status=503, headers={"Content-Type": "text/plain"})
    f = make(web_fetch_cache_ttl=60)
    assert code_of(lambda: f.fetch(url(site, "/flaky"))).code == "url_not_accessible"
    site.route("/flaky", "fine", headers={"Content-Type": "text/plain"})
    assert f.fetch(url(site, "/flaky")).text == "fine"


def _fetched(u: str, chars: int) -> Fetched:
    return Fetched(Page(u, None, "x" * chars, "text/plain", "t", False), (u,), 200)


def test_the_page_cache_is_bounded_in_bytes_and_entries():
    cache = TTLCache(60, 500, 10_000, fetched_size)
    for i in range(20):
        cache.put(f"u{i}", _fetched(f"u{i}", 1000))
    kept = [i for i in range(20) if cache.get(f"u{i}")]
    assert kept == list(range(12, 20)) and cache.bytes <= 10_000  # the newest, least recently used out first
    cache.put("huge", _fetched("huge", 20_000))
    assert cache.get("huge") is None  # larger than the whole cache: not stored, nothing evicted for it
    assert cache.get("u19") is not None
    few = TTLCache(60, 3, 1 << 20, fetched_size)
    for i in range(5):
        few.put(f"u{i}", _fetched(f"u{i}", 10))
    assert [i for i in range(5) if few.get(f"u{i}")] == [2, 3, 4]


def test_identical_fetches_at_once_download_once(site):
    """A second request for a page already being read waits for that download instead of fetching it again."""
    site.route("/slow", "once", headers={"Content-Type": "text/plain"}, stall=0.5)
    f = make(web_fetch_cache_ttl=60)
    pages = run_together(lambda _: f.fetch(url(site, "/slow")).text, [1, 2, 3], at_most=3)
    assert pages == ["once"] * 3 and len(site.requests) == 1


def test_a_shared_download_still_applies_each_requests_domain_filters(site):
    site.route("/slow", "once", headers={"Content-Type": "text/plain"}, stall=0.5)
    f = make(web_fetch_cache_ttl=60)

    def attempt(kw):
        try:
            return f.fetch(url(site, "/slow"), **kw)
        except FetchError as e:
            return e
    got = run_together(attempt, [{}, {"blocked_domains": ["pages.test"]}], at_most=2)
    assert isinstance(got[0], Page) and isinstance(got[1], FetchError) and got[1].code == "url_not_allowed"


# -- HTTPS --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_site(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make the test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=pages.test", "-addext", "subjectAltName=DNS:pages.test",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    site = WebSite(str(cert), str(key))
    site.cert = str(cert)
    yield site
    site.close()


def test_https_connects_to_the_checked_address_with_the_name_for_sni_and_certificate(tls_site):
    tls_site.reset()
    tls_site.route("/secure", ARTICLE)
    calls = []
    page = make(calls=calls, web_fetch_ca_file=tls_site.cert).fetch(f"https://pages.test:{tls_site.port}/secure")
    assert page.url == f"https://pages.test:{tls_site.port}/secure" and "third approach" in page.text
    assert calls == ["pages.test"]
    assert tls_site.requests[-1].headers["host"] == f"pages.test:{tls_site.port}"


def test_https_certificate_for_another_name_is_refused(tls_site):
    tls_site.reset()
    tls_site.route("/secure", ARTICLE)
    f = make(names={"impostor.test": "127.0.0.1"}, web_fetch_ca_file=tls_site.cert)
    e = code_of(lambda: f.fetch(f"https://impostor.test:{tls_site.port}/secure"))
    assert e.code == "url_not_accessible" and "TLS" in e.message
    assert tls_site.requests == []


def test_https_untrusted_certificate_is_refused(tls_site):
    tls_site.reset()
    tls_site.route("/secure", ARTICLE)
    e = code_of(lambda: make().fetch(f"https://pages.test:{tls_site.port}/secure"))
    assert e.code == "url_not_accessible" and "TLS" in e.message


# -- logs and environment ---------------------------------------------------------------------

def test_one_log_line_per_fetch_without_content(site, caplog):
    site.route("/secret-path?token=abc", "private page text", headers={"Content-Type": "text/plain"})
    with caplog.at_level(logging.INFO, logger="proxy.fetch"):
        make().fetch(url(site, "/secret-path?token=abc"))
        code_of(lambda: make().fetch(url(site, "/missing")))
    lines = [r.getMessage() for r in caplog.records if r.name == "proxy.fetch"]
    assert len(lines) == 2
    assert lines[0].startswith("fetch pages.test -> 200 (17 chars,") and lines[0].endswith("ms)")
    assert lines[1].startswith("fetch pages.test -> url_not_accessible")
    assert not any("secret" in line or "token" in line or "private page" in line for line in lines)


def test_proxy_environment_variables_are_ignored(site, monkeypatch):
    # A forward proxy would resolve the name itself, so the checked address would not be the one used.
    monkeypatch.setenv("HTTP_PROXY", "http://10.9.9.9:3128")
    monkeypatch.setenv("http_proxy", "http://10.9.9.9:3128")
    site.route("/direct", "direct", headers={"Content-Type": "text/plain"})
    assert make().fetch(url(site, "/direct")).text == "direct"


def test_a_page_without_paragraphs_is_read_whole():
    title, text, _, _ = extract_page("<html><head><title> T </title></head><body>just text</body></html>", "http://x/")
    assert title == "T" and "just text" in text
    # An empty page says so, in the text the model reads (issue 40).
    assert extract_page("   ", "http://x/")[:2] == (None, "(The page has no readable text: the server sent an empty page.)")


def test_a_comment_where_a_big_page_is_cut_does_not_let_its_navigation_through():
    """scripts/bench_extract.py --big found Rust's print.html falling back to its whole text, navigation and all,
    when an HTML comment sat where the fast path cut the page: comments are not elements."""
    para = "<p>" + "word " * 40 + "</p><!-- a comment between paragraphs -->"
    html = ("<html><head><title>Big</title><script>var secret = 1;</script></head><body>"
            "<nav><a href='/a'>Sidebar entry one</a></nav><main>" + para * 4000 + "</main>"
            "<footer>Copyright footer</footer></body></html>")
    assert len(html) > 512 * 1024
    for budget in (1_000, 1_203, 10_007):  # cuts that fall on a comment as well as on a paragraph
        title, text, cut, _ = extract_page(html, "http://x/", max_chars=budget)
        assert title == "Big" and cut and "word word" in text
        assert "Sidebar entry" not in text and "Copyright footer" not in text and "secret" not in text
        assert len(text) < budget * 2


def test_the_whole_text_fallback_leaves_scripts_out(monkeypatch):
    """When the extraction fails on a page (here the Markdown writer, made to), the model reads the page's words, not
    its script source."""
    from proxy.backends.pages import markdown

    def broken(*args, **kwargs):
        raise RuntimeError("a surprise on a hostile page")
    monkeypatch.setattr(markdown.MarkdownWriter, "write", broken)
    title, text, _, _ = extract_page("<html><head><title>T</title><script>var x = 1;</script></head>"
                                  "<body><p>words</p><!-- note --></body></html>", "http://x/")
    assert title == "T" and "words" in text and "var x" not in text and "note" not in text


@pytest.mark.parametrize("size", [200 * 1024, 2 * 1024 * 1024])  # scoring, and the fast rule past 512 Ki characters
def test_extraction_keeps_code_and_drops_navigation_on_small_and_big_pages(size):
    from proxy.backends.pages.readable import extract_page
    from standins.hostile_web import big_page
    title, text, cut, _ = extract_page(big_page(size).decode(), "http://x/", max_chars=80_000)
    assert title == "Scheduler notes" and "def admit(request):" in text and "the key-value cache has room" in text
    assert "Section 3" not in text and "var x" not in text and "Copyright" not in text
    assert cut and len(text) < 80_000 * 1.5
