"""The Flask app: routes, the transparent relay, auth, request limits and the access log.

Built by create_app(config); proxy-passthrough.py reads the environment and serves it.
"""
from __future__ import annotations

import hmac
import logging
import socket
import time
import urllib.parse

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from . import alpha_search, chat, messages, metrics, responses
from .config import Config
from .errors import error_for_path, upstream_error_status
from .exchange import Exchange, response_headers
from .fetch import Fetcher
from .search import SearXNG
from .upstream import Backend, UpstreamError, end_to_end_headers

log = logging.getLogger("proxy")

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
# Paths a load balancer or compose healthcheck may probe without a key.
OPEN_PATHS = frozenset({"/health", "/proxy/health"})
# Client credentials are for the proxy; vLLM gets BACKEND_API_KEY or nothing in their place.
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key"})


class AccessLog:
    """WSGI wrapper: one log line per request, written when its body has been sent.

    Never logs prompt or completion text; handlers add the number of searches to the environ.
    """

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        started = time.monotonic()
        environ["proxy.searches"] = 0
        state = {"status": "-"}

        def sr(status, headers, exc_info=None):
            state["status"] = status.split(" ", 1)[0]
            return start_response(status, headers, exc_info)

        body = self.app(environ, sr)
        return _CountingIterable(body, lambda sent: log.info(
            "%s %s %s %.0fms searches=%d bytes=%d", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"),
            state["status"], (time.monotonic() - started) * 1000, environ["proxy.searches"], sent))


class WholePath:
    """WSGI wrapper: the path routed and guarded by the key is the whole path the client sent.

    The proxy is never mounted under a prefix, so a SCRIPT_NAME can only come from a server told to
    trust a client's header (gunicorn.conf.py tells gunicorn not to); folded back into PATH_INFO, it
    cannot make the key check read "/health" while the relay sends RAW_URI's "/metrics/health".
    """

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        script = environ.get("SCRIPT_NAME", "")
        if script:
            # WSGI paths are percent-decoded and latin-1 strings; gunicorn leaves SCRIPT_NAME encoded.
            environ["PATH_INFO"] = urllib.parse.unquote_to_bytes(script).decode("latin-1") + environ.get("PATH_INFO", "")
            environ["SCRIPT_NAME"] = ""
        return self.app(environ, start_response)


class _CountingIterable:
    def __init__(self, body, done):
        self._body = body
        self._done = done
        self._sent = 0

    def __iter__(self):
        for chunk in self._body:
            self._sent += len(chunk)
            yield chunk

    def close(self):
        try:
            if hasattr(self._body, "close"):
                self._body.close()
        finally:
            self._done(self._sent)


def outbound_headers(headers, cfg: Config) -> list[tuple[str, str]]:
    """The client's headers as vLLM should see them. Pure.

    Hop-by-hop and Host belong to the client's connection. Credentials: with BACKEND_API_KEY
    the proxy's own key replaces the client's; with PROXY_API_KEY the client's key was for
    the proxy and stays here; with neither the proxy is transparent and passes it on.
    """
    out = [(n, v) for n, v in end_to_end_headers(headers)
           if n.lower() not in ("host", "content-length")]
    if cfg.backend_api_key or cfg.proxy_api_keys:
        out = [(n, v) for n, v in out if n.lower() not in CREDENTIAL_HEADERS]
    if cfg.backend_api_key:
        out.append(("Authorization", f"Bearer {cfg.backend_api_key}"))
    return out


