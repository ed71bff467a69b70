"""A real redis-server (Debian's package, which tests/run.sh installs) on a free loopback port, for the shared-state
tests (tests/test_state.py, tests/test_state_shared.py): `RedisServer(workdir)` returns once it answers PING,
`.stop()` ends it by its pid (never by name), `.start()` brings it back on the same port (the store "returning"),
`.client()` is a redis-py client for looking at what the proxy wrote. Nothing is saved to disk unless `args` say so.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None, args: tuple[str, ...] = ()):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: tests/run.sh installs Debian's redis-server (apt-get install "
                               "redis-server), or put a Valkey/Redis server named redis-server on PATH")
        self.binary, self.workdir = binary, workdir
        self.args = args  # after the defaults, so they win: e.g. compose.scale.yaml's valkey settings
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis
        # No snapshot, no append-only file: a test's store starts empty and leaves nothing behind.
        self._log = open(self.workdir / f"redis-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--daemonize", "no", "--protected-mode", "yes", *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: "
                                   f"{(self.workdir / f'redis-{self.port}.log').read_text()[-500:]}")
            try:
                if self.client().ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)  # not listening yet
        self.stop()
        raise RuntimeError("redis-server did not answer PING within 15 s")

    def client(self):
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def stop(self) -> None:
        """Ends the server by its pid; a stopped server stays stopped."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # a store that dies, as in the outage tests; nothing on disk to flush
            self.proc.wait(10)
        self.proc = None
        self._log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
