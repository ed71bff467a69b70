"""Facts about a process, read from /proc: its children, memory, open files and TCP
connections. Used by the fault, fuzz and load tests, by proxy_process.py and by scripts/load_test.py.
"""
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (field 4 of /proc/PID/stat; the name in (...) may hold spaces)."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on (IPv4): how a launcher learns the port a server bound to port 0 got,
    whatever its log says."""
    inodes = _socket_inodes(pid)
    return [int(f[1].split(":")[1], 16) for f in (line.split() for line in open(f"/proc/{pid}/net/tcp").read().splitlines()[1:])
            if f[3] == "0A" and f[9] in inodes]  # 0A: LISTEN


def backend_connections(pid: int, port: int) -> int:
    """Established TCP connections that process `pid` holds to 127.0.0.1:`port`.

    Counted on the proxy's side: the stand-in vLLM is shared by every proxy of a test
    session, so its own count includes other proxies' pooled connections."""
    inodes = _socket_inodes(pid)
    n = 0
    for line in open(f"/proc/{pid}/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if int(f[2].split(":")[1], 16) == port and f[3] == "01" and f[9] in inodes:  # 01: ESTABLISHED
            n += 1
    return n


def wait_serving(proc: subprocess.Popen, probe: str, timeout: float, name: str, log: Callable[[], str]) -> str:
    """The http://127.0.0.1:PORT of a server started on port 0, once GET `probe` answers 200: the port comes from
    the process's listening socket (procfs), never its log, which a quiet log level may leave empty."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log()}")
        try:
            ports = listening_ports(proc.pid)
        except OSError:
            ports = []
        if ports:
            url = f"http://127.0.0.1:{ports[0]}"
            try:
                with urllib.request.urlopen(url + probe, timeout=2) as reply:
                    if reply.status == 200:
                        return url
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not start within {timeout:g} s:\n{log()}")
