"""One client request on its way through the proxy: what the search loops need to talk to
vLLM on the client's behalf, and to notice when the client has gone.

Used by proxy.app and the per-API loops; not run on its own.
"""
from __future__ import annotations

import logging
import select
import socket
import threading
from dataclasses import dataclass, field
from typing import Callable

from . import jsonio
from .config import Config
from .search import SearXNG, SearchSession
from flask import Response

from .errors import error_response, upstream_error_status
from .upstream import Backend, UpstreamError, UpstreamResponse, end_to_end_headers

log = logging.getLogger("proxy")

try:  # gunicorn's gevent worker patches the socket module before it loads the app
    import gevent
    from gevent import monkey
    _GEVENT = monkey.is_module_patched("socket")
except ImportError:  # the development server (python proxy-passthrough.py) has plain threads
    _GEVENT = False


class ClientWatch:
    """Notices a client that hangs up while the proxy waits on vLLM, and aborts vLLM's work.

    WSGI has no disconnect signal, so the proxy watches the client socket for readability:
    a peek that returns b"" means the client closed. Anything else (a pipelined request)
    ends the watch without consuming a byte. Under gunicorn's gevent worker (the shipped
    one) the watch is a bare event-loop callback; under its thread-based workers, a thread
    polling select(). Flask's development server gives no socket, so nothing is watched.
    """

    def __init__(self, environ):
        self._sock = environ.get("gunicorn.socket")
        self._aborts = []
        self._stop = threading.Event()
        self.gone = False
        self._io = None
        if self._sock is None:
            return
        # Peek through the OS socket, never gevent's wrapper: a gevent recv that finds nothing
        # parks on the socket's single read event, the one gunicorn waits on for the client's
        # next keep-alive request, and the two waiters collide (ConcurrentObjectUseError, a
        # 500 for that next request; scripts/load_test.py found it). MSG_DONTWAIT never parks.
        self._raw = getattr(self._sock, "_sock", self._sock)
        if _GEVENT:
            # A read watcher of its own on the loop: no greenlet to spawn, switch to and kill
            # per request (a spawned watcher cost every request a hub round trip).
            self._io = gevent.get_hub().loop.io(self._raw.fileno(), 1, ref=False)
            self._io.start(self._check)
        else:
            threading.Thread(target=self._poll, daemon=True, name="client-watch").start()

    def _check(self) -> bool:
        """The socket turned readable: True when the watch is over (client gone or not)."""
        if self._stop.is_set():
            return True  # the request is over: what arrived is the client's next request
        try:
            data = self._raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # nothing there after all (gunicorn read it first)
        except (OSError, ValueError):
            data = b""
        if data:
            self._end()
            return True
        self.gone = True
        self._end()
        log.info("client went away; aborting the backend request")
        for abort in list(self._aborts):
            abort()
        return True

    def _poll(self):
        while not self._stop.is_set():
            try:
                readable, _, _ = select.select([self._raw], [], [], 0.5)
            except (OSError, ValueError):
                readable = True
            if readable and self._check():
                return

    def attach(self, abort):
        """Register something to abort; aborts it at once if the client already left."""
        self._aborts.append(abort)
        if self.gone:
            abort()

    def _end(self):
        if self._io is not None:
            self._io.stop()  # may run inside the watcher's own callback: stop, don't close
            self._io = None

    def stop(self):
        self._stop.set()
        self._end()