def presented_key(headers) -> str | None:
    """The key a client sent: `Authorization: Bearer K` (OpenAI) or `x-api-key: K` (Anthropic)."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key") or None


def key_ok(key: str | None, keys: tuple[str, ...]) -> bool:
    """Constant-time check against every configured key (no early exit on a match)."""
    if key is None:
        return False
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(key.encode(), k.encode())
    return ok


def create_app(cfg: Config) -> Flask:
    app = Flask("proxy")
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    backend = Backend(cfg.backend_url, cfg.connect_timeout, cfg.read_timeout, cfg.backend_api_key)
    searxng = SearXNG(cfg.searxng_url, cfg.searxng_results, cfg.searxng_timeout, cfg.searxng_max_bytes)
    fetcher = Fetcher(cfg)  # one per worker: its page cache is shared by that worker's requests
    searxng, fetcher = metrics.instrument(cfg, searxng, fetcher)  # the search cache; both metered

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(_e):
        return error_for_path(request.path, 413, f"Request body is larger than the proxy's limit of {cfg.max_body_bytes} bytes (MAX_BODY_BYTES).")

    @app.errorhandler(RecursionError)
    def nested_too_deeply(_e):
        # json.loads of `[[[[...` thousands deep raises this, not ValueError, in any handler
        # (chat, messages, responses); the proxy's own code does not recurse that deep.
        return error_for_path(request.path, 400, "Request body is not valid JSON: it is nested too deeply.")

    @app.errorhandler(HTTPException)
    def http_error(e):
        return error_for_path(request.path, e.code or 400, e.description or e.name)

    @app.before_request
    def check_key():
        if cfg.proxy_api_keys and request.path not in OPEN_PATHS:
            if not key_ok(presented_key(request.headers), cfg.proxy_api_keys):
                return error_for_path(request.path, 401, "Missing or invalid API key: send it as `Authorization: Bearer <key>` "
                                      "(or `x-api-key: <key>`) with a key from PROXY_API_KEY.", "authentication_error")
        return None

    @app.route("/proxy/health")
    def proxy_health():
        # The proxy's own liveness, independent of vLLM's four-minute boot.
        return Response('{"status":"ok"}', mimetype="application/json")

    def request_body() -> bytes:
        """The whole body, or RequestEntityTooLarge (413, too_large above): every route reads it here."""
        # get_data reads at most MAX_CONTENT_LENGTH bytes; a Content-Length over it raises 413.
        body = request.get_data(cache=False)
        if len(body) >= cfg.max_body_bytes and request.content_length is None:
            # A chunked body is cut at the limit without an error (Werkzeug 3.1's LimitedStream),
            # and the cut body went to vLLM as if whole: one byte more means it was too large.
            if request.environ["wsgi.input"].read(1):
                raise RequestEntityTooLarge()
        return body

    def exchange() -> Exchange:
        body = request_body()
        # RAW_URI keeps the client's exact path and query encoding (gunicorn sets it).
        raw = request.environ.get("RAW_URI")
        if not (raw and raw.startswith("/")):
            qs = request.environ.get("QUERY_STRING", "")
            raw = request.path + ("?" + qs if qs else "")
        ex = Exchange(cfg, backend, searxng, body, outbound_headers(request.headers.items(), cfg),
                      raw, request.environ, relay_with=relay, fetcher=fetcher)
        return ex

    @app.route("/v1/chat/completions", methods=["POST"])
    def chat_completions():
        return chat.handle(exchange())

    @app.route("/v1/messages", methods=["POST"])
    @app.route("/v1/messages/count_tokens", methods=["POST"])
    def anthropic_messages():
        return messages.handle(exchange())

    @app.route("/v1/responses", methods=["POST"])
    def openai_responses():
        return responses.handle(exchange())

    # Codex's standalone web search (supports_standalone_web_search); answered here, never by vLLM.
    # One per worker: its ref store, and the page cache it shares with every API.
    codex_search = alpha_search.AlphaSearch(cfg, searxng, fetcher)

    @app.route(alpha_search.PATH, methods=["POST"])
    def alpha_web_search():
        return codex_search.handle(request_body(), request.environ)

    @app.route("/", defaults={"path": ""}, methods=ALL_METHODS)
    @app.route("/<path:path>", methods=ALL_METHODS)
    def passthrough(path):
        return exchange().relay()

    app.wsgi_app = WholePath(AccessLog(app.wsgi_app))  # type: ignore[method-assign]  # Flask's documented way to add WSGI middleware
    metrics.install(app, cfg)  # GET /proxy/metrics, and the request metrics around everything
    return app


def relay(ex: Exchange, body: bytes) -> Response:
    """Send the request on unchanged and the answer back unchanged, streaming if it streams."""
    method = ex.environ["REQUEST_METHOD"]
    watch = ex.watch_client()
    send_body = body if body or method in ("POST", "PUT", "PATCH") else None
    try:
        call = ex.call(method, ex.target, send_body, ex.headers)
    except UpstreamError as e:
        watch.stop()
        if watch.gone:
            # Not vLLM's failure: the watch cut the connection for a client that left.
            return error_for_path(ex.target, 499, "client closed the request")
        return gateway_error(e, method, ex.target)
    up = call.response
    headers = response_headers(up)
    if up.header("content-length") and not up.is_event_stream:
        try:
            data = call.read()
        except UpstreamError as e:
            if watch.gone:
                return error_for_path(ex.target, 499, "client closed the request")
            return gateway_error(e, method, ex.target)
        finally:
            watch.stop()
        resp = Response(data, status=up.status, headers=headers)
        if method == "HEAD":
            # No body follows a HEAD answer, so vLLM's Content-Length (the GET's) is the one.
            resp.headers["Content-Length"] = str(up.content_length)
        return _without_default_type(resp, up)

    def stream():
        # Bytes go out exactly as they came in.
        try:
            yield from up.iter_raw()
        except UpstreamError as e:
            if watch.gone:
                return
            # The client must see a broken body, not a clean end that looks complete: cut
            # its connection before the final chunk (gunicorn then ignores the EPIPE quietly,
            # where a raised error would log a traceback for vLLM's failure).
            log.warning("%s %s: %s", method, ex.target.split("?", 1)[0], upstream_error_status(e)[1])
            client = ex.environ.get("gunicorn.socket")
            if client is None:
                raise
            client.shutdown(socket.SHUT_RDWR)
        finally:
            watch.stop()
            call.end()
    return _without_default_type(Response(stream(), status=up.status, headers=headers, direct_passthrough=True), up)


def _without_default_type(resp: Response, up) -> Response:
    """Flask gives every response a Content-Type; a relayed one has vLLM's or none at all."""
    if not up.header("content-type"):
        del resp.headers["Content-Type"]
    return resp


def gateway_error(e: UpstreamError, method: str, target: str) -> Response:
    status, msg = upstream_error_status(e)
    log.warning("%s %s: %s", method, target.split("?", 1)[0], msg)
    return error_for_path(target, status, msg)
