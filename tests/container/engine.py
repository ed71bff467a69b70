"""The container tier's Docker engine: the one DOCKER_HOST (or /var/run/docker.sock) names if it
answers, else a dockerd of the tier's own, started here and stopped by its PID; used by
tests/container/conftest.py.

The own engine keeps its images under the test cache (CODING_STACK_TEST_CACHE/docker), so the
stand-in images built on one run are there for the next; its sockets and run state live in a
short /tmp folder (a unix socket path may not exceed 107 bytes).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 60


@dataclass
class Engine:
    host: str                        # a DOCKER_HOST value
    proc: subprocess.Popen | None = None  # set when the tier started dockerd itself
    run_dir: Path | None = None
    log_path: Path | None = None
    env: dict = field(default_factory=dict)

    def docker(self, *args, check=True, timeout=600, **kw) -> subprocess.CompletedProcess:
        """`docker ARGS` against this engine; a failure raises with docker's own words."""
        proc = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])}... exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        return proc


def _answers(host: str) -> bool:
    env = {**os.environ, "DOCKER_HOST": host}
    try:
        return subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], env=env,
                              capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start(cache: Path) -> Engine:
    """An engine that answers: the user's own if there is one, else a fresh dockerd."""
    if shutil.which("docker") is None:
        raise RuntimeError("the docker client is not installed (tests/run.sh installs Debian's docker.io)")
    for host in filter(None, [os.environ.get("DOCKER_HOST"), "unix:///var/run/docker.sock"]):
        if _answers(host):
            return Engine(host, env={**os.environ, "DOCKER_HOST": host})
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise RuntimeError("no Docker engine answers and dockerd is not installed "
                           "(tests/run.sh installs Debian's docker.io)")
    run_dir = Path(tempfile.mkdtemp(prefix="cs-dockerd-", dir="/tmp"))
    data_root = cache / "docker"
    data_root.mkdir(parents=True, exist_ok=True)
    host = f"unix://{run_dir}/docker.sock"
    log_path = cache / "dockerd.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [dockerd, "--data-root", str(data_root), "--exec-root", str(run_dir / "exec"),
         "--pidfile", str(run_dir / "docker.pid"), "--host", host, "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    engine = Engine(host, proc, run_dir, log_path, env={**os.environ, "DOCKER_HOST": host})
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(host):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(engine)
            raise RuntimeError(f"dockerd did not start (log {log_path}):\n{log_path.read_text()[-3000:]}")
        time.sleep(0.3)
    return engine


def stop(engine: Engine) -> None:
    """Stops the dockerd this tier started (by its PID: TERM, then KILL); the user's engine is left alone."""
    if engine.proc is None:
        return
    if engine.proc.poll() is None:
        engine.proc.send_signal(signal.SIGTERM)
        try:
            engine.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # Its whole session: dockerd and the containerd it started.
            os.killpg(engine.proc.pid, signal.SIGKILL)
            engine.proc.wait(timeout=10)
    if engine.run_dir is not None:
        shutil.rmtree(engine.run_dir, ignore_errors=True)
