"""The container tier's Docker engine: the one DOCKER_HOST (or /var/run/docker.sock) names if it
answers, else a dockerd of the tier's own, started here and stopped by its PID; used by
tests/container/conftest.py.

The own engine keeps its images under the test cache (CODING_STACK_TEST_CACHE/docker), so the
stand-in images built on one run are there for the next; its sockets and run state live in a
short /tmp folder (a unix socket path may not exceed 107 bytes).

One tier runs at a time on a machine: the stack's names are fixed (project `coding-stack`) and the
own engine's data root is shared, so `start` takes an exclusive lock in the cache first and a second
run waits for it (saying so) instead of breaking the first.

`start_fresh` is the first start a new user's machine sees: a dockerd in a network namespace of the
tier's own (so no `docker0` exists for it, whatever engines ran on this host before) on an empty data
root; tests/container/test_fresh_engine.py runs the stack's host-gateway path on it.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 60
DOCKER0 = Path("/sys/class/net/docker0")  # the default bridge a dockerd creates when none exists


@dataclass
class Engine:
    host: str                        # a DOCKER_HOST value
    proc: subprocess.Popen | None = None  # set when the tier started dockerd itself
    run_dir: Path | None = None
    log_path: Path | None = None
    env: dict = field(default_factory=dict)
    lock: object = None              # the open lock file; closing it lets the next run in
    netns: str | None = None         # the network namespace the own dockerd runs in (start_fresh)
    made_docker0: bool = False       # the own dockerd created the host's docker0; stop removes it again

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


def _take_lock(cache: Path):
    cache.mkdir(parents=True, exist_ok=True)
    lock = open(cache / "container-tier.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"container tier: another run holds {lock.name}; waiting for it to finish", file=sys.stderr)
        fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def start(cache: Path) -> Engine:
    """An engine that answers: the user's own if there is one, else a fresh dockerd; holds the tier's lock."""
    if shutil.which("docker") is None:
        raise RuntimeError("the docker client is not installed (tests/run.sh installs Debian's docker.io)")
    lock = _take_lock(cache)
    try:
        engine = _start(cache)
    except BaseException:
        lock.close()
        raise
    engine.lock = lock
    return engine


def _start(cache: Path) -> Engine:
    for host in filter(None, [os.environ.get("DOCKER_HOST"), "unix:///var/run/docker.sock"]):
        if _answers(host):
            return Engine(host, env={**os.environ, "DOCKER_HOST": host})
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise RuntimeError("no Docker engine answers and dockerd is not installed "
                           "(tests/run.sh installs Debian's docker.io)")
    had_docker0 = DOCKER0.exists()
    engine = _launch(dockerd, cache / "docker", cache / "dockerd.log")
    # A first engine start creates docker0, and dockerd leaves it behind when it stops: removing it again keeps
    # the next run's first start as fresh as this one's (and the host as the tier found it).
    engine.made_docker0 = not had_docker0 and DOCKER0.exists()
    return engine


def start_fresh(root: Path, netns: str) -> Engine:
    """A dockerd as on a machine that never ran one: an empty data root under `root`, and its own network
    namespace `netns` (which the caller made, see NetNamespace), so no docker0 exists when it starts."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise RuntimeError("dockerd is not installed (tests/run.sh installs Debian's docker.io)")
    data_root = root / "data"
    if data_root.exists():
        raise RuntimeError(f"{data_root} exists; a fresh engine needs an empty data root")
    # nsenter (not `ip netns exec`, whose private /sys hides the cgroup mounts dockerd needs) execs dockerd,
    # so the PID stop() signals is dockerd's own.
    return _launch(dockerd, data_root, root / "dockerd.log", wrapper=["nsenter", f"--net=/run/netns/{netns}"],
                   netns=netns)


def _launch(dockerd: str, data_root: Path, log_path: Path, wrapper=(), netns: str | None = None) -> Engine:
    run_dir = Path(tempfile.mkdtemp(prefix="cs-dockerd-", dir="/tmp"))
    data_root.mkdir(parents=True, exist_ok=True)
    host = f"unix://{run_dir}/docker.sock"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [*wrapper, dockerd, "--data-root", str(data_root), "--exec-root", str(run_dir / "exec"),
         "--pidfile", str(run_dir / "docker.pid"), "--host", host, "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    engine = Engine(host, proc, run_dir, log_path, env={**os.environ, "DOCKER_HOST": host}, netns=netns)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(host):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_dockerd(engine)
            raise RuntimeError(f"dockerd did not start (log {log_path}):\n{log_path.read_text()[-3000:]}")
        time.sleep(0.3)
    return engine


def stop(engine: Engine) -> None:
    """Stops the dockerd this tier started (by its PID: TERM, then KILL; the user's engine is left alone),
    removes the docker0 it created, then releases the tier's lock."""
    try:
        _stop_dockerd(engine)
        if engine.made_docker0 and DOCKER0.exists():
            subprocess.run(["ip", "link", "delete", "docker0"], check=True, capture_output=True, timeout=30)
    finally:
        if engine.lock is not None:
            engine.lock.close()


def _stop_dockerd(engine: Engine) -> None:
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


class NetNamespace:
    """A network namespace of the tier's own (`with NetNamespace("cs-fresh-123") as ns`), made with iproute2 and
    deleted on exit; a name already taken is an error, never someone else's namespace reused."""

    def __init__(self, name: str):
        self.name = name

    def ip(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "-n", self.name, *args], capture_output=True, text=True, timeout=30)

    def __enter__(self) -> NetNamespace:
        if shutil.which("ip") is None or shutil.which("nsenter") is None:
            raise RuntimeError("ip (iproute2) and nsenter (util-linux) are needed for a fresh engine")
        made = subprocess.run(["ip", "netns", "add", self.name], capture_output=True, text=True, timeout=30)
        if made.returncode != 0:
            raise RuntimeError(f"ip netns add {self.name} failed: {made.stderr.strip()}")
        self.ip("link", "set", "lo", "up")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, timeout=30)
