"""Where a fetch may go, pure: the SSRF policy (which URLs may be fetched, which IP addresses may be connected
to) and the client's domain filters (allowed_domains/blocked_domains, also web_search's).

Used by proxy/backends/pages/fetcher.py before every connection (the first URL and each redirect) and by proxy/backends/search/searxng.py; tested
in tests/test_fetch.py. Nothing here touches the network: the caller resolves names and passes the addresses in.
"""
from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass

# Anthropic's web_fetch refuses longer URLs with `url_too_long`; the same limit keeps a
# model-written URL from carrying a prompt's worth of data out in its query string.
MAX_URL_CHARS = 250

# Instance-metadata endpoints hand out cloud credentials. They are refused even when an
# allow-listed network covers them: WEB_FETCH_ALLOWED_NETWORKS=169.254.0.0/16 (or 0.0.0.0/0)
# is meant to open a LAN or a lab, not the host's IAM role.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle: the metadata service
    "169.254.170.2",    # AWS ECS task metadata and credentials
    "169.254.169.253",  # AWS VPC DNS resolver
    "169.254.169.123",  # AWS time sync
    "fd00:ec2::254",    # AWS metadata over IPv6
    "fd00:ec2::23",     # AWS DNS over IPv6
    "fd20:ce::254",     # GCP metadata over IPv6
    "100.100.100.200",  # Alibaba Cloud metadata
    "168.63.129.16",    # Azure WireServer (a public-looking address)
    "192.0.0.192",      # Oracle Cloud legacy metadata
))

