"""The engine of ./benchmark.sh: measures TTFT, decode and prefill rates of an OpenAI-compatible streaming chat endpoint by vLLM's own benchmark definitions; run it through `./benchmark.sh [options]` (`-h` there lists the options), or as `python3 scripts/benchmark.py [options]`."""

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import sys
import time
import urllib.parse

PROG = "benchmark.sh"
DEFAULT_URL = "http://localhost:18080"

# A fixed short prompt, so the TTFT case hits the prefix cache after its warm-up ("warm").
# Its length in tokens is whatever the server's tokenizer makes of it; the table shows it.
SHORT_PROMPT = (
    "You are helping a developer who maintains a small local language model serving stack. "
    "Write a detailed, well organised explanation of how a streaming chat completion travels "
    "from the client through an OpenAI compatible proxy to the inference server and back, "
    "covering request parsing, scheduling, prefill, decoding, server-sent events and the "
    "final usage report."
)

# Filler for the long prefill prompt. Ordinary English words are about one token each in
# the common tokenizers; the exact ratio is measured (calibrate) rather than assumed.
FILLER = (
    "the of and to in is was for on are with as by at from that this which have has been "
    "model server token prompt cache memory card speed layer weight value query key batch "
    "river mountain garden window table paper music light water stone forest city market "
    "quick green silent bright heavy gentle early simple careful distant ancient modern "
    "build measure write read carry open close follow change answer travel gather return"
).split()

METRIC_LABELS = {
    "ttft_s": "TTFT (s)",
    "decode_tok_s": "decode (tok/s)",
    "prefill_tok_s": "prefill (tok/s)",
    "latency_s": "wall (s)",
}


class BenchError(Exception):
    """A failure that ends the benchmark with its message and exit status 1."""


def die(msg, code=1):
    print("%s: %s" % (PROG, msg), file=sys.stderr)
    sys.exit(code)


def note(msg):
    print("%s: %s" % (PROG, msg), file=sys.stderr, flush=True)


