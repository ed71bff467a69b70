"""Anthropic's /v1/messages (Claude Code) with the web_search and web_fetch server tools played by the proxy."""
