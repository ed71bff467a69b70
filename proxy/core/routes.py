"""The proxy's routes in one table: each path the proxy answers itself and the API it belongs to (the metrics'
`api` label, by which proxy/apis/wires.py finds the wire its clients parse). proxy/http/app.py routes by it,
proxy/observe/metrics.py labels by it; pure, checked by tests/test_metrics.py and the error-shape tests.
"""
from __future__ import annotations

from dataclasses import dataclass

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
RESPONSES = "/v1/responses"
ALPHA_SEARCH = "/v1/alpha/search"
MCP = "/mcp"  # the web tools as an MCP server (streamable HTTP; proxy/apis/mcp/)
PROXY_HEALTH = "/proxy/health"
PROXY_METRICS = "/proxy/metrics"
PROXY_SEARCH_HEALTH = "/proxy/search/health"  # the search failover's state; behind PROXY_API_KEY like the metrics
PROXY_USAGE = "/proxy/usage"  # usage per key name and day (proxy/http/team.py); the admin key's alone
HEALTH = "/health"  # vLLM's, relayed; open like the proxy's own so a healthcheck needs no key


@dataclass(frozen=True)
class Route:
    path: str
    api: str                 # the metrics' `api` label, and its wire's (proxy/apis/wires.py)
    prefix: bool = False     # the path and everything under it
    generates: bool = True   # its POSTs are answered by the model: their answers are read for usage (http/flow.py)
    metered: bool = True     # its POSTs count against a key's quotas and usage (http/team.py)


ROUTES = (
    Route(CHAT, "chat"),
    Route(MESSAGES, "messages", prefix=True),  # count_tokens and any sub-path Anthropic adds
    Route(RESPONSES, "responses"),
    # Answered by the proxy's tools, not the model: metered (they search and read), no model usage to read.
    Route(ALPHA_SEARCH, "alpha_search", generates=False),
    Route(MCP, "mcp", generates=False),
    # Its own health and metrics: a scrape every few seconds is not traffic.
    Route("/proxy/", "proxy", prefix=True, generates=False, metered=False),
)
RELAY = Route("", "relay")  # every other path: vLLM's, relayed byte for byte
# Paths a load balancer or compose healthcheck may probe without a key.
OPEN_PATHS = frozenset({HEALTH, PROXY_HEALTH})


def route_of(path: str) -> Route:
    """The route a request path falls under. Pure."""
    for route in ROUTES:
        if path == route.path or (route.prefix and path.startswith(route.path)):
            return route
    return RELAY


def api_of(path: str) -> str:
    """The metrics' `api` label of a request path. Pure."""
    return route_of(path).api