class Endpoint:
    """One OpenAI-compatible base URL, with the requests the benchmark makes of it."""

    def __init__(self, url, label, api_key, timeout):
        parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchError("not an http(s) URL: %s" % url)
        self.label = label
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        try:
            self.port = parts.port or (443 if self.https else 80)
        except ValueError:
            raise BenchError("bad port in URL: %s" % url) from None
        # Accept the base with or without /v1, as users copy either from docs.
        path = parts.path.rstrip("/")
        if not path.endswith("/v1"):
            path += "/v1"
        self.base_path = path
        self.url = "%s://%s:%d%s" % (parts.scheme, self.host, self.port, path)
        self.api_key = api_key
        self.timeout = timeout
        self.requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def _connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        try:
            conn.connect()
        except OSError as exc:
            raise BenchError("cannot reach %s: %s" % (self.url, describe_oserror(exc))) from None
        # Small request bodies must leave at once; Nagle's algorithm would add its delay to TTFT.
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _headers(self):
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        return headers

    def list_models(self):
        """The served model entries, or None when the endpoint has no /v1/models."""
        conn = self._connect()
        try:
            conn.request("GET", self.base_path + "/models", headers=self._headers())
            resp = conn.getresponse()
            body = resp.read()
        except OSError as exc:
            raise BenchError("cannot reach %s: %s" % (self.url, describe_oserror(exc))) from None
        finally:
            conn.close()
        if resp.status in (404, 405):
            return None
        if resp.status != 200:
            raise http_error(self, resp.status, body)
        try:
            data = json.loads(body)["data"]
            return [m for m in data if isinstance(m, dict) and "id" in m]
        except (ValueError, KeyError, TypeError):
            raise BenchError("%s/models did not answer an OpenAI model list" % self.url) from None

    def stream_chat(self, body):
        """Sends one streaming chat request and times it; returns the run's measurements."""
        payload = json.dumps(body).encode()
        headers = dict(self._headers(), **{"Content-Type": "application/json",
                                           "Accept": "text/event-stream"})
        conn = self._connect()
        try:
            # The clock starts after the TCP connect: vLLM's benchmark reuses pooled
            # connections, so a connect is not part of what it calls TTFT either.
            start = time.perf_counter()
            conn.request("POST", self.base_path + "/chat/completions", body=payload, headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise http_error(self, resp.status, resp.read())
            return self._read_stream(resp, start)
        except TimeoutError:
            raise BenchError("%s sent nothing for %g s (raise --timeout for slow prefill)"
                             % (self.url, self.timeout)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise BenchError("connection to %s failed mid-request: %s" % (self.url, describe_oserror(exc))) from None
        finally:
            conn.close()

    def _read_stream(self, resp, start):
        ttft = last = usage = None
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            now = time.perf_counter()
            line = line.strip()
            # SSE comments (": keep-alive") and non-data fields carry no tokens.
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise BenchError("%s sent a stream frame that is not JSON: %r" % (self.url, data[:200])) from None
            if isinstance(chunk.get("error"), dict):
                raise BenchError("%s reported an error mid-stream: %s"
                                 % (self.url, chunk["error"].get("message", chunk["error"])))
            last = now
            if ttft is None:
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    # The role chunk's content "" is no token; reasoning_content is the
                    # pre-0.16 vLLM name of reasoning.
                    if any(delta.get(k) for k in ("content", "reasoning", "reasoning_content")):
                        ttft = now - start
                        break
            if chunk.get("usage"):
                usage = chunk["usage"]
        if not done:
            raise BenchError("the stream from %s ended before data: [DONE]" % self.url)
        if usage is None or not isinstance(usage.get("completion_tokens"), int):
            raise BenchError("usage missing: %s sent no usage chunk despite stream_options.include_usage, "
                             "so completion_tokens (needed for the decode rate) is unknown" % self.url)
        if ttft is None:
            raise BenchError("%s streamed no token (no reasoning or content delta)" % self.url)
        latency = last - start
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = usage["completion_tokens"]
        self.requests += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        details = usage.get("completion_tokens_details") or {}
        return {
            "ttft_s": ttft,
            "latency_s": latency,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "reasoning_tokens": details.get("reasoning_tokens"),
            # vLLM's definition: the inverse of its TPOT, the first token excluded.
            "decode_tok_s": (completion - 1) / (latency - ttft) if completion > 1 and latency > ttft else None,
            "prefill_tok_s": prompt / ttft if prompt and ttft > 0 else None,
        }


def describe_oserror(exc):
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the server up? vLLM refuses connections while the model loads)"
    if isinstance(exc, socket.gaierror):
        return "unknown host (%s)" % (exc.strerror or exc)
    if isinstance(exc, socket.timeout):
        return "timed out"
    return str(exc) or type(exc).__name__


def http_error(ep, status, body):
    try:
        err = json.loads(body)
    except ValueError:
        err = None
    message = None
    if isinstance(err, dict):
        inner = err.get("error")
        if isinstance(inner, dict):
            message = inner.get("message")
        elif isinstance(inner, str):
            message = inner
        message = message or err.get("detail") or err.get("message")
    if message is None:
        message = body.decode("utf-8", "replace").strip()[:300] or "(empty body)"
    if status == 404 and isinstance(err, dict) and isinstance(err.get("error"), dict) \
            and (err["error"].get("param") == "model" or err["error"].get("type") == "NotFoundError"):
        return BenchError("model not found at %s: %s" % (ep.url, message))
    if status == 401:
        return BenchError("%s answered 401 Unauthorized (%s): pass --api-key or set VLLM_API_KEY"
                          % (ep.url, message))
    return BenchError("%s answered HTTP %d: %s" % (ep.url, status, message))


def long_prompt(words):
    """A prompt that no earlier request shares a prefix with, so prefix caching can't skip the prefill."""
    nonce = os.urandom(8).hex()
    rng = random.Random(nonce)
    # The nonce goes first: prefix caching matches from the start, so a late difference
    # would still let every block before it hit the cache.
    return "Request %s. Summarise the following notes in one sentence. %s" % (
        nonce, " ".join(rng.choice(FILLER) for _ in range(words)))


def request_body(args, prompt, tokens):
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM's extra sampling parameters: exactly `tokens` tokens, whatever the model wants.
        "max_tokens": tokens,
        "min_tokens": tokens,
        "ignore_eos": True,
    }
    if not args.thinking:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return body


def calibrate_words(args, ep):
    """How many filler words make a prompt of --prefill-tokens tokens on this server's tokenizer."""
    small, large = 50, 550
    counts = []
    for words in (small, large):
        run = ep.stream_chat(request_body(args, long_prompt(words), 1))
        counts.append(run["prompt_tokens"])
    per_word = (counts[1] - counts[0]) / float(large - small)
    if per_word <= 0:
        raise BenchError("%s reports the same prompt_tokens for prompts of different lengths; "
                         "cannot size the prefill prompt" % ep.url)
    overhead = counts[0] - small * per_word
    words = max(1, int(round((args.prefill_tokens - overhead) / per_word)))
    note("prefill prompt: %d words for about %d tokens (%.2f tokens/word measured)"
         % (words, args.prefill_tokens, per_word))
    return words