# Address blocks never fetched unless allow-listed, with the reason the model reads. An
# explicit table rather than ipaddress's is_global, whose answers changed between Python
# releases; is_global still catches whatever this table misses.
_V4 = [
    ("255.255.255.255/32", "the broadcast address"),
    ("0.0.0.0/8", "a 'this network' address (0.0.0.0/8)"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol-assignment address"),
    ("192.0.2.0/24", "a documentation address"),
    ("192.88.99.0/24", "a 6to4 relay address"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
]
_V6 = [
    ("::/128", "the unspecified address"),
    ("::1/128", "a loopback address"),
    ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("100::/64", "a discard-only address"),
    ("2001::/23", "an IETF special-purpose address (Teredo, ORCHID, ...)"),
    ("2001:db8::/32", "a documentation address"),
    ("3fff::/20", "a documentation address"),
    ("5f00::/16", "a segment-routing address"),
    ("fc00::/7", "a private (unique-local) address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"),
    ("ff00::/8", "a multicast address"),
]
REFUSED = [(ipaddress.ip_network(n), why) for n, why in _V4 + _V6]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPAT = ipaddress.ip_network("::/96")
_SIIT = ipaddress.ip_network("::ffff:0:0:0/96")  # IPv4-translated (RFC 2765)


def embedded_ipv4(ip) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, translated, NAT64, 6to4), if any."""
    if ip.version != 6:
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or ip in _SIIT or (ip in _COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _in(ip, networks) -> bool:
    return any(ip.version == n.version and ip in n for n in networks)


def address_refusal(address, allowed=()) -> str | None:
    """None when `address` may be connected to, else why not (a phrase: "a loopback address").

    `allowed` is proxy.core.config.parse_networks()'s result. An IPv6 form of an IPv4 address is judged as that
    IPv4 address (so ::ffff:127.0.0.1 is loopback, and allow-listing 127.0.0.0/8 covers it).
    """
    try:
        ip = ipaddress.ip_address(str(address).split("%", 1)[0])  # a zone index names an interface, not a host
    except ValueError:
        return "not an IP address"
    v4 = embedded_ipv4(ip)
    if ip in METADATA_ADDRESSES or v4 in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if _in(ip, allowed) or (v4 is not None and _in(v4, allowed)):
        return None
    if v4 is not None:
        why = address_refusal(v4)
        return f"{why} (in an IPv6 form)" if why else None
    for network, why in REFUSED:
        if ip.version == network.version and ip in network:
            return why
    if not ip.is_global:
        return "a reserved address"
    return None


_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


def normalise_path(path: str) -> str:
    """A URL path as a server resolves it, per RFC 3986: percent-escapes of unreserved characters decoded
    (%2e is "."), the others upper-cased, and "." and ".." segments removed. Pure.

    Without it "example.com/docs" would admit "/docs/../secret" and "/docs/%2e%2e/secret", which the
    server serves as "/secret"."""
    def unescape(m: re.Match) -> str:
        c = chr(int(m.group(1), 16))
        return c if (c.isascii() and c.isalnum()) or c in "-._~" else "%" + m.group(1).upper()
    segments = _PERCENT.sub(unescape, path or "/").split("/")
    out: list[str] = []
    for seg in segments[1:]:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    trailing = segments[-1] in (".", "..") and len(segments) > 1
    return "/" + "/".join(out) + ("/" if trailing and out else "")


@dataclass(frozen=True)
class Target:
    """A URL that passed parse_url: what to connect to and what to send."""
    url: str          # normalised: lower-case scheme and host, IDNA host, no fragment
    scheme: str
    host: str         # IDNA-encoded name, or an IP address without brackets
    port: int
    request_target: str  # path and query, as sent on the request line
    host_header: str


_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _ascii(text: str) -> str:
    """`text` with each run of non-ASCII characters UTF-8 %-escaped, the rest (a %XX already there) unchanged: what
    a browser does with an IRI's path and query."""
    return _NON_ASCII.sub(lambda m: urllib.parse.quote(m.group(0), safe=""), text)


def parse_url(url, max_chars: int = MAX_URL_CHARS) -> tuple[Target | None, tuple[str, str] | None]:
    """Check a model-written URL: (target, None), or (None, (error_code, message)). Pure.

    Only http and https, a host, no credentials, at most max_chars characters. Any port is
    allowed: what matters is the address, which the caller checks after resolving.
    """
    if not isinstance(url, str) or not url.strip():
        return None, ("invalid_tool_input", "The url must be a non-empty string.")
    url = url.strip()
    if len(url) > max_chars:
        return None, ("url_too_long", f"The URL is longer than {max_chars} characters.")
    if any(c in url for c in "\r\n\t\x00 ") or not url.isprintable():
        return None, ("invalid_tool_input", "The URL contains whitespace or control characters.")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError as e:
        return None, ("invalid_tool_input", f"The URL cannot be parsed ({e}).")
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return None, ("invalid_tool_input", f"Only http and https URLs can be fetched, not {scheme or 'a URL without a scheme'}.")
    if parts.username is not None or parts.password is not None:
        return None, ("invalid_tool_input", "URLs with credentials (user:password@) are not fetched.")
    if not host:
        return None, ("invalid_tool_input", "The URL has no host.")
    host = host.rstrip(".")
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
        host = str(ip)
    except ValueError:
        ip = None
        try:
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            return None, ("invalid_tool_input", "The URL's host is not a valid domain name.")
    port = port or (443 if scheme == "https" else 80)
    shown = f"[{host}]" if ip is not None and ip.version == 6 else host
    netloc = shown if port == (443 if scheme == "https" else 80) else f"{shown}:{port}"
    # The path as the server will resolve it, so the domain filters judge the path that is sent. An IRI's
    # non-ASCII path and query go out as a browser sends them, UTF-8 %-escaped (issue 39): HTTP carries ASCII only.
    path = normalise_path(_ascii(parts.path))
    query = _ascii(parts.query)
    request_target = path + (f"?{query}" if query else "")
    normalised = urllib.parse.urlunsplit((scheme, netloc, path, query, ""))
    return Target(normalised, scheme, host, port, request_target, netloc), None


# -- the client's domain filters: Anthropic's allowed_domains/blocked_domains, on every hop and every cached page

def _idna(name: str) -> str | None:
    """A host name in lower-case ASCII (IDNA), without a trailing dot; None when it is not a valid name."""
    name = name.strip().lower().rstrip(".")
    try:
        return name.encode("idna").decode("ascii") if name else None
    except UnicodeError:
        return None


def domain_matches(url: str, domains) -> bool:
    """True when the URL is under one of `domains` as Anthropic documents them: "example.com" covers
    its subdomains, "example.com/docs" that path and below (compared after normalise_path); a scheme,
    if given, is ignored. Pure. The one matcher and the one rule of the proxy's domain filters: web_fetch's
    and web_search's (search.filter_domains)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = _idna(parts.hostname or "")
    except ValueError:
        return False
    if host is None:
        return False
    path = normalise_path(parts.path)
    for d in domains or ():
        d = str(d).strip().lower()
        if "//" in d:
            d = d.split("//", 1)[1]
        spelled, _, prefix = d.partition("/")
        name = _idna(spelled.rsplit(":", 1)[0] if spelled.count(":") == 1 else spelled)  # a port, if given, is ignored
        if not name or not (host == name or host.endswith("." + name)):
            continue
        prefix = normalise_path("/" + prefix).rstrip("/") if prefix.strip("/") else ""
        if not prefix or path == prefix or path.startswith(prefix + "/"):
            return True
    return False


def domain_refusal(url: str, allowed, blocked) -> str | None:
    """Why a client's allowed_domains/blocked_domains refuse `url`, or None."""
    if allowed and not domain_matches(url, allowed):
        return f"{urllib.parse.urlsplit(url).hostname} is not in the allowed domains of this request"
    if blocked and domain_matches(url, blocked):
        return f"{urllib.parse.urlsplit(url).hostname} is in the blocked domains of this request"
    return None
