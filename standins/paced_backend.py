"""Stand-in for vLLM's OpenAI server that streams chat completions at a known pace (TTFT, gap, prefill rate) in vLLM 0.32's exact SSE framing; run `python3 standins/paced_backend.py --port 0 [--ttft 0.05 --gap 0.01 ...]`, which prints its base URL as the first line on stdout."""

import argparse
import contextlib
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Token texts taken from the captured vLLM streams, so clients see realistic deltas.
WORDS = [" fibe", " upuboda", " goapejo", "wekezi", " wila", " kado", " tuzeane", " edina", " damu", " vabo"]
FINGERPRINT = "vllm-0.32.0-2c37d8d2"


def dumps(obj):
    # vLLM writes compact JSON and leaves non-ASCII as is (see the samples' "\ufffd" deltas).
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def count_prompt_tokens(messages):
    """Whitespace words plus a fixed per-message overhead: a deterministic stand-in for a tokenizer and chat template."""
    total = 3
    for msg in messages or []:
        content = msg.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        total += 4 + len(str(content or "").split())
    return total


class Handler(BaseHTTPRequestHandler):
    server: "Server"
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def setup(self):
        super().setup()
        # Without this, Nagle's algorithm batches the small SSE frames and skews the pace.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):
        pass

    # --- plumbing -------------------------------------------------------------------
    def send_json(self, status, obj):
        body = dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_error_json(self, status, etype, message, param=None):
        self.send_json(status, {"error": {"message": message, "type": etype, "param": param, "code": status}})

    def write_chunk(self, text):
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    # --- endpoints ------------------------------------------------------------------
    def do_GET(self):
        opts = self.server.opts
        if self.path == "/health":
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()
        elif self.path == "/v1/models" and not opts.no_models:
            now = int(time.time())
            self.send_json(200, {"object": "list", "data": [{
                "id": opts.model, "object": "model", "created": now, "owned_by": "vllm",
                "root": "/models/paced-standin", "parent": None, "max_model_len": opts.max_model_len,
                "permission": []}]})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        opts = self.server.opts
        arrived = time.perf_counter()
        length = int(self.headers.get("content-length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            return self.send_error_json(400, "BadRequestError", "Invalid JSON: %s" % exc)
        if self.path != "/v1/chat/completions":
            return self.send_json(404, {"detail": "Not Found"})
        self.server.log_request_body(req)
        if req.get("model") != opts.model:
            return self.send_error_json(
                404, "NotFoundError",
                "The model `%s` does not exist. Valid aliases: %s." % (req.get("model"), opts.model), "model")

        prompt_tokens = count_prompt_tokens(req.get("messages"))
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens")
        if max_tokens is not None and prompt_tokens + max_tokens > opts.max_model_len:
            return self.send_error_json(
                400, "BadRequestError",
                "This model's maximum context length is %d tokens. However, you requested %d tokens "
                "(%d in the messages, %d in the completion). Please reduce the length of the messages or "
                "completion." % (opts.max_model_len, prompt_tokens + max_tokens, prompt_tokens, max_tokens))
        # vLLM's rules for the output length: EOS stops early unless ignore_eos, never before
        # min_tokens, never after max_tokens.
        if req.get("ignore_eos") and not opts.plain_openai:
            n = max_tokens if max_tokens is not None else opts.natural_tokens
        else:
            n = max(opts.natural_tokens, 0 if opts.plain_openai else req.get("min_tokens") or 0)
            if max_tokens is not None:
                n = min(n, max_tokens)
        kwargs = req.get("chat_template_kwargs") or {}
        thinking = kwargs.get("enable_thinking", True) is not False
        n_reasoning = min(n, opts.reasoning_tokens) if thinking else 0
        finish = "length" if max_tokens is not None and n >= max_tokens else "stop"
        ttft = opts.ttft + (prompt_tokens / opts.prefill_rate if opts.prefill_rate else 0.0)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n,
                 "completion_tokens_details": {"reasoning_tokens": n_reasoning}}
        rid = "chatcmpl-" + os.urandom(8).hex()
        created = int(time.time())
        with self.server.seat():
            # Like vLLM with --max-num-seqs: the pace starts when the sequence is scheduled, not when it arrived.
            if self.server.opts.max_num_seqs:
                arrived = time.perf_counter()
            self.server.log_event("start", req)
            self.answer(req, rid, created, arrived, ttft, n, n_reasoning, finish, usage)
            self.server.log_event("end", req)

    def answer(self, req, rid, created, arrived, ttft, n, n_reasoning, finish, usage):
        opts = self.server.opts
        if not req.get("stream"):
            self.pause_until(arrived + ttft + (n - 1) * opts.gap)
            text = [WORDS[i % len(WORDS)] for i in range(n)]
            message = {"role": "assistant", "content": "".join(text[n_reasoning:]) if n > n_reasoning else None,
                       "refusal": None, "annotations": None, "audio": None, "function_call": None,
                       "reasoning": "".join(text[:n_reasoning]) or None}
            return self.send_json(200, {
                "id": rid, "object": "chat.completion", "created": created, "model": opts.model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None, "token_ids": None}],
                "service_tier": None, "system_fingerprint": FINGERPRINT, "usage": usage})
        include_usage = bool((req.get("stream_options") or {}).get("include_usage")) and not opts.omit_usage
        try:
            self.stream(rid, created, arrived, ttft, n, n_reasoning, finish, usage if include_usage else None)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left; vLLM aborts the request, and so do we

    def pause_until(self, deadline):
        delay = deadline - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    def stream(self, rid, created, arrived, ttft, n, n_reasoning, finish, usage):
        opts = self.server.opts
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": opts.model}
        # Sent at once rather than with the first token (where vLLM sends it) because some
        # servers and proxies do flush it early: a benchmark must not count it as a token.
        self.write_chunk("data: %s\n\n" % dumps(dict(head, choices=[{
            "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
            prompt_token_ids=None, prompt_text=None)))
        for i in range(n):
            # Deadlines from the arrival time, not sleeps per token, so sleep overshoot on a
            # busy machine doesn't accumulate into a slower pace than configured.
            self.pause_until(arrived + ttft + i * opts.gap)
            if opts.error_after is not None and i == opts.error_after:
                self.write_chunk("data: %s\n\n" % dumps({"error": {
                    "message": "The engine died while generating (simulated)", "type": "InternalServerError",
                    "param": None, "code": 500}}))
                break
            key = "reasoning" if i < n_reasoning else "content"
            choice = {"index": 0, "delta": {key: WORDS[i % len(WORDS)]}, "logprobs": None}
            extra = {}
            if i == n - 1:
                # Key order as vLLM writes it: stop_reason appears on the last token only.
                choice.update(finish_reason=finish, stop_reason=None, token_ids=None)
                if usage is None:
                    extra["system_fingerprint"] = FINGERPRINT
            else:
                choice.update(finish_reason=None, token_ids=None)
            self.write_chunk("data: %s\n\n" % dumps(dict(head, choices=[choice], **extra)))
        else:
            if usage is not None:
                self.write_chunk("data: %s\n\n" % dumps(dict(head, choices=[], usage=usage,
                                                              system_fingerprint=FINGERPRINT)))
        self.write_chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, opts):
        super().__init__((opts.host, opts.port), Handler)
        self.opts = opts
        self._log_lock = threading.Lock()
        # --max-num-seqs: sequences generate N at a time, the rest wait first come first served, as in vLLM's
        # scheduler (its default policy is FCFS).
        self._gate = threading.Condition()
        self._next = 0      # the next ticket to be handed out
        self._serving = 0   # tickets below this one have been let in
        self._running = 0

    @contextlib.contextmanager
    def seat(self):
        limit = self.opts.max_num_seqs
        if not limit:
            yield
            return
        with self._gate:
            ticket = self._next
            self._next += 1
            while ticket != self._serving or self._running >= limit:
                self._gate.wait()
            self._serving += 1
            self._running += 1
            self._gate.notify_all()
        try:
            yield
        finally:
            with self._gate:
                self._running -= 1
                self._gate.notify_all()

    def log_event(self, what, req):
        """--events: a JSON line per sequence started and ended, with the request's `user` (the tests' label)."""
        if not self.opts.events:
            return
        with self._log_lock, open(self.opts.events, "a", encoding="utf-8") as f:
            f.write(dumps({"t": time.time(), "event": what, "user": req.get("user")}) + "\n")

    def log_request_body(self, req):
        if not self.opts.log:
            return
        with self._log_lock, open(self.opts.log, "a", encoding="utf-8") as f:
            f.write(dumps({"t": time.time(), "port": self.server_address[1], "body": req}) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    p.add_argument("--model", default="foundation", help="the served model name")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--ttft", type=float, default=0.05, help="seconds from request to first token")
    p.add_argument("--gap", type=float, default=0.01, help="seconds between tokens")
    p.add_argument("--prefill-rate", type=float, default=0.0,
                   help="prompt tokens per second added to --ttft (0: prefill is free)")
    p.add_argument("--natural-tokens", type=int, default=20, help="output length when EOS is not ignored")
    p.add_argument("--reasoning-tokens", type=int, default=4,
                   help="leading tokens sent as delta.reasoning while thinking is on")
    p.add_argument("--omit-usage", action="store_true", help="ignore stream_options.include_usage")
    p.add_argument("--no-models", action="store_true", help="answer 404 on /v1/models")
    p.add_argument("--error-after", type=int, default=None,
                   help="send vLLM's mid-stream error frame after this many tokens")
    p.add_argument("--plain-openai", action="store_true",
                   help="ignore vLLM's ignore_eos and min_tokens, as a non-vLLM OpenAI server does")
    p.add_argument("--log", help="append every chat request body to this file as a JSON line")
    p.add_argument("--max-num-seqs", type=int, default=0,
                   help="generate this many requests at once, the rest waiting first come first served (0: all)")
    p.add_argument("--events", help="append a JSON line when each request starts and ends generating")
    opts = p.parse_args(argv)
    server = Server(opts)
    host, port = server.server_address[:2]
    print("http://%s:%d" % (str(host), port), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
