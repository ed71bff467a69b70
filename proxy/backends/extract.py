"""Page extraction (HTML to a title and Markdown) in child processes of the proxy's worker, each page
under a CPU-time and a memory limit, so no page can block the event loop, gevent's DNS threads or
another request, nor take the worker's memory.

proxy/backends/fetcher.py uses ExtractPool; a child is this module run by the pool as
`python -m proxy.backends.extract CPU_SECONDS MEMORY_BYTES` (never by hand): it reads framed jobs on stdin and
writes framed answers on stdout until stdin closes, which is also how it learns that its worker died.
html_to_text is the extraction itself, pure, and tested in-process by tests/test_fetch.py.
"""
from __future__ import annotations

import atexit
import logging
import math
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from proxy.backends.invisible import visible_html
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


# -- the extraction itself (runs in a child) -----------------------------------------------------

def tidy(text: str) -> str:
    """Trailing spaces off every line, at most one blank line in a row."""
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _one_line(text: str | None) -> str | None:
    return (" ".join(text.split()) or None) if text else None


# Above this much HTML, readability's scoring (about 1.4 s a MB here) is skipped for a cheap rule: drop the
# elements that are never the article (navigation, scripts, forms) and keep <main> or <article> if there is one.
FAST_PATH_CHARS = 512 * 1024
NOT_CONTENT = "//script|//style|//nav|//header|//footer|//aside|//form|//noscript|//template|//iframe|//svg|//button"
# What holds no text a reader sees, in every path: scripts and styles, and comments (a comment is not an element:
# lxml's text_content() refuses it, which once made a big page fall back to its whole text, navigation included).
NO_TEXT = "//script|//style|//noscript|//template|//comment()|//processing-instruction()"


def html_to_text(html: str, url: str) -> tuple[str | None, str]:
    """A page's title and main content as Markdown (readability-lxml picks the content, markdownify writes it)."""
    title, text, _ = extract_page(html, url)
    return title, text


def extract_page(html: str, url: str, max_chars: int | None = None) -> tuple[str | None, str, bool]:
    """(title, Markdown, cut): readability-lxml picks the content (the fast rule on pages over FAST_PATH_CHARS),
    then only about `max_chars` of its text go through markdownify, which costs about a second a MB and
    writes text the model would never get (the fetcher cuts the text to its token budget anyway)."""
    if not html.strip():
        return None, "", False
    # Imported on the first page, not at boot: markdownify brings BeautifulSoup and soupsieve, which compile
    # their selectors at import (the pool's children import them before their first page).
    import lxml.html
    import markdownify
    from readability import Document
    try:
        if len(html) > FAST_PATH_CHARS:
            root = lxml.html.fromstring(html)
            title = root.findtext(".//title")
            for el in root.xpath(NOT_CONTENT + "|" + NO_TEXT):
                el.drop_tree()
            content = (root.xpath("//main|//article") or root.xpath("//body") or [root])[0]
        else:
            doc = Document(html, url=url)
            title = doc.short_title() or None
            content = lxml.html.fromstring(doc.summary(html_partial=True))
        cut = False
        if max_chars is not None:
            _, cut = _trim(content, max_chars + max_chars // 4)  # Markdown is a little longer than the text
        partial = lxml.html.tostring(content, encoding="unicode")
        text = markdownify.markdownify(partial, heading_style="ATX", bullets="-", strip=["img"])
        return _one_line(title), tidy(text), cut
    except MemoryError:
        raise
    except Exception as e:  # readability and markdownify raise bare lxml errors, RecursionError on deep nesting
        log.debug("readability failed on %s: %s; reading all the page's text", url, e)
    try:
        root = lxml.html.fromstring(html)
    except (ValueError, lxml.etree.ParserError):
        return None, "", False
    for el in root.xpath(NO_TEXT):  # the page's words, not its script source
        el.drop_tree()
    return _one_line(root.findtext(".//title")), tidy(root.text_content()), False


def _trim(el, budget: int) -> tuple[int, bool]:
    """Remove what follows the first `budget` characters of text under `el`: (characters kept, whether cut)."""
    used, cut = len(el.text or ""), False
    for child in list(el):
        if used >= budget:
            el.remove(child)
            cut = True
            continue
        # A comment or processing instruction (not an element) adds only its tail.
        size = (len(child.text_content()) if isinstance(child.tag, str) else 0) + len(child.tail or "")
        if used + size <= budget:
            used += size
            continue
        kept, _ = _trim(child, budget - used)
        used += kept + len(child.tail or "")
        cut = True
    return used, cut


# -- the child -----------------------------------------------------------------------------------

def _read_exact(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def _child_main(cpu_seconds: int, memory_bytes: int) -> None:
    # Ctrl-C reaches the whole process group; the worker decides when its children end (it closes stdin).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # readability logs every page at INFO; the child has no log of its own, and page text stays out of the proxy's.
    logging.disable(logging.CRITICAL)
    import resource

    import lxml.html  # noqa: F401  - imported before the memory limit, so the limit is the pages'
    import markdownify  # noqa: F401
    import readability  # noqa: F401
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
        frame = _read_exact(inp, int.from_bytes(head, "big"))
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
            html, hidden = visible_html(job["html"])
            title, text, cut = extract_page(html, job["url"], job.get("max_chars"))
            answer: dict = {"title": title, "text": text, "cut": cut, "hidden": hidden}
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
                                         close_fds=True, cwd=str(Path(__file__).resolve().parents[2]))
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
        argv = [sys.executable, "-m", "proxy.backends.extract", str(self.cpu_seconds), str(memory_bytes)]
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
            return self._run(child, html, url, max_chars)
        finally:
            if undo is not None:
                undo()
            self._idle.put(child)

    def _run(self, child: _Child, html: str, url: str, max_chars: int | None) -> tuple[str | None, str, bool, int]:
        deadline = time.monotonic() + self.wall_seconds
        try:
            proc = child.ensure()
        except OSError as e:
            raise ExtractError("unavailable", f"the extraction process cannot start ({e}).") from None
        assert proc.stdin is not None and proc.stdout is not None
        job = codec.dumps({"url": url, "html": html, "max_chars": max_chars})
        sent = _send(proc.stdin.fileno(), len(job).to_bytes(FRAME_HEADER, "big") + job, deadline)
        answer = _receive(proc.stdout.fileno(), deadline) if sent else None
        if answer is None:
            return self._failed(child, timed_out=time.monotonic() >= deadline)
        try:
            reply = codec.loads(answer)
        except ValueError:
            reply = {"error": "protocol"}
        if not isinstance(reply, dict) or "error" in reply or not isinstance(reply.get("text"), str):
            return self._failed(child, timed_out=False, reported=str(reply.get("error")) if isinstance(reply, dict) else "")
        title = reply.get("title")
        hidden = reply.get("hidden")
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
