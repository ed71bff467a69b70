"""POST /v1/responses (OpenAI's Responses API, Codex): the hosted web_search tool run by the
proxy. Scaffold: relays unchanged until the hosted-tool loop lands.
"""
from __future__ import annotations

from flask import Response

from .exchange import Exchange


def handle(ex: Exchange) -> Response:
    return ex.relay()