@dataclass
class Exchange:
    cfg: Config
    backend: Backend
    searxng: SearXNG
    body: bytes                      # the client's body, as sent
    headers: list                    # the client's headers as vLLM should see them
    target: str                      # path and query string, as sent
    environ: dict
    relay: Callable                  # relay(body_bytes) -> Response: the transparent path
    watch: ClientWatch = field(default=None)
    last: UpstreamResponse | None = field(default=None, repr=False)  # the latest turn's response

    def session(self) -> SearchSession:
        def count(n):
            self.environ["proxy.searches"] = self.environ.get("proxy.searches", 0) + n
        return SearchSession(self.searxng, self.cfg.max_search_iter, on_search=count)

    def post(self, path: str, payload: dict) -> UpstreamResponse:
        """POST a JSON body to vLLM for one turn of a loop; the watch can abort it."""
        body = encode_json(payload)
        headers = [(n, v) for n, v in self.headers if n.lower() != "content-type"]
        headers.append(("Content-Type", "application/json"))
        # Asking for the next turn means the last one is over. A stream loop stops reading a
        # turn at [DONE] and used to drop it unclosed, so its connection stayed open to vLLM
        # until garbage collection (scripts/load_test.py: twice the clients' connections left
        # open). Aborting here covers every loop; a turn read to its end is left in the pool.
        if self.last is not None:
            self.last.abort()
        self.last = self.backend.request("POST", path, body, headers, on_open=self._attach)
        return self.last

    def _attach(self, conn):
        if self.watch is not None:
            self.watch.attach(lambda: shutdown(conn))


def encode_json(obj) -> bytes:
    """JSON bytes for vLLM: compact UTF-8, lone surrogates kept as the client's escapes."""
    return jsonio.dumps(obj)


def shutdown(conn):
    """Cut a backend connection from any greenlet; a reader blocked on it wakes with an error."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: the abort has nothing left to do


def response_headers(up: UpstreamResponse) -> list:
    """vLLM's response headers as the client should get them: end to end only, and no
    Content-Length, which whoever writes the body next computes."""
    return [(n, v) for n, v in end_to_end_headers(up.headers) if n.lower() != "content-length"]


def start_stream(ex: Exchange, path: str, payload: dict, error=error_response, translate=None):
    """Open the first turn of a streamed search loop, watching the client meanwhile.

    Returns (upstream, None) when vLLM streams, or (None, response) to send as it is: a
    gateway error (shaped by `error`), or vLLM's own non-streamed answer, its errors
    re-shaped by `translate(status, raw)` when the API's clients expect another shape.
    """
    ex.watch = ClientWatch(ex.environ)
    try:
        up = ex.post(path, payload)
    except UpstreamError as e:
        ex.watch.stop()
        status, msg = upstream_error_status(e)
        log.warning("%s stream: %s", path.split("?", 1)[0], msg)
        return None, error(status, msg)
    if up.status == 200 and up.is_event_stream:
        return up, None
    try:
        raw = up.read()
    except UpstreamError as e:
        status, msg = upstream_error_status(e)
        return None, error(status, msg)
    finally:
        ex.watch.stop()
    if up.status != 200 and translate is not None:
        return None, Response(translate(up.status, raw), status=up.status, mimetype="application/json")
    return None, Response(raw, status=up.status, headers=response_headers(up))


def ask(ex: Exchange, path: str, payload: dict, what: str, error=error_response, translate=None):
    """One whole non-streamed turn of a search loop: (upstream, raw body, parsed dict), or a
    Response to send as it is: the client left (499), a gateway error, vLLM's own error
    (re-shaped by `translate(status, raw)` if given), or a 200 that is not a JSON object
    (vLLM's fault, so 502, never a 500 from the proxy)."""
    try:
        up = ex.post(path, payload)
        raw = up.read()
    except UpstreamError as e:
        if ex.watch is not None and ex.watch.gone:
            return error(499, "client closed the request")
        status, msg = upstream_error_status(e)
        log.warning("%s: %s", what, msg)
        return error(status, msg)
    if up.status != 200:
        # vLLM's own error, on any turn: the client reads it as vLLM wrote it.
        if translate is not None:
            return Response(translate(up.status, raw), status=up.status, mimetype="application/json")
        return Response(raw, status=up.status, headers=response_headers(up))
    try:
        data = jsonio.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        log.warning("%s: vLLM answered 200 with a body that is not a JSON object", what)
        return error(502, "vLLM answered 200 with a body that is not a JSON object.")
    return up, raw, data
