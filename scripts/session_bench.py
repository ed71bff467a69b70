#!/usr/bin/env python3
"""The session benchmark: replays a recorded multi-turn agent session (tests/data/sessions/: a Claude Code shape on
/v1/messages, a Codex shape on /v1/responses, with searches, page reads, a cut page, a failing search engine and a
cached answer) against a running vLLM, through the proxy and straight to vLLM, and prints per client turn the
prompt tokens, the cached prompt tokens and the time to first token, and how close the prefix cache came to the
ideal: each request's prompt starting with the previous request's prompt and output, so all of that is reused.

    scripts/session_bench.py --vllm http://127.0.0.1:18080 [--session tests/data/sessions/codex.json ...]

Every number comes from vLLM's own counters (`vllm:prompt_tokens`, `vllm:prefix_cache_queries`,
`vllm:prefix_cache_hits`, `vllm:generation_tokens` on its /metrics), read after each request vLLM serves: the
benchmark puts a recording relay between the proxy and vLLM, and runs the proxy itself from this checkout (the code
the stack's image runs) with stand-ins for SearXNG and the web holding the session's recorded answers and pages, so
a run needs nothing but vLLM and repeats exactly. "direct" replays the very requests the proxy made, straight to
vLLM with a different system-prompt nonce (so neither run reads the other's cache): the same prompts without the
proxy. `--force` makes a random test model (tests/real_vllm) make the session's recorded calls, with the
structured_outputs regex the real-vLLM tier uses; a real model makes its own calls and needs no --force.

Needs a vLLM started with --enable-prefix-caching (docker-compose.yaml); one sequence at a time, as the stack runs.
Exit status 1 with one line on a usage or connection error.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from standins.proxy_process import ProxyProcess  # noqa: E402
from standins.searxng import SearxngStandIn, result  # noqa: E402
from standins.server import QuietHandler, StandInServer  # noqa: E402
from standins.web_pages import WebSite  # noqa: E402

SESSIONS = ROOT / "tests" / "data" / "sessions"
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total")


def die(message: str) -> None:
    print(f"session_bench: {message}", file=sys.stderr)
    sys.exit(1)


# ---- vLLM's counters ----------------------------------------------------------------------------

def scrape(vllm: str) -> str:
    parts = urllib.parse.urlsplit(vllm)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def counters(text: str) -> dict[str, float]:
    """Each counter of COUNTERS summed over its label sets (one engine, one model: one line each)."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def block_size(text: str) -> int:
    """vLLM's cache block size in tokens (a prefix hit lands on whole blocks), from vllm:cache_config_info."""
    m = re.search(r'^vllm:cache_config_info\{[^}]*block_size="(\d+)"', text, re.M)
    return int(m.group(1)) if m else 16


@dataclass
class Served:
    """One request vLLM served: its path, the body it got, and what its counters moved by."""
    path: str
    body: dict
    prompt: int
    output: int
    queries: int
    hits: int
    ttft: float


# ---- the relay between the proxy and vLLM ------------------------------------------------------

def forced_text(calls: list[dict]) -> str:
    """The tool calls as the Qwen3 XML the qwen3_coder parser reads (and the chat template writes back)."""
    parts = []
    for c in calls:
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in c["arguments"].items())
        parts.append(f"<tool_call>\n<function={c['name']}>\n{params}</function>\n</tool_call>")
    return "\n".join(parts)


