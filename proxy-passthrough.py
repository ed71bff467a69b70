"""OpenAI- and Anthropic-compatible proxy in front of vLLM that gives every client a working web_search.

Run: `python proxy-passthrough.py` for development (Flask's server on PROXY_BIND), or, as the
container does, `gunicorn --config gunicorn.conf.py proxy-passthrough:app`. The code lives in
the package proxy/ beside this file; the environment is read here, once, by Config.from_env.
"""
import logging
import os
import sys

from proxy.core.config import Config
from proxy.http.app import create_app

try:
    CONFIG = Config.from_env(os.environ)
except ValueError as e:  # Config checks every value once, and its message names the variable
    # One line naming the variable, not a traceback: gunicorn prints it and the container exits non-zero.
    sys.exit(f"proxy-passthrough.py: {e}")

logging.basicConfig(level=CONFIG.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

app = create_app(CONFIG)

if __name__ == "__main__":
    host, _, port = CONFIG.bind.rpartition(":")
    app.run(host=host or "0.0.0.0", port=int(port), threaded=True)
