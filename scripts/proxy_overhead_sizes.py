"""What the proxy adds as a conversation grows (issue 54): an agent-shaped history of each size on chat, Messages and
Responses, direct and through the proxy interleaved request by request; run
`~/.cache/coding-stack-tests/venv-*/bin/python -m scripts.proxy_overhead_sizes [--sizes 0.07,0.35,1.06,3.1]` from
the repository root after `tests/run.sh --co -q` has built that venv (`--help` lists the options).

A sibling of scripts/proxy_overhead.py (its client, stand-in and proxy processes): standins/fast_backend.py answers
at once on each API's path, so what is timed is the proxy's own work on the body. Two modes, each its own proxy:
- relay: INJECT_WEB_SEARCH=false and INJECT_WEB_FETCH=false, and no server tool in the request: the body goes on as
  it came (the handlers still read it: mending, the session key);
- tools: the shipped settings, and the request offers the proxy's tools (chat: injected; Messages:
  web_search_20250305; Responses: the hosted web_search): the body is read, its URLs' provenance gathered, rewritten
  and sent as a one-turn loop whose answer is final.
Each cell is the median and p90 of `--requests` requests per side, direct and the proxy alternating (every order in
turn), after a warm-up; `added` is proxy minus direct, at the median and at p90; `CPU` is the proxy's workers' CPU
ms per request (read from /proc, so it holds on a busy machine where the times do not). `--against DIR` (another revision's
checkout) runs its proxy ("before") beside this one's ("after"), the three sides interleaved request by request, so a
change is judged under the same machine load. It prints a table and, with --json PATH, every figure. A benchmark, not
a test: it never fails on a missed target, it reports it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from scripts.proxy_overhead import FAILURES, Backend, Client, Proxy, interleaved_fairly, pct, processes

APIS = ("chat", "messages", "responses")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
SYSTEM = ("You are a coding agent working in the user's repository. Use the tools to read and edit files; run the "
          "tests before you say a change is done. Keep answers short. ") * 20

# One source file as a tool would return it: code with quotes, newlines and a URL or two, as real files hold.
CODE_LINE = ('    def handler_%d(self, request):  # see https://docs.example.org/api/%d for the "shape"\n'
             '        return {"status": "ok", "path": request.path, "n": %d}\n')


def _file(turn: int, size: int = 3000) -> str:
    out: list[str] = []
    n = total = 0
    while total < size:
        out.append(CODE_LINE % (n, turn, n))
        total += len(out[-1])
        n += 1
    return f"class Module{turn}:\n" + "".join(out)


def _turns(size: int):
    """(turn number, the tool's result) until about `size` bytes of results: what every API's history holds."""
    turn, total = 0, 0
    while total < size:
        text = _file(turn)
        yield turn, text
        total += len(text) + 400  # the call, the ids and the escaping around each result
        turn += 1


def chat_body(size: int, _tools: bool) -> dict:
    messages: list[dict] = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": "Fix the failing test in tests/test_api.py; the spec is "
                                                        "https://docs.example.org/api."}]
    for n, text in _turns(size):
        args = json.dumps({"path": f"src/module_{n}.py"})
        messages.append({"role": "assistant", "content": f"Reading module {n}.", "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "read_file", "arguments": args}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": text})
    body = {"model": "foundation", "max_tokens": 64, "messages": messages,
            "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                                        "parameters": {"type": "object", "properties": {
                                                            "path": {"type": "string"}}}}}]}
    return body  # chat's web tools are the proxy's to inject (the tools proxy's), never the client's to ask for


def messages_body(size: int, tools: bool) -> dict:
    messages: list[dict] = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>The date is 2026-12-07.</system-reminder>"},
        {"type": "text", "text": "Fix the failing test; the spec is https://docs.example.org/api."}]}]
    for n, text in _turns(size):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Reading module {n}."},
            {"type": "tool_use", "id": f"toolu_{n}", "name": "Read", "input": {"file_path": f"src/module_{n}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": text}]})
    client_tools: list[dict] = [{"name": "Read", "description": "Read a file.", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}]
    if tools:
        client_tools.append({"type": "web_search_20250305", "name": "web_search", "max_uses": 5})
    return {"model": "foundation", "max_tokens": 64, "system": [{"type": "text", "text": SYSTEM,
                                                                "cache_control": {"type": "ephemeral"}}],
            "messages": messages, "tools": client_tools}


def responses_body(size: int, tools: bool) -> dict:
    items: list[dict] = [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "<environment_context>cwd: /repo</environment_context>"},
        {"type": "input_text", "text": "Fix the failing test; the spec is https://docs.example.org/api."}]}]
    for n, text in _turns(size):
        items.append({"type": "function_call", "name": "shell", "call_id": f"call_{n}",
                      "arguments": json.dumps({"command": ["cat", f"src/module_{n}.py"]})})
        items.append({"type": "function_call_output", "call_id": f"call_{n}", "output": text})
    client_tools: list[dict] = [{"type": "function", "name": "shell", "description": "Run a command.",
                                 "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}]
    if tools:
        client_tools.append({"type": "web_search"})
    return {"model": "foundation", "max_output_tokens": 64, "instructions": SYSTEM, "input": items,
            "tools": client_tools}


BUILDERS = {"chat": chat_body, "messages": messages_body, "responses": responses_body}


def body_of(api: str, megabytes: float, tools: bool) -> bytes:
    """The API's agent-shaped request, its whole body about `megabytes` MB."""
    target = int(megabytes * 1e6)
    size = target
    for _ in range(4):  # the history's share of the body, corrected to the target
        raw = json.dumps(BUILDERS[api](size, tools)).encode()
        size = max(1000, int(size * target / len(raw)))
    return raw


def measure(backend, proxies: dict, api: str, raw: bytes, n: int) -> dict:
    """n requests per side, direct and each proxy interleaved request by request (every order of the sides in
    turn); each side's median and p90 in ms, and what each proxy adds over direct at both."""
    path, hdr = PATHS[api], [("X-Bench-Mode", "plain")]
    clients = {"direct": Client(backend.url), **{name: Client(p.url) for name, p in proxies.items()}}
    for c in clients.values():
        for _ in range(3):
            c.retrying("POST", path, raw, hdr)
    cpu0 = {name: p.cpu() for name, p in proxies.items()}
    r = interleaved_fairly(n, [(name, lambda c=c: c.retrying("POST", path, raw, hdr)[1]) for name, c in clients.items()])
    cpu = {name: (p.cpu() - cpu0[name]) / n for name, p in proxies.items()}
    for c in clients.values():
        c.close()
    out: dict = {"body_bytes": len(raw), "n": n}
    for side, times in r.items():
        out[f"{side}_p50_ms"] = pct(times, 50) * 1e3
        out[f"{side}_p90_ms"] = pct(times, 90) * 1e3
    for side in proxies:
        out[f"{side}_added_p50_ms"] = out[f"{side}_p50_ms"] - out["direct_p50_ms"]
        out[f"{side}_added_p90_ms"] = out[f"{side}_p90_ms"] - out["direct_p90_ms"]
        # The workers' CPU time per request: what the proxy spends, whatever else the machine is doing.
        out[f"{side}_cpu_ms"] = cpu[side] * 1e3
    return out


def table(results: list[dict], sides: list[str]) -> str:
    """One row per mode, API and size: direct's p50/p90, then each proxy's p50/p90, what it adds at both, and its
    workers' CPU per request."""
    head = f"{'mode':6} {'api':9} {'MB':>5} {'direct p50/p90':>15}"
    for side in sides:
        head += f" | {side + ' p50/p90':>17} {'added p50/p90':>15} {'CPU':>5}"
    out = [head]
    for r in results:
        line = f"{r['mode']:6} {r['api']:9} {r['body_bytes'] / 1e6:5.2f} {r['direct_p50_ms']:7.2f}/{r['direct_p90_ms']:<7.2f}"
        for side in sides:
            line += (f" | {r[side + '_p50_ms']:8.2f}/{r[side + '_p90_ms']:<8.2f} "
                     f"{r[side + '_added_p50_ms']:+7.2f}/{r[side + '_added_p90_ms']:<+7.2f} {r[side + '_cpu_ms']:5.2f}")
        out.append(line)
    return "\n".join(out)


def start_proxies(mode: str, env: dict, workdir: Path, against: Path | None) -> dict:
    """The mode's proxy from this checkout ("proxy"), or with --against the other checkout's ("before") and this
    one's ("after")."""
    if mode == "relay":
        env = {**env, "INJECT_WEB_SEARCH": "false", "INJECT_WEB_FETCH": "false"}
    if against is None:
        return {"proxy": Proxy(mode, env, [], "", workdir)}
    return {"before": Proxy(f"{mode}-before", env, [], "", workdir, cwd=against),
            "after": Proxy(f"{mode}-after", env, [], "", workdir)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes", default="0.07,0.35,1.06,3.1", help="body sizes in MB, comma-separated "
                    "(default 0.07,0.35,1.06,3.1: 1.06 MB is about a full 253,952-token context)")
    ap.add_argument("--apis", default=",".join(APIS), help="comma list of chat, messages, responses (default all)")
    ap.add_argument("--modes", default="relay,tools", help="comma list of relay, tools (default both)")
    ap.add_argument("--requests", type=int, default=60, help="requests per side and cell (default 60)")
    ap.add_argument("--against", metavar="DIR", help="a checkout of another revision: its proxy (before) and this "
                    "checkout's (after) side by side, interleaved with direct request by request")
    ap.add_argument("--json", metavar="PATH", help="also write every figure as JSON here")
    ap.add_argument("--log-level", default="info", help="the proxy's LOG_LEVEL (default info, as shipped)")
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    apis, modes = args.apis.split(","), args.modes.split(",")
    against = Path(args.against).resolve() if args.against else None
    if against is not None and not (against / "proxy-passthrough.py").is_file():
        raise SystemExit(f"proxy_overhead_sizes.py: {against} is not a checkout of this repository")
    workdir = Path(tempfile.mkdtemp(prefix="proxy-overhead-sizes-"))
    started = time.monotonic()
    load = os.getloadavg()
    backend = Backend(workdir)
    results = []
    with processes(workdir, "proxy_overhead_sizes.py", backend) as procs:
        env = {"BACKEND_URL": backend.url, "SEARXNG_URL": backend.searxng_url, "LOG_LEVEL": args.log_level,
               "SEARCH_CACHE_TTL": "0"}
        for mode in modes:
            proxies = start_proxies(mode, env, workdir, against)
            procs += proxies.values()
            for api in apis:
                for mb in sizes:
                    raw = body_of(api, mb, mode == "tools")
                    results.append({"mode": mode, "api": api, **measure(backend, proxies, api, raw, args.requests)})
                    print(f"{mode} {api} {mb} MB: done", file=sys.stderr, flush=True)
            for p in proxies.values():  # one mode's proxies at a time: the machine has few cores
                p.stop()
    after = os.getloadavg()
    sides = ["before", "after"] if against is not None else ["proxy"]
    print(f"proxy overhead by body size: {os.cpu_count()} CPUs, load average {load[0]:.2f} before the run and "
          f"{after[0]:.2f} after, {args.requests} requests per side and cell, interleaved with direct; "
          f"{time.monotonic() - started:.1f} s" + (f"; before = {against}" if against is not None else ""))
    if FAILURES:
        print(f"FAILED ANSWERS: {len(FAILURES)} (each retried on a new connection); first: {FAILURES[0]}")
    print(table(results, sides))
    if args.json:
        Path(args.json).write_text(json.dumps({"load_average": [load, after], "against": args.against,
                                               "failures": FAILURES, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
