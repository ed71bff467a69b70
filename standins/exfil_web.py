"""An attacker's web for the exfiltration suite (tests/test_exfiltration.py): a DNS stand-in that records every name
it is asked and answers 127.0.0.1 for the test's zones, and a page server that records every request it gets and
serves each site by its Host header (injected pages, nested-link honeypots, the legitimate pages the suite reads).

The proxy is pointed at the DNS stand-in through gevent's own resolver settings (`DnsStandIn.env()`), so the
names it sees are the names the proxy's real resolver looked up. Not run on its own.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .server import SocketStandIn


def _qname(packet: bytes, at: int) -> tuple[str, int]:
    """The question's name (no compression in a question) and where the name ends."""
    labels = []
    while at < len(packet):
        n = packet[at]
        at += 1
        if n == 0:
            break
        labels.append(packet[at:at + n].decode("ascii", "replace"))
        at += n
    return ".".join(labels), at


class DnsStandIn:
    """A UDP name server on loopback: answers A 127.0.0.1 for names under `zones`, an empty answer for other
    record types there, NXDOMAIN elsewhere; `asked` is every name asked, in order, lower-cased."""

    def __init__(self, zones: tuple[str, ...]):
        self.zones = tuple(z.lower().strip(".") for z in zones)
        self.asked: list[str] = []
        self._lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def env(self) -> dict[str, str]:
        """The proxy's environment that makes gevent's resolver (c-ares) ask this server and nothing else."""
        return {"GEVENT_RESOLVER": "ares", "GEVENTARES_SERVERS": "127.0.0.1", "GEVENTARES_UDP_PORT": str(self.port),
                "GEVENTARES_TCP_PORT": str(self.port)}

    def _ours(self, name: str) -> bool:
        return any(name == z or name.endswith("." + z) for z in self.zones)

    def _serve(self) -> None:
        while not self._closed:
            try:
                packet, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            if len(packet) < 12:
                continue
            name, end = _qname(packet, 12)
            qtype = struct.unpack("!H", packet[end:end + 2])[0] if end + 4 <= len(packet) else 0
            name = name.lower()
            with self._lock:
                self.asked.append(name)
            ours = self._ours(name)
            flags = 0x8180 if ours else 0x8183  # a response, recursion desired and available; NXDOMAIN if not ours
            answers = b""
            count = 0
            if ours and qtype == 1:
                # A pointer to the question's name, type A, class IN, TTL 0 so nothing is remembered between tests.
                answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + socket.inet_aton("127.0.0.1")
                count = 1
            head = packet[:2] + struct.pack("!HHHHH", flags, 1, count, 0, 0)
            try:
                self.sock.sendto(head + packet[12:end + 4] + answers, peer)
            except OSError:
                return

    def saw(self, text: str) -> list[str]:
        """The names asked that contain `text` (case-insensitive)."""
        with self._lock:
            return [n for n in self.asked if text.lower() in n]

    def close(self) -> None:
        self._closed = True
        self.sock.close()


@dataclass(frozen=True)
class Seen:
    host: str   # the Host header, without the port
    target: str  # the request line's path and query


Site = Callable[[str], tuple[int, str, bytes]]  # request target -> (status, content type, body)


class AttackerWeb(SocketStandIn):
    """Plain HTTP/1.1 on loopback, one request a connection; `sites` maps a host name to what serves it, and a
    host with no site gets 404. Every request is recorded in `seen`, whatever it asked."""

    def __init__(self, sites: dict[str, Site]):
        self.sites = sites
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        super().__init__("127.0.0.1")

    def url(self, host: str, path: str = "/") -> str:
        return f"http://{host}:{self.port}{path}"

    def saw(self, text: str) -> list[Seen]:
        """The requests whose host or target contain `text` (case-insensitive)."""
        with self._lock:
            return [s for s in self.seen if text.lower() in (s.host + s.target).lower()]

    def targets(self, host: str) -> list[str]:
        with self._lock:
            return [s.target for s in self.seen if s.host == host]

    def serve(self, conn: socket.socket, index: int) -> None:
        try:
            conn.settimeout(10)
            head = self.read_head(conn)
            if head is None:
                return
            lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            target = lines[0].split(" ")[1] if lines[0].count(" ") >= 2 else "/"
            host = next((v.strip() for n, _, v in (line.partition(":") for line in lines[1:]) if n.lower() == "host"), "")
            host = host.rsplit(":", 1)[0].lower()
            with self._lock:
                self.seen.append(Seen(host, target))
            site = self.sites.get(host)
            status, ctype, body = site(target) if site else (404, "text/plain", b"no such site")
            reason = {200: "OK", 404: "Not Found"}.get(status, "Status")
            conn.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + body)
        except OSError:
            pass
        finally:
            time.sleep(0.02)  # let the last bytes leave before the close
            conn.close()


def html(title: str, body: str) -> tuple[int, str, bytes]:
    return 200, "text/html; charset=utf-8", f"<html><head><title>{title}</title></head><body>{body}</body></html>".encode()
