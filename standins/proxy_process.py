"""The one launcher of the real proxy for tests and scripts: gunicorn with the repository's gunicorn.conf.py on a
loopback port the kernel picks; `ProxyProcess(env, log_path)` returns once /proxy/health answers, `.stop()` ends it.

tests/conftest.py's `start_proxy` fixture, scripts/load_test.py, scripts/bench_hostile.py, scripts/proxy_overhead.py
and scripts/capture_agent_wire.py all start their proxies here, so each runs the way the image runs it.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .procfs import children, wait_serving

ROOT = Path(__file__).resolve().parent.parent


# The image's ENV that changes how the process runs rather than what it is told (glibc's malloc tunables): a proxy
# started here takes it from its checkout's Dockerfile, so it allocates memory as that checkout's image does.
IMAGE_ENV = ("GLIBC_TUNABLES",)


def image_env(checkout: Path = ROOT) -> dict[str, str]:
    """IMAGE_ENV's values as `checkout`'s Dockerfile sets them (an older checkout's may set none)."""
    text = (checkout / "Dockerfile").read_text()
    return {name: m.group(1) for name in IMAGE_ENV if (m := re.search(rf"^ENV {name}=(\S+)$", text, re.M))}


class ProxyProcess:
    """gunicorn serving proxy-passthrough:app (or `app`) from `cwd` (default this checkout; bench_hostile.py's
    --proxy-dir runs another's), with `env` over os.environ; its output goes to `log_path`.

    `args` are gunicorn command-line options, which override gunicorn.conf.py's settings.
    """

    def __init__(self, env: dict[str, str], log_path: Path, *, args: Sequence[str] = (),
                 app: str = "proxy-passthrough:app", cwd: Path = ROOT, timeout: float = 30.0):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        # Its own metrics folder, as the image's tmpfs: the workers sum their metrics through it (proxy/observe/metrics.py).
        self.metrics_dir = log_path.with_suffix(".metrics")
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        self.metrics_dir.mkdir(parents=True)
        # And its own state folder: PROXY_STATE_DB's default is a lasting file under XDG_STATE_HOME, which two
        # proxies (or two runs) must not share unless a test says so.
        full_env = {**os.environ, **image_env(cwd), "PROXY_BIND": "127.0.0.1:0", "LOG_LEVEL": "info",
                    "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
                    "XDG_STATE_HOME": str(log_path.with_suffix(".state")), **env}
        # Its own session: the master's pid is then its process group's id, and stop() signals that group (the master
        # and its workers) by that pid, never anything found by name.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--config", "gunicorn.conf.py", *args, app],
            cwd=cwd, env=full_env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # The health answer means a worker is up.
            self.url = wait_serving(self.proc, "/proxy/health", timeout, "gunicorn", self.log)
        except BaseException:
            self.stop()  # a proxy that did not come up must not outlive the run that started it
            raise

    @property
    def pid(self) -> int:
        """The gunicorn master's pid."""
        return self.proc.pid

    def workers(self) -> list[int]:
        return children(self.proc.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_once(self, text: str, seconds: float = 10.0) -> str:
        """The log once `text` is in it (or as it is after `seconds`). An access line is written when the body has
        been sent, so a client that has its answer can be a moment ahead of it."""
        deadline = time.monotonic() + seconds
        log = self.log()
        while text not in log and time.monotonic() < deadline:
            time.sleep(0.02)
            log = self.log()
        return log

    def stop(self) -> None:
        self.ask_to_stop()
        self.wait_stopped()

    def ask_to_stop(self) -> None:
        """Without waiting, so that many proxies can be stopped at once (each takes a second or two)."""
        if self.proc.poll() is None:
            # QUIT: gunicorn's quick shutdown; TERM would wait out idle keep-alive clients.
            os.killpg(self.proc.pid, signal.SIGQUIT)

    def wait_stopped(self, timeout: float = 10.0) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()