class Relay(StandInServer):
    """Passes each request on to vLLM as it streams back, and reads vLLM's counters after each one. With `force`
    (a test model) it also makes the model call what the session recorded: `rounds` holds the current turn's calls,
    one round per request, and every request gets thinking off, since the forcing grammar starts after </think>."""

    poll_interval = 0.05

    def __init__(self, vllm: str, force: dict | None = None):
        self.vllm = urllib.parse.urlsplit(vllm)
        self.vllm_url = vllm
        self.force = force  # {"bias": {token id: 100}} for a test model, else None
        self.rounds: list[list[dict]] = []
        self.answer: str | None = None  # the turn's recorded answer, which a forced model writes after its calls
        self.served: list[Served] = []
        self.lock = threading.Lock()
        self.verbose = False  # --verbose: each request's figures on stderr as it is served
        super().__init__()

    def rewrite(self, body: dict | None) -> dict | None:
        if self.force is None or not isinstance(body, dict):
            return body
        body = {**body, "chat_template_kwargs": {**(body.get("chat_template_kwargs") or {}), "enable_thinking": False}}
        if self.path_is_messages:
            return body  # vLLM 0.32's Messages route has no structured_outputs: the model answers as it will
        text = forced_text(self.rounds.pop(0)) if self.rounds else self.answer
        if text:
            body["structured_outputs"] = {"regex": re.escape(text)}
            body["logit_bias"] = self.force["bias"]
        return body

    path_is_messages = False

    def handler(self):
        relay = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self._pass(None)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._pass(raw)

            def _pass(self, raw):
                with relay.lock:  # one at a time, so each request's counter deltas are its own
                    relay.path_is_messages = self.path.startswith("/v1/messages")
                    body = json.loads(raw) if raw else None
                    sent = relay.rewrite(body) if self.command == "POST" else None
                    data = json.dumps(sent).encode() if sent is not None else raw
                    before = counters(scrape(relay.vllm_url)) if self.command == "POST" else None
                    ttft = self._stream(data)
                    if before is not None and isinstance(sent, dict):
                        relay.served.append(served(relay.vllm_url, self.path, sent, before, ttft))
                        if relay.verbose:
                            r = relay.served[-1]
                            print(f"  {r.path}: prompt {r.prompt}, output {r.output}, cached {r.hits}", file=sys.stderr)

            def _stream(self, data) -> float:
                start = time.monotonic()
                conn = http.client.HTTPConnection(relay.vllm.hostname or "127.0.0.1", relay.vllm.port, timeout=600)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
                conn.request(self.command, self.path, body=data, headers=headers)
                resp = conn.getresponse()
                self.send_response(resp.status)
                for name, value in resp.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(name, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                ttft = 0.0
                while chunk := resp.read1(65536):
                    ttft = ttft or (time.monotonic() - start if b"delta" in chunk else 0.0)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                conn.close()
                return ttft or time.monotonic() - start

        return Handler


def served(vllm: str, path: str, body: dict, before: dict, ttft: float) -> Served:
    """The request's counter deltas, once vLLM has counted it (its counters move as its last output is sent)."""
    deadline = time.monotonic() + 10
    while True:
        after = counters(scrape(vllm))
        if after[COUNTERS[0]] > before[COUNTERS[0]] or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    d = {k: int(after[k] - before[k]) for k in COUNTERS}
    return Served(path, body, d[COUNTERS[0]], d[COUNTERS[1]], d[COUNTERS[2]], d[COUNTERS[3]], ttft)


# ---- the session ------------------------------------------------------------------------------

@dataclass
class Session:
    name: str
    api: str              # messages | responses
    body: dict            # the request fields every turn sends (model, tools, system or instructions, ...)
    turns: list[dict]     # {"user": text, "calls": [[call, ...] per forced round]}
    searches: dict        # query -> {"results": [[url, title, snippet]], "unresponsive": [[engine, why]]}
    pages: dict           # path -> text
    proxy_env: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Session:
        try:
            data = json.loads(path.read_text())
            return cls(data["name"], data["api"], data["body"], data["turns"], data.get("searches", {}),
                       data.get("pages", {}), data.get("proxy_env", {}))
        except (OSError, ValueError, KeyError) as e:
            die(f"cannot read session {path}: {e}")
            raise


def placed(value, site: str):
    """The session's data with {site} (the stand-in web's address) filled in."""
    return json.loads(json.dumps(value).replace("{site}", site))


def nonce_system(session: Session, body: dict, nonce: str) -> dict:
    key = "instructions" if session.api == "responses" else "system"
    return {**body, key: f"[run {nonce}] {body.get(key) or ''}"}


def user_item(session: Session, text: str) -> dict:
    if session.api == "responses":
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"role": "user", "content": text}


def read_sse(resp) -> tuple[float, list[dict]]:
    """(seconds to the first model token event, every event's JSON) of a streamed reply."""
    start, ttft, events, buf = time.monotonic(), 0.0, [], b""
    while chunk := resp.read1(65536):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                if not ttft and b"delta" in line:
                    ttft = time.monotonic() - start
                events.append(json.loads(line[6:]))
    return ttft, events


