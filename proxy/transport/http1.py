"""HTTP/1.1 as the proxy speaks it to vLLM, pure: which headers are hop-by-hop, the request head, how a response
body is framed, and when a failed request may go again. Used by proxy/transport/vllm.py's client and the relay; tested
without a network in tests/test_upstream.py.
"""
from __future__ import annotations

# RFC 9110 §7.6.1: meaningful for one connection only, never relayed. Content-Length is
# recomputed by whoever writes the next hop, and Host belongs to that hop too.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
})
# RFC 9110 §9.2.2: repeating one of these has the effect of sending it once, so a client may
# retry one that may have reached the server (RFC 9112 §9.3.1). A POST is never among them.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


def end_to_end_headers(headers):
    """Drop hop-by-hop headers, including any the Connection header itself names."""
    headers = list(headers)
    named: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(v.strip().lower() for v in value.split(","))
    return [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() not in named]


class ProtocolError(Exception):
    """The backend's bytes are not a well-formed HTTP/1.1 response, or stop short of one."""


def request_head(method: str, target: str, host: str, headers, body_length: int | None) -> bytes:
    """The request line and headers as bytes. Pure.

    Latin-1, as gunicorn decoded them, so the client's bytes reach vLLM unchanged. A CR or
    LF inside a name, value or target would let one header smuggle another: refused.
    """
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body_length is not None:
        lines.append(f"Content-Length: {body_length}")
    text = "\r\n".join(lines)
    if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1:
        raise ValueError("a request header or the target contains a line break")
    return (text + "\r\n\r\n").encode("latin-1")


def is_digits(text: str) -> bool:
    """Only ASCII digits, RFC 9110's DIGIT. Pure. str.isdigit() alone passes "²" (latin-1's
    0xB2, which int() then refuses: a 500), and int() alone takes "+5", " 5" and "5_0".
    llhttp checks the same before this does; the rule stands on its own all the same."""
    return text.isascii() and text.isdigit()


def content_length(headers) -> int | None:
    """The Content-Length, None without one; ProtocolError unless it is one decimal number
    (repeated lines must agree). Pure."""
    lengths = {v for n, v in headers if n.lower() == "content-length"}
    if not lengths:
        return None
    value = next(iter(lengths))
    # 18 digits is an exabyte; a longer number is garbage, and int() refuses 4,300 digits.
    if len(lengths) > 1 or not is_digits(value) or len(value) > 18:
        raise ProtocolError(f"invalid Content-Length: {', '.join(sorted(lengths))[:80]!r}")
    return int(value)


def body_framing(method: str, status: int, headers) -> tuple[str, int]:
    """How the body ends (RFC 9112 §6.3): ("none"|"length"|"chunked"|"close", length). Pure.

    Content-Length is checked even where no body follows, since a HEAD answer relays it.
    """
    length = content_length(headers)
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return "none", 0
    codings = [c.strip().lower() for n, v in headers if n.lower() == "transfer-encoding"
               for c in v.split(",") if c.strip()]
    if codings:
        # The proxy sends vLLM no TE header, so chunked is the only transfer coding vLLM may
        # use (RFC 9110 §10.1.4). Any other would reach the client still applied to the body
        # yet undeclared, Transfer-Encoding being hop-by-hop: "gzip, chunked" as gzip bytes
        # under a JSON Content-Type. Decoding it would put an unbounded decompressor on the
        # hot path for what no vLLM sends, so it is refused (a 502), as Go's net/http does.
        if codings != ["chunked"]:
            raise ProtocolError(f"unsupported Transfer-Encoding: {', '.join(codings)[:80]!r} (only chunked is accepted)")
        return "chunked", 0
    if length is None:
        return "close", 0
    return "length", length


def may_retry(method: str, sent: bool, answered: bool) -> bool:
    """Whether a request that failed on a reused connection may go again on a fresh one (UpstreamError.stale, which
    Exchange.call's retry policy reads). Pure.

    Only if the server cannot have acted on it, because a chat completion must never be
    generated twice. A send that failed proves it: that write did not complete, so the
    server never had the whole request, and vLLM's handlers (FastAPI) parse the whole body
    before they act on it. Once the whole request was sent, an EOF or a reset before any
    answer is ambiguous: the server may have closed the idle connection before the request
    arrived, or read it, started generating and died. Only an idempotent request may take that
    chance (RFC 9112 §9.3.1). The idle limit and the readability check before reuse (_take)
    are what keep the first case rare, so a POST meets it only in a race of microseconds;
    it then is no stale connection but a call that failed before any answer, which the policy tries once more
    anyway, on a fresh connection: vLLM aborted the first attempt's sequence when its connection closed, so the
    client still sees one answer; behind vllm-router that retry is what carries a request past a worker lost mid-run.
    """
    if answered:
        return False  # the server began its answer: it had the request
    return not sent or method in IDEMPOTENT