class Case:
    def __init__(self, name, tokens, metrics, prompt_fn):
        self.name = name
        self.tokens = tokens
        self.metrics = metrics  # shown in the table; every metric goes to the JSON
        self.prompt_fn = prompt_fn


def build_cases(args, prefill_words):
    cases = []
    if "ttft" in args.cases:
        cases.append(Case("ttft", args.ttft_tokens, ["ttft_s"], lambda: SHORT_PROMPT))
    if "decode" in args.cases:
        for n in args.decode_tokens:
            cases.append(Case("decode-%d" % n, n, ["decode_tok_s"], lambda: SHORT_PROMPT))
    if "prefill" in args.cases:
        cases.append(Case("prefill", args.prefill_output, ["prefill_tok_s", "latency_s"],
                          lambda: long_prompt(prefill_words)))
    return cases


def fmt_value(metric, value):
    if value is None:
        return "-"
    if metric in ("ttft_s", "latency_s"):
        return "%.3f" % value if value < 10 else "%.1f" % value
    return "%.1f" % value if value < 1000 else "%.0f" % value


def progress(ep, compare, case, tag, run):
    parts = ["ttft %.3f s" % run["ttft_s"],
             "%d+%d tok in %.2f s" % (run["prompt_tokens"], run["completion_tokens"], run["latency_s"])]
    if run["decode_tok_s"] is not None:
        parts.append("decode %.1f tok/s" % run["decode_tok_s"])
    if case.name == "prefill" and run["prefill_tok_s"] is not None:
        parts.append("prefill %.0f tok/s" % run["prefill_tok_s"])
    who = "%s " % ep.label if compare else ""
    print("%s%s %s: %s" % (who, case.name, tag, ", ".join(parts)), file=sys.stderr, flush=True)


