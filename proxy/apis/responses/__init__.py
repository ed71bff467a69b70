"""OpenAI's /v1/responses (Codex) with the hosted web_search tool played by the proxy."""
