"""OpenAI's /v1/chat/completions with the proxy's web_search and web_fetch injected."""
