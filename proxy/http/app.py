"""The Flask app (create_app): the route table's routes, each building the request's Exchange (the body read once
within MAX_BODY_BYTES, the headers vLLM gets, the X-Session-ID) for its API's handler, and the relay
(Exchange.relay, proxy/engine/relay.py) for every other path; the proxy's own routes; and the guards before
every route: the key check and quotas (http/team.py), and the proxy's errors in each path's API shape (the wire the
request's flow holds). The worker's services come from http/wiring.py; each request's Flow, the timing, the access
log and RequestEnded are http/flow.py's RequestFlow, wrapped around the app here.

Built by create_app(config); proxy-passthrough.py reads the environment and serves it.
"""
from __future__ import annotations

import logging
import time
import urllib.parse

from flask import Flask, Response, request
from gunicorn.http.errors import NoMoreData, ParseException
from werkzeug.exceptions import BadRequest, HTTPException, RequestEntityTooLarge

from proxy.apis.alpha_search import handler as alpha_search
from proxy.apis.chat import handler as chat
from proxy.apis.messages import handler as messages
from proxy.apis.responses import handler as responses
from proxy.backends.state.keys import ADMIN
from proxy.core import codec, routes
from proxy.core.config import Config
from proxy.core.errors import error_response
from proxy.engine.exchange import Exchange
from proxy.engine.flow import flow_of
from proxy.engine.services import Services
from proxy.http import affinity
from proxy.http.flow import RequestFlow
from proxy.http.mcp_bridge import McpBridge
from proxy.http.team import Team
from proxy.http.wiring import build_services, build_store, observe_team
from proxy.observe import metrics
from proxy.transport.http1 import end_to_end_headers

log = logging.getLogger("proxy")

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
# Client credentials are for the proxy; vLLM gets BACKEND_API_KEY or nothing in their place.
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key"})


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


def outbound_headers(headers, cfg: Config, guarded: bool | None = None) -> list[tuple[str, str]]:
    """The client's headers as vLLM should see them. Pure.

    Hop-by-hop and Host belong to the client's connection. Credentials: with BACKEND_API_KEY
    the proxy's own key replaces the client's; with PROXY_API_KEY the client's key was for
    the proxy and stays here (`guarded`: a keys file's too, once it exists); with neither the
    proxy is transparent and passes it on.
    """
    out = [(n, v) for n, v in end_to_end_headers(headers)
           if n.lower() not in ("host", "content-length")]
    if cfg.backend_api_key or (bool(cfg.proxy_api_keys) if guarded is None else guarded):
        out = [(n, v) for n, v in out if n.lower() not in CREDENTIAL_HEADERS]
    if cfg.backend_api_key:
        out.append(("Authorization", f"Bearer {cfg.backend_api_key}"))
    return out


def create_app(cfg: Config) -> Flask:
    """The proxy as a Flask app for `cfg`: its own routes, each API's, and the relay for everything else."""
    app = Flask("proxy")
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    services = build_services(cfg)  # one per worker, shared by its requests
    team = Team(cfg, services.queue.store if services.queue is not None else build_store(cfg))
    _install_guards(app, cfg, team)
    _install_own_routes(app, services, team)
    session_secret = affinity.Secret(cfg.session_id_secret, services.state)

    def exchange() -> Exchange:
        body = request_body(cfg)
        decoded = flow_of(request.environ).body = codec.Decoded(body)  # the session key's and the handler's
        headers = outbound_headers(request.headers.items(), cfg, team.guarded)
        # Every request to vLLM (the relay's and each turn of the search loop, which reuse these headers) names its
        # session, so a router in front of several workers keeps the session on one (compose.scale.yaml).
        key = affinity.session_key(request.headers.items(), decoded, session_secret())
        headers = [(n, v) for n, v in headers if n.lower() != "x-session-id"] + [(affinity.HEADER, key)]
        return Exchange(services, body, headers, raw_target(), request.environ)

    @app.route(routes.CHAT, methods=["POST"])
    def chat_completions():
        return chat.handle(exchange())

    @app.route(routes.MESSAGES, methods=["POST"])
    @app.route(routes.COUNT_TOKENS, methods=["POST"])
    def anthropic_messages():
        return messages.handle(exchange())

    @app.route(routes.RESPONSES, methods=["POST"])
    def openai_responses():
        return responses.handle(exchange())

    # Codex's standalone web search (supports_standalone_web_search); answered here, never by vLLM.
    # One per worker: its ref store, and the page cache it shares with every API.
    codex_search = alpha_search.AlphaSearch(services)

    @app.route(routes.ALPHA_SEARCH, methods=["POST"])
    def alpha_web_search():
        return codex_search.handle(request_body(cfg), request.environ)

    # The web tools as an MCP server (streamable HTTP), after the key check like every route.
    mcp = McpBridge(services, cfg)

    @app.route(routes.MCP, methods=["GET", "POST", "DELETE"])
    def mcp_server():
        return mcp(request.environ, request.headers.get("Origin"))

    @app.route("/", defaults={"path": ""}, methods=ALL_METHODS)
    @app.route("/<path:path>", methods=ALL_METHODS)
    def passthrough(path):
        return exchange().relay()

    metrics.install(app, cfg)  # GET /proxy/metrics
    observe_team(services.events, team)
    # Flask's documented way to add WSGI middleware; RequestFlow around the whole app, so its times are the whole
    # request's, inside WholePath, so the flow's path is the whole path.
    app.wsgi_app = WholePath(RequestFlow(app.wsgi_app, services.events))  # type: ignore[method-assign]
    return app


