"""Each route's wire (proxy/core/errors.py's Wire): the one each API's package declares, bound here to its route by
its api label; every path no API claims (the relay's, the proxy's own) speaks vLLM's shape. The WSGI edge puts the
request's wire in its flow (proxy/http/flow.py), so the engine and the key check ask the wire, never the path; a
new API is its package's wire.py and one entry here. Pure, not run on its own.
"""
from __future__ import annotations

from proxy.apis.alpha_search import wire as alpha_search
from proxy.apis.chat import wire as chat
from proxy.apis.mcp import wire as mcp
from proxy.apis.messages import wire as messages
from proxy.apis.responses import wire as responses
from proxy.core import routes
from proxy.core.errors import Wire

RELAY = Wire("relay")  # vLLM's own paths and the proxy's: OpenAI's shape, as vLLM writes it
WIRES = {w.api: w for w in (chat.WIRE, messages.WIRE, responses.WIRE, alpha_search.WIRE, mcp.WIRE)}


def wire_of(route: routes.Route) -> Wire:
    """The wire of a route. Pure."""
    return WIRES.get(route.api, RELAY)
