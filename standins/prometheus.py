"""A real Prometheus server (Debian's `prometheus` package, which tests/run.sh installs for the real-vLLM tier) on a
loopback port the kernel picks, for tests/real_vllm/test_monitoring_real.py (run it with tests/run.sh on that file).

`PrometheusServer(config, workdir)` returns once Prometheus answers /-/ready; `.query(expr)` asks its HTTP API,
`.stop()` ends it by its own pid.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .procfs import wait_serving


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`, or an error naming what installs it."""
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed (tests/run.sh installs Debian's prometheus package when the "
                           "selection holds real-vLLM tests)")
    return found


class PrometheusServer:
    """`prometheus` with `config`, its data and log in `workdir`."""

    def __init__(self, config: Path, workdir: Path, timeout: float = 60.0):
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "wb")
        # Its own session, so that stop() can end it (and nothing else) by its pid.
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             "--web.listen-address=127.0.0.1:0"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            # /-/ready answers once the storage is open.
            self.url = wait_serving(self.proc, "/-/ready", timeout, "prometheus", self.log)
        except BaseException:
            self.stop()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def api(self, path: str, **params: str) -> dict:
        """GET /api/v1/<path>: the decoded answer, errors included (Prometheus answers them in JSON with a 4xx)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as err:
            return json.loads(err.read())

    def query(self, expr: str) -> dict:
        """An instant query at the server's present time."""
        return self.api("query", query=expr)

    def targets(self) -> list[dict]:
        return self.api("targets")["data"]["activeTargets"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # a clean shutdown closes its storage
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