def _install_own_routes(app: Flask, services: Services, team: Team) -> None:
    """The proxy's own answers: its liveness, the search failover's health, a team's usage."""

    @app.route(routes.PROXY_HEALTH)
    def proxy_health():
        # The proxy's own liveness, independent of vLLM's four-minute boot.
        return Response('{"status":"ok"}', mimetype="application/json")

    @app.route(routes.PROXY_SEARCH_HEALTH)
    def search_health():
        # Which SearXNG instances are up and which engines fail, in this worker (docs/web-tools.md, "When engines are blocked").
        return Response(codec.dumps(services.search_health()), mimetype="application/json")

    @app.route(routes.PROXY_USAGE)
    def usage():
        # Per key name and UTC day (docs/operations.md, "Sharing the stack"); people's keys may not read each other's figures.
        if team.keys is not None and flow_of(request.environ).key_name != ADMIN:
            return error_response(403, "GET /proxy/usage needs the admin key (PROXY_API_KEY).", "permission_error")
        return team.usage()


def _install_guards(app: Flask, cfg: Config, team: Team) -> None:
    """The key check before every route, and the proxy's own errors in each path's API shape."""

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(_e):
        return _wire().error(413, f"Request body is larger than the proxy's limit of {cfg.max_body_bytes} bytes (MAX_BODY_BYTES).")

    @app.errorhandler(RecursionError)
    def nested_too_deeply(_e):
        # json.loads of `[[[[...` thousands deep raises this, not ValueError, in any handler
        # (chat, messages, responses); the proxy's own code does not recurse that deep.
        return _wire().error(400, "Request body is not valid JSON: it is nested too deeply.")

    @app.errorhandler(HTTPException)
    def http_error(e):
        return _wire().error(e.code or 400, e.description or e.name)

    @app.before_request
    def check_key():
        # Whose key (PROXY_API_KEY's, or a person's in PROXY_KEYS_FILE), and within its quotas (proxy/http/team.py).
        return team.check(flow_of(request.environ), request.headers, time.time())


def _wire():
    """The current request's wire (its route's error shape), from its flow."""
    return flow_of(request.environ).wire


def request_body(cfg: Config) -> bytes:
    """The whole body of the current request, or RequestEntityTooLarge (a 413): every route reads it here."""
    try:
        length = request.content_length
        if length is not None:
            body = _read_length(request.environ["wsgi.input"], length, cfg.max_body_bytes)
        else:
            # get_data reads at most MAX_CONTENT_LENGTH bytes of a chunked body.
            body = request.get_data(cache=False)
            if len(body) >= cfg.max_body_bytes:
                # A chunked body is cut at the limit without an error (Werkzeug 3.1's LimitedStream),
                # and the cut body went to vLLM as if whole: one byte more means it was too large.
                if request.environ["wsgi.input"].read(1):
                    raise RequestEntityTooLarge()
    except (ParseException, NoMoreData) as e:
        # gunicorn parses the body as it is read, so a bad chunk size or a body cut short raises here, in the app: the
        # client's framing, a 400 (gunicorn closes the connection after it, since where the next request starts is
        # unknown), never a 500 with a traceback.
        raise BadRequest(f"The request body could not be read: {e}.") from None
    flow_of(request.environ).body_bytes = len(body)  # a stream whose usage never comes is charged its prompt by it
    return body


def _read_length(stream, length: int, limit: int) -> bytes:
    """A body of known length in one read. Werkzeug's get_data reads 64 KiB at a time, and gunicorn's reader copies
    what it holds of the rest on every such read: at 1 MB that was 16 copies of a shrinking megabyte, about a
    millisecond of a relayed request's CPU (docs/performance.md). A Content-Length over the limit is a 413 before a
    byte is read, as Werkzeug's; a body that ends short of it is the client's framing, a 400."""
    if length > limit:
        raise RequestEntityTooLarge()
    body = stream.read(length) if length else b""
    if len(body) != length:
        raise BadRequest(f"The request body could not be read: it ended after {len(body)} of the {length} bytes "
                         "its Content-Length announced.")
    return body


def raw_target() -> str:
    """The current request's path and query as the client wrote them (gunicorn's RAW_URI keeps the exact
    encoding), so the relay sends vLLM what the client sent."""
    raw = request.environ.get("RAW_URI")
    if raw and raw.startswith("/"):
        return raw
    qs = request.environ.get("QUERY_STRING", "")
    return request.path + ("?" + qs if qs else "")
