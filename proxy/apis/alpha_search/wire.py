"""Codex's alpha search's wire: OpenAI's shape, the one Codex parses (proxy/core/errors.py's Wire as it is).
proxy/apis/wires.py binds it to the route; not run on its own.
"""
from proxy.core.errors import Wire

WIRE = Wire("alpha_search")
