"""Codex's standalone POST /v1/alpha/search, answered by the proxy alone."""