def assistant_of(session: Session, events: list[dict]) -> list[dict]:
    """What the client sends back of a reply: Anthropic's content blocks, or the Responses output items."""
    if session.api == "responses":
        done = [e for e in events if e.get("type") == "response.completed"]
        return done[-1]["response"]["output"] if done else []
    blocks: dict[int, dict] = {}
    for e in events:
        if e.get("type") == "content_block_start":
            blocks[e["index"]] = dict(e["content_block"])
        elif e.get("type") == "content_block_delta":
            b, d = blocks[e["index"]], e["delta"]
            for kind, key in (("text_delta", "text"), ("thinking_delta", "thinking"), ("signature_delta", "signature"),
                              ("input_json_delta", "partial_json")):
                if d.get("type") == kind:
                    b[key] = b.get(key, "") + d.get(key, "")
    for b in blocks.values():
        if "partial_json" in b:
            b["input"] = json.loads(b.pop("partial_json") or "{}")
    return [{"role": "assistant", "content": [blocks[i] for i in sorted(blocks)]}]


def run_turns(session: Session, proxy_url: str, relay: Relay, nonce: str) -> list[tuple[int, float]]:
    """The session's turns through the proxy, each with the history the client keeps; (vLLM requests, ttft) each."""
    key = "input" if session.api == "responses" else "messages"
    path = "/v1/responses" if session.api == "responses" else "/v1/messages"
    history: list[dict] = []
    out = []
    for turn in session.turns:
        relay.rounds, relay.answer = [list(r) for r in turn.get("calls", [])], turn.get("answer")
        history.append(user_item(session, turn["user"]))
        body = {**nonce_system(session, session.body, nonce), key: history, "stream": True}
        before = len(relay.served)
        ttft, events = post(proxy_url, path, body)
        with relay.lock:  # the relay reads vLLM's counters for the turn's last request before it lets go
            pass
        history += assistant_of(session, events)
        out.append((len(relay.served) - before, ttft))
    return out


def post(base: str, path: str, body: dict) -> tuple[float, list[dict]]:
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=600)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                               "x-api-key": "bench", "anthropic-version": "2023-06-01"})
        resp = conn.getresponse()
        if resp.status != 200:
            die(f"{path} answered {resp.status}: {resp.read()[:300]!r}")
        return read_sse(resp)
    except OSError as e:
        die(f"cannot reach {base}: {e}")
        raise
    finally:
        conn.close()


def direct(vllm: str, recorded: list[Served], old: str, new: str, relay: Relay) -> list[Served]:
    """The proxy's requests again, straight to vLLM (through the relay for the counters), with another nonce."""
    relay.force, relay.rounds, relay.answer = None, [], None  # the recorded bodies carry what forced them
    start = len(relay.served)
    for r in recorded:
        body = json.loads(json.dumps(r.body).replace(f"[run {old}]", f"[run {new}]"))
        post(relay.url, r.path, {**body, "stream": True})
        with relay.lock:  # its counters read
            pass
    return relay.served[start:]


# ---- the figures ------------------------------------------------------------------------------

def ideal(prev: Served | None, cur: Served, block: int, outputs: bool = True) -> int:
    """The tokens a perfect prefix cache serves `cur` from: the previous request's prompt and output (all but the
    last output token, which was never fed back), at most all of `cur`'s prompt but its last token (vLLM always
    computes one), in whole blocks. `outputs` False counts the previous prompt alone: a random model made to write
    a text under a grammar (--force) spells it with other tokens than the tokenizer would, so no re-rendering of
    its turn can match its output's tokens; every replayed result and every earlier turn's thinking is in the
    previous prompt, so a miss of the proxy's still shows."""
    if prev is None:
        return 0
    seen = prev.prompt + (prev.output - 1 if outputs else 0)
    return min(seen, cur.prompt - 1) // block * block


def turn_rows(served_: list[Served], per_turn: list[int], ttfts: list[float], block: int, outputs: bool) -> list[dict]:
    rows, i, prev = [], 0, None
    for n, (count, ttft) in enumerate(zip(per_turn, ttfts, strict=True), 1):
        reqs = served_[i:i + count]
        i += count
        ideals, hits = [], []
        for r in reqs:
            ideals.append(ideal(prev, r, block, outputs))
            hits.append(min(r.hits, ideals[-1]))
            prev = r
        rows.append({"turn": n, "requests": count, "prompt": sum(r.prompt for r in reqs),
                     "cached": sum(r.hits for r in reqs), "ideal": sum(ideals), "ttft": ttft,
                     "ratio": (sum(hits) / sum(ideals)) if sum(ideals) else 1.0,
                     "each": [{"prompt": r.prompt, "output": r.output, "cached": r.hits, "ideal": i, "body": r.body}
                              for r, i in zip(reqs, ideals, strict=True)]})
    return rows


