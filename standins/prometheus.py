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
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .procfs import listening_ports


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
            self.url = self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> str:
        # The port from the listening socket (procfs), as for the proxy; /-/ready once the storage is open.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            try:
                ports = listening_ports(self.proc.pid)
            except OSError:
                ports = []
            if ports:
                url = f"http://127.0.0.1:{ports[0]}"
                try:
                    with urllib.request.urlopen(url + "/-/ready", timeout=2) as reply:
                        if reply.status == 200:
                            return url
                except OSError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready within {timeout:g} s:\n{self.log()}")

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
