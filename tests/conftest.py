"""Shared fixtures: the stand-in vLLM and SearXNG on loopback, and the real proxy under real
gunicorn with the shipped gunicorn.conf.py (standins/proxy_process.py). Run the suite with tests/run.sh.

`start_proxy(**env)` gives a proxy whose BACKEND_URL and SEARXNG_URL point at the stand-ins
(override either through env); proxies are reused across tests with the same settings.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from standins.brave import BraveStandIn
from standins.proxy_process import ProxyProcess
from standins.scripted_backend import ScriptedBackend
from standins.searxng import SearxngStandIn
from standins.web_pages import WebSite

# The tiers that need more than the test venv (pyproject.toml's markers). tests/run.sh collects a
# narrowed selection first with CODING_STACK_TIERS_OUT set, and installs only the tiers that file
# names: one line per selected test, its node id, a tab, and its tiers (comma-separated, maybe none).
TIERS = ("real_vllm", "agents", "container", "redis")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """Under `-n N` (pytest-xdist, --dist loadgroup from pyproject.toml), each heavy tier's tests run
    on one worker: their session fixtures (a vLLM server, the compose stack) must be started once.
    A module's tests that use the shared proxies stay on one worker too: its proxies (a gunicorn
    each, most of a second of CPU to start) then start once, not once on every worker its tests
    were spread over. The rest (scripts, pure functions) go wherever a worker is free."""
    for item in items:
        if item.get_closest_marker("container"):
            item.add_marker(pytest.mark.xdist_group("container"))
        elif item.get_closest_marker("real_vllm"):
            item.add_marker(pytest.mark.xdist_group("real_vllm"))
        elif "_proxies" in item.fixturenames and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def pytest_collection_finish(session):
    out = os.environ.get("CODING_STACK_TIERS_OUT")
    if out:
        lines = (f"{item.nodeid}\t{','.join(m for m in TIERS if item.get_closest_marker(m))}\n" for item in session.items)
        Path(out).write_text("".join(lines))


# Each run (each -n worker) logs its proxies into a folder of its own, so two runs on one checkout never share
# a log file; the folder is removed when its run passed, and kept to read when a test failed.
WORK = Path(__file__).resolve().parent / ".work" / f"run-{os.getpid()}"


@pytest.fixture(scope="session")
def _backend_server():
    server = ScriptedBackend()
    yield server
    server.close()


@pytest.fixture(scope="session")
def _searxng_server():
    server = SearxngStandIn()
    yield server
    server.close()


@pytest.fixture
def backend(_backend_server):
    """The scripted vLLM stand-in, emptied for each test."""
    _backend_server.reset()
    yield _backend_server
    _backend_server.reset()


@pytest.fixture
def searxng(_searxng_server):
    """The SearXNG stand-in, back to default results for each test."""
    _searxng_server.reset()
    yield _searxng_server
    _searxng_server.reset()


@pytest.fixture(scope="session")
def _proxies(request, _backend_server, _searxng_server):
    WORK.mkdir(parents=True, exist_ok=True)
    running: dict[tuple, ProxyProcess] = {}

    def start(**env) -> ProxyProcess:
        # The search cache is off unless a test turns it on: a proxy serves many tests, which change what the
        # SearXNG stand-in answers to the same query, and a cached answer would carry over from one to the next.
        env = {"BACKEND_URL": _backend_server.url, "SEARXNG_URL": _searxng_server.url, "SEARCH_CACHE_TTL": "0",
               **{k: str(v) for k, v in env.items()}}
        key = tuple(sorted(env.items()))
        if key not in running or running[key].proc.poll() is not None:
            running[key] = ProxyProcess(env, WORK / f"proxy-{len(running)}.log")
        return running[key]

    yield start
    # All at once: each takes a second or two to exit, and a run starts dozens.
    for p in running.values():
        p.ask_to_stop()
    for p in running.values():
        p.wait_stopped()
    if request.session.testsfailed == 0:
        shutil.rmtree(WORK, ignore_errors=True)


@pytest.fixture
def start_proxy(_proxies, backend, searxng):
    """start_proxy(**env) -> ProxyProcess; the stand-ins are reset for the test."""
    return _proxies


@pytest.fixture
def proxy(start_proxy):
    """The proxy with its default settings, pointed at the stand-ins."""
    return start_proxy(KEEPALIVE_INTERVAL="0.2")


@pytest.fixture(scope="session")
def _site():
    site = WebSite()
    yield site
    site.close()


@pytest.fixture
def site(_site):
    """A web site on loopback for web_fetch (standins/web_pages.py), emptied for each test.
    Proxies reach it only with WEB_FETCH_ALLOWED_NETWORKS=127.0.0.0/8 (loopback is refused by default)."""
    _site.reset()
    yield _site
    _site.reset()


@pytest.fixture(scope="session")
def _brave():
    with BraveStandIn() as server:
        yield server


@pytest.fixture
def brave(_brave):
    """The Brave Search API stand-in (standins/brave.py), answering with results and its requests forgotten."""
    _brave.requests.clear()
    _brave.behave("results")
    yield _brave
