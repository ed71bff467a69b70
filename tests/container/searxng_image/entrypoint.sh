#!/bin/sh
# The SearXNG stand-in image's entrypoint (at the real image's path, /usr/local/searxng/entrypoint.sh):
# starts the stand-in server on 8080. Built into the image by tests/container/images.py.
set -eu
exec python3 /usr/local/searxng/server.py
