"""The test harness that tests/ and scripts/ share: stand-ins for what the proxy talks to (vLLM, SearXNG, web sites,
the Hugging Face Hub), vLLM's wire formats, and the launcher of the real proxy (proxy_process.py); import it as
`standins.x`.

It sits at the repository root, beside proxy/, so that one name reaches it from everywhere without editing sys.path:
pytest puts the root on the path (pyproject.toml's `pythonpath`), and the scripts run as modules from the root
(`python -m scripts.load_test`), which puts the root first on the path as well. Under tests/ the scripts could only
reach it through a sys.path edit, and a module imported under two names would be two modules with two Reply classes.
Nothing here is shipped: .dockerignore's allow-list keeps it out of every image.
"""
