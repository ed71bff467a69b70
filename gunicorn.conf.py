"""gunicorn settings for the proxy, used by the container and the tests alike.

Run: gunicorn --config gunicorn.conf.py proxy-passthrough:app

Every setting comes from Config (proxy/core/config.py), read here once in the master with the same readers,
defaults and checks as the app's: a bad PROXY_WORKERS stops gunicorn with the one line naming it.
"""
import os
import shutil
import sys
import tempfile

# gunicorn puts its --chdir (the working directory) on sys.path before it loads this file, as the app needs too.
from proxy.core.config import Config

try:
    CONFIG = Config.from_env(os.environ)
except ValueError as e:  # as proxy-passthrough.py: one line naming the variable, not a traceback
    sys.exit(f"gunicorn.conf.py: {e}")

bind = CONFIG.bind
# An evented worker: every open stream is a cheap greenlet, not a thread, so 64 agents
# streaming at once never queue behind a fixed thread count (gthread's ceiling).
worker_class = "gevent"
workers = CONFIG.workers
worker_connections = CONFIG.worker_connections
# The gevent worker heartbeats from its own greenlet, so this only kills a worker that is
# truly stuck; a 10-minute generation keeps yielding and is never cut off
# (tests/test_relay.py runs generations several times longer than this timeout).
timeout = CONFIG.worker_timeout
graceful_timeout = 30
keepalive = 75
accesslog = None  # the proxy logs one line per request itself
loglevel = CONFIG.log_level.lower()
# gunicorn 27's runtime control socket sits at a fixed path under $HOME; the proxy needs no
# remote control, and two proxies on one host (or in the tests) would fight over the path.
control_socket_disable = True
# Nothing in front of the proxy is trusted to rewrite a request. gunicorn's default trusts loopback,
# and every client of a one-host stack is on loopback: its `SCRIPT_NAME: /metrics` header split the
# path, so the key was checked on one path and vLLM sent another. With no trusted address, SCRIPT_NAME
# and PATH_INFO headers are dropped and X-Forwarded-Proto and friends leave the scheme alone; the
# lists are emptied too, so widening the trust (FORWARDED_ALLOW_IPS) still maps none of them.
forwarded_allow_ips = ""
forwarder_headers = ""
secure_scheme_headers: dict = {}

# Several workers each keep their own metrics; without a shared folder every scrape would show the one worker
# that answered it (four searches read as 4, 4, 0). The image sets PROMETHEUS_MULTIPROC_DIR; anywhere else this
# run makes a private one, here in the master before any worker imports prometheus_client, and removes it at exit.
# It must go through the environment, not Config: prometheus_client picks its storage from the variable at import,
# in each worker after the fork. Empty means unset: prometheus_client would take "" as a folder.
metrics_dir = CONFIG.metrics_dir
private_metrics_dir = ""
if not metrics_dir:
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if workers > 1:
        metrics_dir = private_metrics_dir = tempfile.mkdtemp(prefix="proxy-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir

# The X-Session-ID key (proxy/http/affinity.py): each worker imports the app after the fork and builds its own
# Config from the environment, so a key made here in the master must travel through the environment to be the same
# in every worker. Several workers with several keys would give one session's turns different ids, and a router
# would scatter them over its vLLM workers. With STATE_URL the workers, and the replicas on other hosts, take one
# key from the shared store instead (proxy/http/affinity.py).
if not CONFIG.session_id_secret and not CONFIG.state_url:
    import secrets
    os.environ["SESSION_ID_SECRET"] = secrets.token_hex(32)


def when_ready(server):
    # Small SSE events must leave at once: with Nagle's algorithm a second small write waits
    # for the first one's ACK. Accepted sockets inherit TCP_NODELAY from the listener on Linux.
    import socket
    for listener in server.LISTENERS:
        if listener.sock.family in (socket.AF_INET, socket.AF_INET6):
            listener.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def post_fork(server, worker):
    # Each response's head leaves with its first body bytes: one client wake-up, not two,
    # before a streamed answer's first event (proxy/http/gunicorn_response.py has the figures).
    from proxy.http.gunicorn_response import install
    install()
    # gunicorn's own errors (a request it cannot parse) as JSON in the route's shape, not its HTML page.
    from proxy.http import gunicorn_errors
    gunicorn_errors.install()


def post_worker_init(worker):
    # What the worker has loaded by now (Flask, gevent, lxml, the proxy's modules and tables) lives as long as it does.
    # Frozen, it is left out of the garbage collector's full passes, which the tens of thousands of objects a long
    # history decodes into set off: without it each such pass walked the whole worker (docs/performance.md, "A body
    # read in one call").
    import gc
    gc.freeze()


def on_starting(server):
    if private_metrics_dir:
        server.log.info("metrics: %d workers and no PROMETHEUS_MULTIPROC_DIR: they sum their metrics through %s, "
                        "removed at exit", workers, private_metrics_dir)


def on_exit(server):
    if private_metrics_dir:
        shutil.rmtree(private_metrics_dir, ignore_errors=True)


def child_exit(server, worker):
    # A dead worker's live gauges leave /proxy/metrics' sums (its counters stay in them): proxy/observe/metrics.py.
    if metrics_dir:
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(worker.pid)