def run_session(session: Session, vllm: str, force: dict | None, work: Path, verbose: bool = False) -> dict:
    with SearxngStandIn() as searxng, WebSite() as site, Relay(vllm, force) as relay:
        relay.verbose = verbose
        for query, spec in placed(session.searches, site.url).items():
            searxng.behave(query, "results", results=[result(*r) for r in spec["results"]],
                           unresponsive=[tuple(u) for u in spec.get("unresponsive", [])])
        for path, text in session.pages.items():
            site.route(path, text, headers={"Content-Type": "text/plain; charset=utf-8"})
        session.turns = placed(session.turns, site.url)
        env = {"BACKEND_URL": relay.url, "SEARXNG_URL": searxng.url, "WEB_FETCH_ALLOWED_NETWORKS": "127.0.0.0/8",
               "KEEPALIVE_INTERVAL": "5", **session.proxy_env}
        proxy = ProxyProcess(env, work / f"proxy-{session.name}.log")
        try:
            nonce = uuid.uuid4().hex[:8]
            turns = run_turns(session, proxy.url, relay, nonce)
        finally:
            proxy.stop()
        via_proxy = list(relay.served)
        block = block_size(scrape(vllm))
        again = direct(vllm, via_proxy, nonce, uuid.uuid4().hex[:8], relay)
    counts = [c for c, _ in turns]
    direct_ttfts = [sum(r.ttft for r in again[sum(counts[:k]):sum(counts[:k + 1])][:1]) for k in range(len(counts))]
    outputs = force is None
    return {"session": session.name, "api": session.api, "block": block,
            "ideal": "previous prompt and output" if outputs else "previous prompt (forced outputs)",
            "proxy": turn_rows(via_proxy, counts, [t for _, t in turns], block, outputs),
            "direct": turn_rows(again, counts, direct_ttfts, block, outputs)}


def print_report(report: dict) -> None:
    print(f"\nsession {report['session']} ({report['api']}), vLLM cache block {report['block']} tokens, "
          f"ideal: {report['ideal']}")
    print(f"{'turn':>4} {'via':<7}{'requests':>9}{'prompt':>8}{'cached':>8}{'ideal':>8}{'hit/ideal':>10}{'ttft s':>8}")
    for via in ("proxy", "direct"):
        for r in report[via]:
            print(f"{r['turn']:>4} {via:<7}{r['requests']:>9}{r['prompt']:>8}{r['cached']:>8}{r['ideal']:>8}"
                  f"{r['ratio']:>10.3f}{r['ttft']:>8.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", required=True, help="vLLM's base URL, e.g. http://127.0.0.1:18080")
    ap.add_argument("--session", action="append", type=Path,
                    help="a recorded session (default: every tests/data/sessions/*.json)")
    ap.add_argument("--force", metavar="TOKENIZER_JSON", type=Path,
                    help="a test model's tokenizer.json: make the model make the session's calls (tests/real_vllm)")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON (with each vLLM request's body)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each vLLM request's figures as it is served")
    args = ap.parse_args(argv)
    force = None
    if args.force:
        try:
            added = {t["content"]: t["id"] for t in json.loads(args.force.read_text())["added_tokens"]}
            force = {"bias": {str(added[t]): 100 for t in ("<tool_call>", "</tool_call>")}}
        except (OSError, ValueError, KeyError) as e:
            die(f"--force: cannot read the tokenizer's <tool_call> tokens from {args.force}: {e}")
    try:
        scrape(args.vllm)
    except OSError as e:
        die(f"cannot reach vLLM at {args.vllm}: {e}")
    reports = []
    with tempfile.TemporaryDirectory(prefix="session-bench-") as work:
        for path in args.session or sorted(SESSIONS.glob("*.json")):
            reports.append(run_session(Session.load(path), args.vllm, force, Path(work), args.verbose))
            print_report(reports[-1])
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
