"""The container tier: the stack itself, built from our Dockerfile and started by our compose file with
`docker compose -f docker-compose.yaml -f tests/compose.cpu-test.yaml up -d --wait`, checked through its
published ports as a user would; run with `tests/run.sh tests/container`.

The session fixture `stack` finds or starts a Docker engine (engine.py), builds the stand-ins for the
images this machine cannot pull (images.py), puts the tiny model into MODEL_DIR under the checkpoint's
repo id by running download-model.sh against the Hub stand-in, brings the stack up, and at the end takes
it down with `down -v` and stops the engine it started.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compose_stack import stack_session  # noqa: E402,F401  (the `stack` fixture)
