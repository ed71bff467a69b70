"""Page extraction (HTML to a title and Markdown; PDFs to text by proxy/backends/pages/pdftext.py) in child processes of the proxy's
worker, each page under a CPU-time and a memory limit, so no page can block the event loop, gevent's DNS threads or
another request, nor take the worker's memory.

proxy/backends/pages/fetcher.py uses ExtractPool; a child is this module run by the pool as
`python -m proxy.backends.pages.extract CPU_SECONDS MEMORY_BYTES` (never by hand): it reads framed jobs on stdin and
writes framed answers on stdout until stdin closes, which is also how it learns that its worker died.
The extraction itself is proxy/backends/pages/readable.py's extract_page (HTML) and proxy/backends/pages/pdftext.py (PDFs), both pure.
"""
from __future__ import annotations

import atexit
import base64
import logging
import math
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from proxy.backends.pages import pdftext
from proxy.backends.pages.readable import extract_page
from proxy.core import codec
from proxy.runtime.cancel import Cancel

log = logging.getLogger("proxy.fetch")

FRAME_HEADER = 4  # bytes of big-endian length before each JSON frame on the pipes
PIPE_CHUNK = 64 * 1024


class ExtractError(Exception):
    """A page the pool could not extract; `code` is Anthropic's web_fetch error code, `message` the model's sentence."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# -- the child -----------------------------------------------------------------------------------

def _read_exact(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def _child_main(cpu_seconds: int, memory_bytes: int) -> None:
    # Ctrl-C reaches the whole process group; the worker decides when its children end (it closes stdin).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The child has no log of its own, and page text stays out of the proxy's.
    logging.disable(logging.CRITICAL)
    import resource

    import lxml.html  # noqa: F401  - imported before the memory limit, so the limit is the pages'
    # pdfminer is not: it brings cryptography, whose library maps tens of MiB that an HTML-only child never uses
    # (the first PDF imports it, within the limit).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU's default action dumps core
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    while True:
        head = _read_exact(inp, FRAME_HEADER)
        if head is None:
            return  # the worker closed stdin, or died
        try:
            frame = _read_exact(inp, int.from_bytes(head, "big"))
        except MemoryError:  # a page bigger than the room the limit leaves: said like any other memory failure
            frame = codec.dumps({"memory": True})
        if frame is None:
            return
        # RLIMIT_CPU counts the process's whole life, so each page gets `cpu_seconds` more than used so far;
        # past it the kernel sends SIGXCPU, which ends the child (the pool names the limit and starts another).
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime) + cpu_seconds
        if cpu_hard != resource.RLIM_INFINITY:
            soft = min(soft, cpu_hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
        try:
            job = codec.loads(frame)
            if job.get("memory"):
                raise MemoryError
            hidden = 0
            if "pdf" in job:
                # Half the CPU limit for reading pages: what was read by then is served, cut short, before the
                # kernel's SIGXCPU would lose it all.
                title, text, cut, _ = pdftext.pdf_to_text(base64.b64decode(job["pdf"]), job.get("max_chars"),
                                                          cpu_budget=cpu_seconds / 2)
            else:
                title, text, cut, hidden = extract_page(job["html"], job["url"], job.get("max_chars"))
            answer: dict = {"title": title, "text": text, "cut": cut, "hidden": hidden}
        except pdftext.PdfRefused as e:
            answer = {"refused": e.code, "message": e.message}
        except MemoryError:
            answer = {"error": "memory"}
        data = codec.dumps(answer)
        out.write(len(data).to_bytes(FRAME_HEADER, "big") + data)
        out.flush()
        if "error" in answer:
            return  # after a MemoryError the heap is in no state to trust: the pool starts a fresh child


# -- the pool (runs in the proxy's worker) --------------------------------------------------------

class _Child:
    """One extraction process, started on first use and again after it died; used by one page at a time."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.proc: subprocess.Popen | None = None
        self.killed = False

    def ensure(self) -> subprocess.Popen:
        if self.proc is not None and self.proc.poll() is not None:
            self.stop()
        if self.proc is None:
            # Same process group as the worker (gunicorn's and the tests' group signals reach it); its own
            # stdin and stdout only (close_fds), so a dead worker's pipes close and the child ends.
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                         close_fds=True, cwd=str(Path(__file__).resolve().parents[3]))
            assert self.proc.stdin is not None and self.proc.stdout is not None
            os.set_blocking(self.proc.stdin.fileno(), False)
            os.set_blocking(self.proc.stdout.fileno(), False)
            self.killed = False
        return self.proc

    def kill(self) -> None:
        """SIGKILL now; safe from any greenlet, thread or loop callback (a signal, no wait)."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            self.killed = True
            try:
                proc.kill()
            except OSError:
                pass  # it exited already

    def stop(self, grace: float = 0.0) -> int | None:
        """End the child (stdin closed; killed if still there after `grace` s) and reap it; its exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        for pipe in (proc.stdin, proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass  # a pipe the child's death already broke
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
        return proc.wait()


class ExtractPool:
    """Up to `processes` children extracting pages, at most `queue` pages waiting for one; each page
    under `cpu_seconds` of CPU (and three times that of wall clock) and `memory_bytes` of address space.

    Waiting never blocks the event loop: the pipes are non-blocking and waited on with select(),
    which gevent makes cooperative; in a plain thread it is an ordinary wait.
    """

    _shared: dict[tuple, ExtractPool] = {}
    _shared_lock = threading.Lock()

    def __init__(self, processes: int, cpu_seconds: float, memory_bytes: int, queue_size: int):
        self.cpu_seconds = max(1, math.ceil(cpu_seconds))
        self.wall_seconds = 3 * self.cpu_seconds + 1  # a busy machine shares its CPUs: wall time runs ahead of CPU time
        self.memory_bytes = memory_bytes
        self.queue_size = queue_size
        argv = [sys.executable, "-m", "proxy.backends.pages.extract", str(self.cpu_seconds), str(memory_bytes)]
        self._children = [_Child(argv) for _ in range(max(1, processes))]
        self._idle: queue.LifoQueue[_Child] = queue.LifoQueue()  # the warmest child first
        for child in self._children:
            self._idle.put(child)
        self._waiting = 0
        self._lock = threading.Lock()
        atexit.register(self.close)

    @classmethod
    def from_config(cls, cfg) -> ExtractPool:
        """The one pool of this process for these settings (every Fetcher of a worker shares it)."""
        key = (cfg.web_fetch_extract_processes, cfg.web_fetch_extract_cpu_seconds,
               cfg.web_fetch_extract_memory_mb, cfg.web_fetch_extract_queue)
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None:
                pool = cls._shared[key] = cls(key[0], key[1], key[2] * 1024 * 1024, key[3])
            return pool

    def extract(self, html: str, url: str, cancel: Cancel | None = None,
                max_chars: int | None = None) -> tuple[str | None, str, bool, int]:
        """(title, Markdown, cut, hidden elements dropped) of a page, about max_chars of it; raises ExtractError naming
        the limit a page went over."""
        return self._submit({"url": url, "html": html, "max_chars": max_chars}, cancel)

    def extract_pdf(self, data: bytes, url: str, cancel: Cancel | None = None,
                    max_chars: int | None = None) -> tuple[str | None, str, bool]:
        """(title, text, cut) of a PDF, under the same limits as a page; raises ExtractError for a limit it went over
        and for a PDF that cannot be read (encrypted, only images: proxy/backends/pages/pdftext.py)."""
        title, text, cut, _ = self._submit({"url": url, "pdf": base64.b64encode(data).decode("ascii"),
                                            "max_chars": max_chars}, cancel)
        return title, text, cut

    def _submit(self, job: dict, cancel: Cancel | None) -> tuple[str | None, str, bool, int]:
        with self._lock:
            if self._waiting >= self.queue_size:
                raise ExtractError("unavailable", f"the proxy is extracting {len(self._children)} pages and has "
                                   f"{self._waiting} more waiting (WEB_FETCH_EXTRACT_QUEUE); try again later.")
            self._waiting += 1
        try:
            child = self._idle.get(timeout=self.wall_seconds)
        except queue.Empty:
            raise ExtractError("unavailable", f"no extraction process came free within {self.wall_seconds} s; "
                               "try again later.") from None
        finally:
            with self._lock:
                self._waiting -= 1
        undo = cancel.on_abort(child.kill) if cancel is not None else None
        try:
            return self._run(child, job)
        finally:
            if undo is not None:
                undo()
            self._idle.put(child)

    def _run(self, child: _Child, job_fields: dict) -> tuple[str | None, str, bool, int]:
        deadline = time.monotonic() + self.wall_seconds
        try:
            proc = child.ensure()
        except OSError as e:
            raise ExtractError("unavailable", f"the extraction process cannot start ({e}).") from None
        assert proc.stdin is not None and proc.stdout is not None
        job = codec.dumps(job_fields)
        sent = _send(proc.stdin.fileno(), len(job).to_bytes(FRAME_HEADER, "big") + job, deadline)
        answer = _receive(proc.stdout.fileno(), deadline) if sent else None
        if answer is None:
            return self._failed(child, timed_out=time.monotonic() >= deadline)
        try:
            reply = codec.loads(answer)
        except ValueError:
            reply = {"error": "protocol"}
        if isinstance(reply, dict) and isinstance(reply.get("refused"), str):
            # A document the child read and cannot give text of (a PDF with a password): the child is fine.
            raise ExtractError(reply["refused"], str(reply.get("message") or "the document cannot be read."))
        if not isinstance(reply, dict) or "error" in reply or not isinstance(reply.get("text"), str):
            return self._failed(child, timed_out=False, reported=str(reply.get("error")) if isinstance(reply, dict) else "")
        title, hidden = reply.get("title"), reply.get("hidden")
        return ((title if isinstance(title, str) else None), reply["text"], reply.get("cut") is True,
                hidden if isinstance(hidden, int) and not isinstance(hidden, bool) else 0)

    def _failed(self, child: _Child, timed_out: bool, reported: str = ""):
        """The child did not answer: stop it (the next page starts a fresh one) and say which limit was hit."""
        if timed_out:
            child.kill()
        killed = child.killed
        status = child.stop(grace=0.5)
        if timed_out:
            why = f"extracting its text took longer than {self.wall_seconds} s"
        elif status == -signal.SIGXCPU:
            why = f"extracting its text took more than {self.cpu_seconds} s of CPU (WEB_FETCH_EXTRACT_CPU_SECONDS)"
        elif reported == "memory" or (status == -signal.SIGKILL and not killed) or status == -signal.SIGSEGV:
            why = (f"extracting its text needed more than {self.memory_bytes // (1024 * 1024)} MiB of memory "
                   "(WEB_FETCH_EXTRACT_MEMORY_MB)")
        elif killed:
            why = "the extraction was stopped"
        else:
            why = f"the extraction process failed (exit status {status})"
        log.warning("extract: %s", why)
        raise ExtractError("url_not_accessible", f"the page is too costly to read: {why}.")

    def close(self) -> None:
        """Stop every child (the worker is exiting): idle ones end at once on their closed stdin."""
        for child in self._children:
            try:
                child.stop(grace=1.0)
            except Exception as e:  # at exit, one child's trouble must not keep the others running
                log.debug("extract: stopping a child: %s", e)


def _send(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of `data` to a non-blocking pipe by `deadline`; False when the child is gone or too slow."""
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        _, writable, _ = select.select([], [fd], [], left)
        if not writable:
            continue
        try:
            n = os.write(fd, view[:PIPE_CHUNK])
        except BlockingIOError:
            continue
        except OSError:
            return False  # the child died (EPIPE)
        view = view[n:]
    return True


def _receive(fd: int, deadline: float) -> bytes | None:
    """One frame from a non-blocking pipe by `deadline`; None at an end of stream or the deadline."""
    buf = bytearray()
    need = FRAME_HEADER
    while len(buf) < need:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            continue
        try:
            data = os.read(fd, max(PIPE_CHUNK, need - len(buf)))
        except BlockingIOError:
            continue
        except OSError:
            return None
        if not data:
            return None
        buf += data
        if need == FRAME_HEADER and len(buf) >= FRAME_HEADER:
            need = FRAME_HEADER + int.from_bytes(buf[:FRAME_HEADER], "big")
    return bytes(buf[FRAME_HEADER:need])


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
