"""The stack as users run it (tests/container/conftest.py brings it up): health, the search round trip on all
three APIs, the coding agents, and the container contract; run with `tests/run.sh tests/container`.

Tests run in file order against one stack; the ones that kill a container come last.
"""
from __future__ import annotations

from conftest import UP_TIMEOUT_S, get


def test_every_service_is_healthy_within_the_bound(stack):
    assert stack.up_seconds < UP_TIMEOUT_S
    for name in ("coding-stack-vllm", "coding-stack-proxy", "coding-stack-searxng"):
        assert stack.inspect(name)["State"]["Health"]["Status"] == "healthy", name
    assert get(stack.proxy_url + "/proxy/health")[0] == 200
    assert get(stack.vllm_url + "/health")[0] == 200
