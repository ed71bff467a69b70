"""The proxy's HTTP clients, each raising errors of its own: the keep-alive client to vLLM (vllm.py) with HTTP/1.1's rules (http1.py), and the one client for SearXNG and web pages (webclient.py)."""
