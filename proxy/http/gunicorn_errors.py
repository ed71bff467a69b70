"""gunicorn's own error answers in the route's API shape: JSON, never its HTML page. Installed by gunicorn.conf.py in
every worker (post_fork); not run on its own (tests: tests/run.sh tests/test_client_errors.py).

gunicorn answers what it cannot parse before the app sees a request (a request line over 4094 bytes, a header over
8190, a control character in a header, `Content-Length: -1`, a bad chunk between requests) with
`Worker.handle_error`, which writes an HTML page through `gunicorn.util.write_error`. Both are wrapped here:
handle_error notes the request's path while it runs (a context variable: each gevent greenlet has its own), and
write_error writes that path's error shape, Anthropic's under /v1/messages, OpenAI's elsewhere, with gunicorn's
status and message. Where gunicorn never read a path (the request line itself is broken or too long) the shape is
OpenAI's. A transfer coding gunicorn does not support is answered 400 rather than its 501: the client's request is
what is wrong (docs/apis.md, "Errors on every route").
"""
from __future__ import annotations

from contextvars import ContextVar

from gunicorn import util
from gunicorn.http.message import Request
from gunicorn.workers import base

from proxy.apis.wires import wire_of
from proxy.core import routes

_path: ContextVar[str] = ContextVar("gunicorn_error_path", default="")
_original_handle_error = base.Worker.handle_error


def request_path(req, exc: BaseException) -> str:
    """The path of the request gunicorn failed on, or "" when it never read one. A header gunicorn refuses while
    building its Request (too large, too many) leaves that Request only in the traceback's frames."""
    for found in (req, getattr(exc, "req", None)):
        path = getattr(found, "path", None)
        if isinstance(path, str):
            return path
    tb = exc.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, Request) and isinstance(getattr(candidate, "path", None), str):
            return candidate.path
        tb = tb.tb_next
    return ""


def handle_error(self, req, client, addr, exc):
    token = _path.set(request_path(req, exc))
    try:
        _original_handle_error(self, req, client, addr, exc)
    finally:
        _path.reset(token)


def error_response(path: str, status: int, reason: str, message: str) -> bytes:
    """The whole HTTP answer gunicorn sends for its own error, as JSON in the path's shape. Pure."""
    if status == 501:  # Transfer-Encoding gunicorn does not implement: the client's request, not the server
        status, reason = 400, "Bad Request"
    body = wire_of(routes.route_of(path)).error_bytes(status, message or reason)
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


def write_error(sock, status_int, reason, mesg):
    util.write_nonblock(sock, error_response(_path.get(), status_int, reason, mesg))


def install():
    """Make every worker answer gunicorn's own errors as JSON (base.Worker.handle_error calls util.write_error)."""
    base.Worker.handle_error = handle_error
    util.write_error = write_error
