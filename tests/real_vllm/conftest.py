"""Session fixtures for the real-vLLM tier (a `vllm serve` of the tiny model with docker-compose.yaml's flags); run with `tests/run.sh tests/real_vllm` after `tests/real_vllm/setup.sh`.

The server and the vLLM introspection that test_flags.py needs both take tens of seconds to
start, so both are launched as the session begins and run side by side.
"""
from __future__ import annotations

import pytest
from realvllm import (
    Http,
    RealVllm,
    RealVllmEnv,
    Tap,
    compose_config,
    locate_env,
    start_introspection,
    start_server,
    stop_server,
    wait_healthy,
)


@pytest.fixture(scope="session")
def real_vllm_env() -> RealVllmEnv:
    """What setup.sh built; fails, never skips, when it is missing."""
    return locate_env()


@pytest.fixture(scope="session")
def compose_vllm() -> dict:
    """The resolved compose document, read once per session."""
    return compose_config()


@pytest.fixture(scope="session")
def _vllm_process(real_vllm_env, compose_vllm):
    proc, server = start_server(real_vllm_env, compose_vllm)
    try:
        yield proc, server
    finally:
        stop_server(proc)


@pytest.fixture(scope="session")
def vllm_introspection(real_vllm_env, compose_vllm):
    """vLLM's own view of the compose flags and variables (see test_flags.py), computed in the
    background; `.result()` waits for it."""
    introspection = start_introspection(real_vllm_env, compose_vllm)
    yield introspection
    introspection.close()


@pytest.fixture(scope="session", autouse=True)
def _start_early(_vllm_process, vllm_introspection):
    """Launches the server and the introspection before the first test, so they overlap."""


@pytest.fixture(scope="session")
def real_vllm(_vllm_process) -> RealVllm:
    """The running server: .url (http://127.0.0.1:PORT), .log_path, .pid; stopped by pid at the end."""
    proc, server = _vllm_process
    wait_healthy(proc, server)
    return server


@pytest.fixture(scope="session")
def http_client() -> Http:
    return Http()


@pytest.fixture(scope="module")
def _tap(real_vllm):
    tap = Tap(real_vllm.url)
    yield tap
    tap.close()


@pytest.fixture
def tapped(_tap, start_proxy, searxng):
    """(proxy, tap) for a test: the recording pass-through emptied and unchanging; one tap per
    module, so start_proxy reuses one proxy for the module's tests."""
    _tap.exchanges.clear()
    _tap.outgoing = None
    return start_proxy(BACKEND_URL=_tap.url), _tap
