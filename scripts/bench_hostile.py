"""Latency of a plain chat request through the real proxy (gunicorn, one gevent worker) while N large pages are
being read by web_fetch, against the same request on an idle proxy; printed side by side as ratios.

Run from the repository root: `python scripts/bench_hostile.py [--pages 12] [--size-mb 2] [--samples 20]`
(with the test venv's python: it needs gunicorn, gevent and the tests' stand-ins); `--proxy-dir DIR` runs
the proxy of another checkout (e.g. `git archive main | tar -x -C DIR`) against the same stand-ins, for a before and after. Everything is on loopback:
the scripted vLLM stand-in, tests/standins/hostile_web.py's page server and the proxy; all are stopped at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from standins.hostile_web import BEHAVIOURS, HostileWeb, huge  # noqa: E402
from standins.scripted_backend import ScriptedBackend  # noqa: E402
from standins.vllm_wire import completion, json_reply, tool_call  # noqa: E402


def model(req):
    msgs = req.json()["messages"]
    if any(m.get("role") == "tool" for m in msgs):
        return json_reply(completion(content="done", finish_reason="stop"))
    text = msgs[-1]["content"]
    if text.startswith("fetch "):
        return json_reply(completion(tool_calls=[tool_call("web_fetch", {"url": u}) for u in text.split()[1:]],
                                     finish_reason="tool_calls"))
    return json_reply(completion(content="pong", finish_reason="stop"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, text: str, timeout: float = 600) -> float:
    body = json.dumps({"model": "foundation", "messages": [{"role": "user", "content": text}]}).encode()
    started = time.monotonic()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
    return time.monotonic() - started


def samples(url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        out.append(post(url, "hello"))
        time.sleep(0.1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=12, help="large pages read at once (two requests of half each)")
    ap.add_argument("--size-mb", type=float, default=2.0)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--proxy-dir", type=Path, default=ROOT,
                    help="the proxy's source tree to run (a checkout of another commit, for a before/after)")
    args = ap.parse_args()
    BEHAVIOURS["/bench-page"] = huge(int(args.size_mb * 1024 * 1024))
    backend, web = ScriptedBackend(), HostileWeb()
    backend.responder = model
    port = free_port()
    env = {**os.environ, "BACKEND_URL": backend.url, "SEARXNG_URL": "http://127.0.0.1:9", "PROXY_BIND": f"127.0.0.1:{port}",
           "WEB_FETCH_ALLOWED_NETWORKS": "127.0.0.0/8", "WEB_FETCH_TIMEOUT": "120", "PROXY_WORKERS": "1",
           "WEB_FETCH_MAX_PER_TURN": str(args.pages), "WEB_FETCH_EXTRACT_QUEUE": str(args.pages), "LOG_LEVEL": "warning"}
    log = tempfile.TemporaryFile()
    proxy = subprocess.Popen([sys.executable, "-m", "gunicorn", "--config", "gunicorn.conf.py", "proxy-passthrough:app"],
                             cwd=args.proxy_dir, env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/proxy/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        post(url, "hello")  # a first request warms the worker
        idle = samples(url, args.samples)
        half = max(1, args.pages // 2)
        turns: list[float] = []

        def reader(offset: int):
            urls = " ".join(web.url("/bench-page") + f"?n={offset + i}" for i in range(half))
            turns.append(post(url, "fetch " + urls))
        readers = [threading.Thread(target=reader, args=(k * half,)) for k in range(2)]
        for t in readers:
            t.start()
        busy = []
        while any(t.is_alive() for t in readers):
            busy.append(post(url, "hello"))
            time.sleep(0.1)
        for t in readers:
            t.join()
    finally:
        os.killpg(proxy.pid, signal.SIGQUIT)
        proxy.wait(15)
        backend.close()
        web.close()
    med_i, med_b = statistics.median(idle), statistics.median(busy)
    print(f"{2 * half} pages of {args.size_mb:g} MB read by two requests: turns took {', '.join(f'{t:.1f} s' for t in turns)}")
    print(f"plain request, idle proxy:      median {med_i * 1000:.0f} ms, max {max(idle) * 1000:.0f} ms ({len(idle)} samples)")
    print(f"plain request, pages being read: median {med_b * 1000:.0f} ms, max {max(busy) * 1000:.0f} ms ({len(busy)} samples)")
    print(f"ratio busy/idle: median {med_b / med_i:.1f}x, max {max(busy) / max(idle):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
