"""Captures what the real Claude Code and Codex send, for tests/data; run
`~/.cache/coding-stack-tests/venv-*/bin/python -m scripts.capture_agent_wire --agents-bin DIR --out DIR [scenario ...]`
from the repository root after tests/run.sh has installed the agents (DIR is an agents-*/node_modules/.bin folder).

Each scenario runs one agent the way its end-to-end test does (tests/test_claude_code.py,
tests/test_codex.py): the stand-in model and SearXNG, the real proxy under gunicorn, and in
front of the proxy a recording relay (standins/recorder.py) that keeps every request
exactly as the agent sent it. Scenarios: claude-websearch, claude-webfetch (a loopback HTTPS page,
skipWebFetchPreflight), codex-websearch (the hosted tool), codex-alpha-search (standalone search:
Codex's own POST /v1/alpha/search). One JSON file per scenario: a list of
{method, target, headers, body, status, response (JSON answers only)}. Loopback only. Compare two versions' files with
`--compare OLD_DIR NEW_DIR`, which prints the differences in headers, body keys, tools and
betas per request shape.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from standins.proxy_process import ProxyProcess
from standins.recorder import Recorder
from standins.scripted_backend import ScriptedBackend
from standins.searxng import SearxngStandIn

# The scenarios drive the agents with their end-to-end tests' own code, imported on use from the tests namespace
# package (the root is on the path): test_claude_code.py and test_codex.py import only the stdlib, pytest and standins.


class Shim:
    """What tests/test_codex.run_codex needs of a proxy: a URL (the relay's) and the proxy's log."""

    def __init__(self, url, proxy):
        self.url, self.log = url, proxy.log


def claude_websearch(rec, backend, proxy, tmp):
    from tests import test_claude_code as t
    backend.responder = t.StandInModel()
    t.run_claude(rec.url, "Search the web: what is new in vLLM 0.32?",
                 {"ANTHROPIC_MODEL": "foundation", "ANTHROPIC_SMALL_FAST_MODEL": "foundation"})


def claude_webfetch(rec, backend, proxy, tmp):
    from tests import test_claude_code as t
    pages = t.tls_site(Path(tmp))
    try:
        url = pages.url + "/notes"
        backend.responder = t.WebFetchModel(url)
        t.run_claude(rec.url, f"Fetch {url} and tell me the magic word.",
                     {"ANTHROPIC_MODEL": "foundation", "ANTHROPIC_SMALL_FAST_MODEL": "foundation",
                      "NODE_EXTRA_CA_CERTS": str(pages.ca_file)},
                     allowed="WebFetch", args=("--settings", t.SKIP_PREFLIGHT))
    finally:
        pages.close()


def codex_websearch(rec, backend, proxy, tmp):
    from tests import test_codex as t
    backend.responder = t.stand_in_model
    proc, _, diagnostics = t.run_codex(Shim(rec.url, proxy), Path(tmp), "--ephemeral",
                                       "What changed in vLLM 0.32? Search the web.")
    assert proc.returncode == 0, diagnostics


def codex_alpha_search(rec, backend, proxy, tmp):
    """Codex with supports_standalone_web_search: its web.run call becomes POST /v1/alpha/search."""
    from standins.web_pages import WebSite
    from tests import test_codex as t
    site = WebSite()
    site.route("/notes", t.DOC)
    try:
        backend.responder = t.standalone_model(f"http://127.0.0.1:{site.port}/notes")
        proc, _, diagnostics = t.run_codex(Shim(rec.url, proxy), Path(tmp), "--ephemeral",
                                           "What changed in vLLM 0.32? Search the web.",
                                           config=t.standalone_config(rec.url))
        assert proc.returncode == 0, diagnostics
    finally:
        site.close()


SCENARIOS = {"claude-websearch": claude_websearch, "claude-webfetch": claude_webfetch, "codex-websearch": codex_websearch,
             "codex-alpha-search": codex_alpha_search}


def capture(agents_bin: str, out: Path, names: list[str]):
    os.environ["AGENTS_BIN"] = agents_bin
    out.mkdir(parents=True, exist_ok=True)
    backend, searxng = ScriptedBackend(), SearxngStandIn()
    work = Path(tempfile.mkdtemp(prefix="capture-"))
    proxy = ProxyProcess({"BACKEND_URL": backend.url, "SEARXNG_URL": searxng.url, "KEEPALIVE_INTERVAL": "0.2",
                          "WEB_FETCH_ALLOWED_NETWORKS": "127.0.0.0/8"}, work / "proxy.log")
    try:
        for name in names:
            backend.reset()
            searxng.reset()
            rec = Recorder(upstream=proxy.url)
            try:
                SCENARIOS[name](rec, backend, proxy, tempfile.mkdtemp(dir=work))
            finally:
                rec.close()
            path = out / f"{name}.json"
            path.write_text(json.dumps([r.as_dict() for r in rec.received], indent=1, ensure_ascii=False) + "\n")
            print(f"{path}: {len(rec.received)} requests", file=sys.stderr)
    finally:
        proxy.stop()
        backend.close()
        searxng.close()


def shape(record: dict) -> str:
    """A name for a request that stays the same across versions: path plus what kind of call it is."""
    body = record.get("body")
    if not isinstance(body, dict):
        body = {}
    tools = [t.get("name") or t.get("type") for t in body.get("tools") or []]
    kind = "search-subrequest" if tools == ["web_search"] else f"{len(tools)} tools"
    return f"{record['method']} {record['target'].split('?')[0]} ({kind})"


def describe(records: list[dict]) -> dict:
    """Per request shape: header names, top-level body keys, tool names/types, betas, query string."""
    out: dict[str, dict] = {}
    for r in records:
        body = r.get("body")
        if not isinstance(body, dict):
            body = {}
        d = out.setdefault(shape(r), {"count": 0, "headers": set(), "keys": set(), "tools": set(), "betas": set(),
                                      "targets": set(), "values": {}})
        d["count"] += 1
        d["targets"].add(r["target"])
        d["headers"] |= {n.lower() for n, _ in r["headers"]}
        d["keys"] |= set(body)
        d["tools"] |= {f"{t.get('type', 'custom')}:{t.get('name', '')}" for t in body.get("tools") or []}
        for n, v in r["headers"]:
            if n.lower() == "anthropic-beta":
                d["betas"] |= set(v.split(","))
            if n.lower() in ("user-agent", "anthropic-version", "originator", "version", "x-stainless-package-version"):
                d["values"].setdefault(n.lower(), set()).add(v)
        for k in ("tool_choice", "thinking", "reasoning", "include", "text", "output_config", "context_management"):
            if k in body:
                d["values"].setdefault(k, set()).add(json.dumps(body[k], sort_keys=True))
    return out


def compare(old_dir: Path, new_dir: Path):
    for new_file in sorted(new_dir.glob("*.json")):
        old_file = old_dir / new_file.name
        if not old_file.exists():
            print(f"== {new_file.name}: no old capture")
            continue
        old, new = describe(json.loads(old_file.read_text())), describe(json.loads(new_file.read_text()))
        print(f"== {new_file.name}")
        for s in sorted(set(old) | set(new)):
            a, b = old.get(s), new.get(s)
            if a is None or b is None:
                print(f"  {s}: only in {'new' if a is None else 'old'}")
                continue
            lines = []
            if a["count"] != b["count"]:
                lines.append(f"count {a['count']} -> {b['count']}")
            for k in ("targets", "headers", "keys", "tools", "betas"):
                if a[k] != b[k]:
                    lines.append(f"{k}: -{sorted(a[k] - b[k])} +{sorted(b[k] - a[k])}")
            for k in sorted(set(a["values"]) | set(b["values"])):
                if a["values"].get(k) != b["values"].get(k):
                    lines.append(f"{k}: {sorted(a['values'].get(k, ()))} -> {sorted(b['values'].get(k, ()))}")
            print(f"  {s}:" + ("".join(f"\n    {x}" for x in lines) if lines else " same"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents-bin", help="an agents-*/node_modules/.bin folder")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("OLD_DIR", "NEW_DIR"))
    ap.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not (args.agents_bin and args.out):
        ap.error("--agents-bin and --out are needed to capture")
    capture(args.agents_bin, args.out, args.scenarios)


if __name__ == "__main__":
    main()
