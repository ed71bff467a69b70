"""Latency of a plain chat request through the real proxy (gunicorn, one gevent worker) while N large pages are
being read by web_fetch, against the same request on an idle proxy; printed side by side as ratios.

Run from the repository root: `python -m scripts.bench_hostile [--pages 12] [--size-mb 2] [--samples 20]`
(with the test venv's python: it needs gunicorn, gevent and the stand-ins); `--proxy-dir DIR` runs
the proxy of another checkout (e.g. `git archive main | tar -x -C DIR`) against the same stand-ins, for a before and after. Everything is on loopback:
the scripted vLLM stand-in, standins/hostile_web.py's page server and the proxy; all are stopped at the end.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from standins.hostile_web import BEHAVIOURS, HostileWeb, huge
from standins.proxy_process import ROOT, ProxyProcess
from standins.scripted_backend import ScriptedBackend
from standins.vllm_wire import completion, json_reply, tool_call


def model(req):
    msgs = req.json()["messages"]
    if any(m.get("role") == "tool" for m in msgs):
        return json_reply(completion(content="done", finish_reason="stop"))
    text = msgs[-1]["content"]
    if text.startswith("fetch "):
        return json_reply(completion(tool_calls=[tool_call("web_fetch", {"url": u}) for u in text.split()[1:]],
                                     finish_reason="tool_calls"))
    return json_reply(completion(content="pong", finish_reason="stop"))


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
    env = {"BACKEND_URL": backend.url, "SEARXNG_URL": "http://127.0.0.1:9",
           "WEB_FETCH_ALLOWED_NETWORKS": "127.0.0.0/8", "WEB_FETCH_TIMEOUT": "120", "PROXY_WORKERS": "1",
           "WEB_FETCH_MAX_PER_TURN": str(args.pages), "WEB_FETCH_EXTRACT_QUEUE": str(args.pages), "LOG_LEVEL": "warning"}
    logs = tempfile.TemporaryDirectory(prefix="bench-hostile-")
    try:
        proxy = ProxyProcess(env, Path(logs.name) / "proxy.log", cwd=args.proxy_dir)
    except BaseException:
        backend.close()
        web.close()
        raise
    url = proxy.url
    try:
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
        proxy.stop()
        backend.close()
        web.close()
        logs.cleanup()
    med_i, med_b = statistics.median(idle), statistics.median(busy)
    print(f"{2 * half} pages of {args.size_mb:g} MB read by two requests: turns took {', '.join(f'{t:.1f} s' for t in turns)}")
    print(f"plain request, idle proxy:      median {med_i * 1000:.0f} ms, max {max(idle) * 1000:.0f} ms ({len(idle)} samples)")
    print(f"plain request, pages being read: median {med_b * 1000:.0f} ms, max {max(busy) * 1000:.0f} ms ({len(busy)} samples)")
    print(f"ratio busy/idle: median {med_b / med_i:.1f}x, max {max(busy) / max(idle):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
