"""The web tools as an MCP server at /mcp (streamable HTTP), answered by the proxy alone."""