def summarise(runs):
    out = {}
    for key in ("ttft_s", "latency_s", "decode_tok_s", "prefill_tok_s", "prompt_tokens", "completion_tokens"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = ({"median": statistics.median(values), "min": min(values), "max": max(values)}
                    if values else None)
    out["runs"] = runs
    return out


def run_benchmark(args, endpoints):
    compare = len(endpoints) > 1
    prefill_words = calibrate_words(args, endpoints[0]) if "prefill" in args.cases else 0
    results = []
    for case in build_cases(args, prefill_words):
        runs: dict[str, list] = {ep.label: [] for ep in endpoints}
        warned = set()
        schedule = [("warm-up %d/%d" % (i + 1, args.warmup), False) for i in range(args.warmup)]
        schedule += [("run %d/%d" % (i + 1, args.runs), True) for i in range(args.runs)]
        for tag, measured in schedule:
            # A, B, A, B: both endpoints see the same drift (thermals, other load) over time.
            for ep in endpoints:
                run = ep.stream_chat(request_body(args, case.prompt_fn(), case.tokens))
                progress(ep, compare, case, tag, run)
                if run["completion_tokens"] != case.tokens and ep.label not in warned:
                    warned.add(ep.label)
                    note("warning: %s%s asked for exactly %d tokens and got %d; the endpoint seems to ignore "
                         "ignore_eos/min_tokens, so this case is not the length its name says"
                         % ("%s " % ep.label if compare else "", case.name, case.tokens, run["completion_tokens"]))
                if measured:
                    runs[ep.label].append(run)
        entry = {"name": case.name, "max_tokens": case.tokens, "metrics": case.metrics,
                 "results": {label: summarise(r) for label, r in runs.items()}}
        if compare:
            a, b = entry["results"]["A"], entry["results"]["B"]
            entry["ratio_b_over_a"] = {
                key: (b[key]["median"] / a[key]["median"] if a[key] and b[key] and a[key]["median"] else None)
                for key in ("ttft_s", "latency_s", "decode_tok_s", "prefill_tok_s")}
        results.append(entry)
    return results


def print_table(args, endpoints, results):
    compare = len(endpoints) > 1
    out = sys.stdout
    for ep in endpoints:
        out.write("%s%s\n" % ("%s = " % ep.label if compare else "endpoint ", ep.url))
    out.write("model %s, thinking %s, median of %d runs after %d warm-up%s; [min-max]\n\n"
              % (args.model, "on" if args.thinking else "off", args.runs, args.warmup,
                 "" if args.warmup == 1 else "s"))
    header = ["case", "prompt", "output", "metric"]
    header += ["A", "B", "B/A"] if compare else ["median", "[min-max]"]
    rows = []
    for entry in results:
        first = entry["results"]["A"]
        prompt = "%d" % first["prompt_tokens"]["median"]
        output = "%d" % first["completion_tokens"]["median"]
        for metric in entry["metrics"]:
            row = [entry["name"], prompt, output, METRIC_LABELS[metric]]
            if compare:
                for label in ("A", "B"):
                    s = entry["results"][label][metric]
                    row.append("%s [%s-%s]" % (fmt_value(metric, s["median"]), fmt_value(metric, s["min"]),
                                               fmt_value(metric, s["max"])) if s else "-")
                ratio = entry["ratio_b_over_a"][metric]
                row.append("%.3f" % ratio if ratio is not None else "-")
            else:
                s = first[metric]
                row += [fmt_value(metric, s["median"]) if s else "-",
                        "[%s-%s]" % (fmt_value(metric, s["min"]), fmt_value(metric, s["max"])) if s else "-"]
            rows.append(row)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for r in [header] + rows:
        cells = [c.ljust(w) if i in (0, 3) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.write("  ".join(cells).rstrip() + "\n")
    if compare:
        out.write("\nB/A is the ratio of medians: above 1 means B takes longer (TTFT, wall) or is faster (rates).\n")


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a whole number: %r" % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more: %r" % text)
    return value


def nonnegative_int(text):
    return 0 if text.strip() == "0" else positive_int(text)


def token_list(text):
    values = [positive_int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError("need token counts of 2 or more (a decode rate needs two tokens): %r"
                                         % text)
    return values


def case_list(text):
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in ("ttft", "decode", "prefill")]
    if unknown or not names:
        raise argparse.ArgumentTypeError("cases are ttft, decode, prefill; got %r" % text)
    return names


class Parser(argparse.ArgumentParser):
    def error(self, message):
        die("%s (see %s -h)" % (message, PROG), 2)


def parse_args(argv):
    # The option reference lives in benchmark.sh's header (its -h), so help here is suppressed.
    p = Parser(prog=PROG, add_help=False)
    p.add_argument("--url", default=DEFAULT_URL)
    p.add_argument("--model", default="foundation")
    p.add_argument("--compare", metavar="URL2")
    p.add_argument("--runs", type=positive_int, default=5)
    p.add_argument("--warmup", type=nonnegative_int, default=1)
    p.add_argument("--cases", type=case_list, default=["ttft", "decode", "prefill"])
    p.add_argument("--ttft-tokens", type=positive_int, default=16)
    p.add_argument("--decode-tokens", type=token_list, default=[300, 1000])
    p.add_argument("--prefill-tokens", type=positive_int, default=9000)
    p.add_argument("--prefill-output", type=positive_int, default=32)
    p.add_argument("--thinking", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY") or None)
    args = p.parse_args(argv)
    if args.timeout <= 0:
        p.error("--timeout must be above 0")
    return args


def check_endpoint(args, ep):
    """Fails before any timing when the server is down, lacks the model or can't fit the cases."""
    models = ep.list_models()
    if models is None:
        return  # no model list (some OpenAI facades): the first chat request will tell
    ids = [m["id"] for m in models]
    if args.model not in ids:
        raise BenchError("model not found at %s: it serves %s, not `%s` (use --model)"
                         % (ep.url, ", ".join(ids) or "no models", args.model))
    limit = next((m.get("max_model_len") for m in models if m["id"] == args.model), None)
    if not isinstance(limit, int):
        return
    # 200 tokens is a generous bound for SHORT_PROMPT in any chat template.
    needs = []
    if "ttft" in args.cases:
        needs.append(("ttft", 200 + args.ttft_tokens))
    if "decode" in args.cases:
        needs.append(("decode", 200 + max(args.decode_tokens)))
    if "prefill" in args.cases:
        needs.append(("prefill", args.prefill_tokens + args.prefill_output))
    for name, tokens in needs:
        if tokens > limit:
            raise BenchError("the %s case needs about %d tokens of context but %s serves `%s` with max_model_len "
                             "%d; lower --prefill-tokens/--decode-tokens or leave the case out with --cases"
                             % (name, tokens, ep.url, args.model, limit))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        endpoints = [Endpoint(args.url, "A", args.api_key, args.timeout)]
        if args.compare:
            endpoints.append(Endpoint(args.compare, "B", args.api_key, args.timeout))
        for ep in endpoints:
            check_endpoint(args, ep)
        results = run_benchmark(args, endpoints)
    except BenchError as exc:
        die(str(exc))
    except KeyboardInterrupt:
        die("interrupted", 130)
    if args.json:
        json.dump({
            "model": args.model,
            "thinking": args.thinking,
            "runs": args.runs,
            "warmup": args.warmup,
            "endpoints": {ep.label: {"url": ep.url, "requests": ep.requests, "prompt_tokens": ep.prompt_tokens,
                                     "completion_tokens": ep.completion_tokens} for ep in endpoints},
            "cases": results,
        }, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(args, endpoints, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
