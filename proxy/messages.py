"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's API, Claude Code): web search
as a server tool. Scaffold: relays unchanged until the server-tool loop lands.
"""
from __future__ import annotations

from flask import Response

from .exchange import Exchange


def handle(ex: Exchange) -> Response:
    return ex.relay()
