"""Everything the proxy does not rewrite is relayed exactly: method, path, query, body,
headers and status, streamed when vLLM streams; its own errors are OpenAI-shaped.

Run: tests/run.sh tests/test_relay.py
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from standins.proxy_process import image_env
from standins.rawhttp import raw_request
from standins.scripted_backend import Reply
from standins.vllm_wire import SSE_HEADERS, completion, error_reply, json_reply, sse_reply, stream_frames, tool_call

SAMPLES = Path(__file__).parent / "data" / "vllm-0.32-samples"


MODELS = (SAMPLES / "models.json").read_bytes()


@pytest.mark.parametrize("method, target, body, reply", [
    ("GET", "/v1/models", None, Reply(body=MODELS)),
    ("GET", "/health", None, Reply(status=200, body=b"", headers=[])),
    ("GET", "/health", None, Reply(status=503, body=b"", headers=[])),
    ("GET", "/version", None, Reply(body=b'{"version":"0.32.0"}')),
    ("GET", "/metrics", None, Reply(body=b"# HELP vllm:num_requests_running x\nvllm:num_requests_running 0.0\n",
                                    headers=[("Content-Type", "text/plain; version=0.0.4")])),
    ("POST", "/v1/completions?x=1&y=%20z", b'{"model":"foundation","prompt":"a","max_tokens":2}', Reply(body=b'{"id":"cmpl-1"}')),
    ("POST", "/v1/embeddings", b'{"input":"a"}', Reply(status=404, body=b'{"error":{"message":"no","type":"NotFoundError","param":null,"code":404}}')),
    ("POST", "/tokenize", b'{"prompt":"\xc3\xa9"}', Reply(body=b'{"tokens":[1]}')),
    ("DELETE", "/unknown/path/%7Ethere?q=%2F", None, Reply(status=405, body=b"nope", headers=[("Content-Type", "text/plain")])),
    ("PUT", "/v1/whatever", b"\x00\x01binary", Reply(status=201, body=b"\xff\xfe")),
    ("POST", "/v1/messages?beta=true", b'{"model":"foundation","max_tokens":5,"messages":[]}', Reply(body=b'{"type":"message"}')),
    ("POST", "/v1/responses", b'{"model":"foundation","input":"hi"}', Reply(body=b'{"object":"response"}')),
])
def test_transparent_relay(proxy, backend, method, target, body, reply):
    backend.script(reply)
    status, headers, data = raw_request(proxy.url, method, target, body,
                                        {"X-Custom": "kept", "Content-Type": "application/octet-stream"})
    assert (status, data) == (reply.status, reply.body)
    for name, value in reply.headers:
        assert headers[name.lower()] == value
    if not reply.headers:
        assert "content-type" not in headers  # vLLM's /health sends none, so neither does the proxy
    got = backend.received[0]
    path, _, query = target.partition("?")
    assert (got.method, got.path, got.query, got.body) == (method, path, query, body or b"")
    assert got.headers["x-custom"] == "kept" and got.headers["content-type"] == "application/octet-stream"
    assert got.headers["host"] == urllib.parse.urlsplit(backend.url).netloc


def test_hop_by_hop_headers_are_dropped_both_ways(proxy, backend):
    backend.script(Reply(body=b"{}", headers=[("Content-Type", "application/json"), ("X-Up", "1"),
                                               ("Keep-Alive", "timeout=5"), ("Proxy-Authenticate", "Basic"),
                                               ("Upgrade", "h2c")]))
    status, headers, _ = raw_request(proxy.url, "GET", "/v1/models", None, {
        "Connection": "keep-alive, X-Hop", "X-Hop": "secret", "Keep-Alive": "5", "TE": "trailers",
        "Proxy-Authorization": "Basic x", "Upgrade": "h2c", "X-End": "e"})
    assert status == 200 and headers["x-up"] == "1"
    assert "keep-alive" not in headers and "proxy-authenticate" not in headers and "upgrade" not in headers
    sent = backend.received[0].headers
    assert sent["x-end"] == "e"
    for hop in ("x-hop", "te", "proxy-authorization", "upgrade", "keep-alive"):
        assert hop not in sent
    assert sent.get("connection", "keep-alive").lower() == "keep-alive"  # the proxy's own, not the client's


def test_streamed_response_is_relayed_as_it_arrives(proxy, backend):
    frames = (SAMPLES / "stream-include-usage.sse").read_bytes().split(b"\n\n")[:-1]
    frames = [f + b"\n\n" for f in frames]
    # The first event, then a 3 s pause: a proxy that buffered would hold the first event
    # for the whole pause, which no loaded machine's scheduling delay comes near.
    backend.script(Reply(headers=list(SSE_HEADERS), chunks=[frames[0], 3.0, *frames[1:]], path="/v1/completions"))
    u = urllib.parse.urlsplit(proxy.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/completions", body=b'{"stream":true}')
    resp = conn.getresponse()
    started = time.monotonic()
    first = resp.read1(65536)
    assert time.monotonic() - started < 2.0, "the first event must not wait for the rest"
    assert frames[0].startswith(first[:20])
    rest = resp.read()
    assert first + rest == b"".join(frames)
    assert resp.getheader("content-type") == SSE_HEADERS[0][1]


def test_backend_dying_mid_body_is_not_a_clean_end(proxy, backend):
    backend.script(Reply(headers=list(SSE_HEADERS), chunks=[b"data: {}\n\n"], drop=True, path="/v1/completions"))
    with pytest.raises(http.client.IncompleteRead):
        raw_request(proxy.url, "POST", "/v1/completions", b"{}")
    time.sleep(0.2)
    assert "POST /v1/completions: vLLM is unreachable: connection to" in proxy.log()
    assert "Traceback" not in proxy.log()  # one warning line for vLLM's failure, not a crash report


def test_vllm_errors_are_relayed_unchanged(proxy, backend):
    body = b'{"error":{"message":"The model `nope` does not exist. Valid aliases: foundation.","type":"NotFoundError","param":"model","code":404}}'
    backend.script(Reply(status=404, body=body))
    status, _, data = raw_request(proxy.url, "POST", "/v1/chat/completions",
                                  b'{"model":"nope","messages":[{"role":"user","content":"x"}]}')
    assert (status, data) == (404, body)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentServer:
    """Accepts connections and never answers: what a hung vLLM looks like."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self):
        self.sock.close()


@pytest.fixture
def silent():
    s = SilentServer()
    yield s
    s.close()


CHAT = b'{"model":"foundation","messages":[{"role":"user","content":"x"}]}'


@pytest.mark.parametrize("target, body", [("/v1/models", None), ("/v1/chat/completions", CHAT),
                                          ("/v1/chat/completions", CHAT[:-1] + b',"stream":true}')])
def test_backend_refusing_is_502_naming_the_url(start_proxy, target, body):
    url = f"http://127.0.0.1:{free_port()}"
    p = start_proxy(BACKEND_URL=url)
    status, _, data = raw_request(p.url, "POST" if body else "GET", target, body)
    err = json.loads(data)["error"]
    assert status == 502 and url in err["message"] and "still be loading" in err["message"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "vLLM is unreachable" in p.log()


@pytest.mark.parametrize("target, body", [("/v1/models", None), ("/v1/chat/completions", CHAT)])
def test_backend_silent_is_504(start_proxy, silent, target, body):
    p = start_proxy(BACKEND_URL=silent.url, READ_TIMEOUT="0.5")
    status, _, data = raw_request(p.url, "POST" if body else "GET", target, body)
    assert status == 504 and "timed out" in json.loads(data)["error"]["message"]


@pytest.mark.parametrize("body, status, phrase", [
    (b"{bad json", 400, "not valid JSON"),
    (b"", 400, "not valid JSON"),
    (b"\xff\xfe\x00garbage", 400, "not valid JSON"),
    (b"[1,2]", 400, "JSON object"),
    (b'"text"', 400, "JSON object"),
    (b"{}", 400, "messages"),
    (b'{"messages": {"role": "user"}}', 400, "messages"),
    (b'{"messages": [], "tools": "web"}', 400, "tools"),
    (b'{"messages": [], "stream": "yes"}', 400, "stream"),
])
def test_bad_chat_bodies_never_reach_vllm(proxy, backend, body, status, phrase):
    got, _, data = raw_request(proxy.url, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    err = json.loads(data)["error"]
    assert got == status and phrase in err["message"] and err["code"] == status
    assert backend.received == []


def test_body_over_the_limit_is_413(start_proxy, backend):
    p = start_proxy(MAX_BODY_BYTES="1000")
    for target in ("/v1/chat/completions", "/v1/completions"):
        status, _, data = raw_request(p.url, "POST", target, b'{"messages":[],"x":"' + b"a" * 2000 + b'"}')
        assert status == 413 and "MAX_BODY_BYTES" in json.loads(data)["error"]["message"]
    assert backend.received == []


@pytest.mark.parametrize("target", ["/v1/chat/completions", "/v1/completions"])
def test_requests_pipelined_on_one_connection_each_keep_their_body(proxy, backend, target):
    """Two requests written in one go (HTTP/1.1 pipelining): the first body is read in one call of its length, and
    the bytes behind it stay the second request's, whole."""
    bodies = [json.dumps({"model": "foundation", "messages": [{"role": "user", "content": c * 70_000}]}).encode()
              for c in "ab"]
    backend.script(json_reply(completion(content="one")), json_reply(completion(content="two")))
    u = urllib.parse.urlsplit(proxy.url)
    with socket.create_connection((u.hostname, u.port), timeout=20) as s:
        s.sendall(b"".join(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                           % (target.encode(), len(b)) + b for b in bodies))
        answers = []
        for _ in bodies:
            resp = http.client.HTTPResponse(s)
            resp.begin()
            answers.append((resp.status, json.loads(resp.read())["choices"][0]["message"]["content"]))
    assert answers == [(200, "one"), (200, "two")]
    # chat's body gains the proxy's tools on its way; its messages, like /v1/completions' whole body, are the client's
    assert [r.json()["messages"] for r in backend.received] == [json.loads(b)["messages"] for b in bodies]


def test_curl_posting_a_body_over_a_megabyte_waits_for_100_continue_and_gets_through(proxy, backend, tmp_path):
    """curl asks `Expect: 100-continue` before a body over 1 MiB and sends it only once told to; gunicorn answers that
    before the app reads the body in one call of its length."""
    body = json.dumps({"model": "foundation", "prompt": "word " * 250_000}).encode()
    (tmp_path / "body.json").write_bytes(body)
    backend.script(json_reply({"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}))
    run = subprocess.run(["curl", "-sS", "-v", "--max-time", "20", "-H", "Content-Type: application/json",
                          "--data-binary", f"@{tmp_path / 'body.json'}", proxy.url + "/v1/completions"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and json.loads(run.stdout)["choices"][0]["text"] == "ok", run.stderr[-500:]
    assert "Expect: 100-continue" in run.stderr and "HTTP/1.1 100 Continue" in run.stderr
    assert backend.received[0].body == body


def test_a_large_prompt_passes(proxy, backend):
    backend.script(json_reply(completion(content="ok")))
    prompt = "word " * 250_000  # about a 250k-token prompt
    body = json.dumps({"model": "foundation", "messages": [{"role": "user", "content": prompt}]}).encode()
    status, _, data = raw_request(proxy.url, "POST", "/v1/chat/completions", body)
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "ok"
    assert backend.received[0].json()["messages"][0]["content"] == prompt


def test_the_proxy_runs_with_the_images_malloc_settings(proxy):
    """The tests' proxies allocate memory as the image's (standins/proxy_process.py reads the Dockerfile's ENV): its
    workers have glibc's tunables, whatever the environment of the test run."""
    want = image_env()["GLIBC_TUNABLES"]  # test_compose.py's test_dockerfile checks the line's value
    for pid in proxy.workers():
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        # glibc (2.36) reads the tunables in place, ending each with a NUL: the first reads as the whole variable and
        # the others follow it. The next test sees two of them at work.
        assert b"\0GLIBC_TUNABLES=" + want.replace(":", "\0").encode() + b"\0" in b"\0" + environ


def minor_faults(pid: int) -> int:
    """Pages a process has faulted in from nothing since it started (/proc/PID/stat's minflt)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[7])


def test_a_worker_decodes_one_big_body_after_another_in_memory_it_already_has(proxy, backend):
    """orjson's working buffer for a body over ~2.7 MB (12 times the body) is bigger than any block glibc keeps by
    default, so each such request mapped it anew and faulted it in: 240-380 faults with huge pages, ~1,200 without,
    a millisecond or more. The image's tunables keep it on the heap for the next one (Dockerfile, GLIBC_TUNABLES)."""
    turns = [{"role": "user" if n % 2 else "assistant", "content": f"turn {n}: " + "x" * 1000} for n in range(3000)]
    body = json.dumps({"model": "foundation", "messages": turns}).encode()
    assert len(body) > 3_000_000
    backend.script(*[json_reply(completion(content="ok")) for _ in range(6)])
    [worker] = proxy.workers()
    for n in range(6):
        if n == 2:  # the first two grow the heap to what a request of this size needs
            before = minor_faults(worker)
        status, _, data = raw_request(proxy.url, "POST", "/v1/chat/completions", body)
        assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "ok"
    per_request = (minor_faults(worker) - before) / 4
    assert per_request < 100, f"{per_request:.0f} page faults per 3 MB request"


@pytest.mark.parametrize("target, headers, status", [
    ("/v1/models", {}, 401),
    ("/v1/models", {"Authorization": "Bearer wrong"}, 401),
    ("/v1/models", {"Authorization": "Bearer k2"}, 200),
    ("/v1/models", {"x-api-key": "k1"}, 200),
    ("/health", {}, 200),
    ("/proxy/health", {}, 200),
    ("/v1/chat/completions", {"Authorization": "Bearer nope"}, 401),
])
def test_proxy_api_key(start_proxy, backend, target, headers, status):
    p = start_proxy(PROXY_API_KEY="k1, k2", BACKEND_API_KEY="vllm-key")
    if target != "/proxy/health":
        backend.script(Reply(body=b"{}"))
    got, _, data = raw_request(p.url, "POST" if "chat" in target else "GET", target,
                               CHAT if "chat" in target else None, headers)
    assert got == status
    if status == 401:
        assert json.loads(data)["error"]["type"] == "authentication_error"
        assert backend.received == []
    elif target != "/proxy/health":
        sent = backend.received[0].headers
        assert sent["authorization"] == "Bearer vllm-key" and "x-api-key" not in sent
        assert b"vllm-key" not in data


# A client on loopback is on gunicorn's default trusted-proxy list: its SCRIPT_NAME header once split the
# path, so the key was checked on "/health" (open) while vLLM was sent "/metrics/health" (vLLM's metrics).
KEY = {"Authorization": "Bearer k1"}
FORWARDED = {"X-Forwarded-Proto": "https", "X-Forwarded-Ssl": "off", "X-Forwarded-Protocol": "ssl",
             "X-Forwarded-For": "10.9.8.7", "X-Forwarded-Host": "elsewhere.example", "Forwarded": "for=10.9.8.7;proto=https"}
CASES = [
    ("/metrics/health", {"SCRIPT_NAME": "/metrics"}, 401),
    ("/metrics/proxy/health", {"SCRIPT_NAME": "/metrics"}, 401),
    ("/metrics/health", {"SCRIPT_NAME": "/metrics", **KEY}, 200),
    ("/v1/v1/chat/completions", {"SCRIPT_NAME": "/v1", **KEY}, 200),  # relayed unchanged, not run as a chat
    ("/v1/models", {"PATH_INFO": "/health"}, 401),
]
# A gunicorn told to trust these refuses them itself (a SCRIPT_NAME that is no prefix of the path,
# scheme headers that disagree), so only the shipped config can show they change nothing.
SHIPPED_ONLY = [
    ("/v1/models", {"SCRIPT_NAME": "/elsewhere", **KEY}, 200),
    ("/v1/models", {**FORWARDED, **KEY}, 200),
    ("/health", FORWARDED, 200),
]
# GUNICORN_CMD_ARGS overrides gunicorn.conf.py: a gunicorn that trusts every peer's SCRIPT_NAME,
# against which the app alone must hold.
TRUSTING = "--forwarded-allow-ips=* --forwarder-headers=SCRIPT_NAME,PATH_INFO"


@pytest.mark.parametrize("gunicorn_args, target, headers, status",
                         [("", *c) for c in CASES + SHIPPED_ONLY] + [(TRUSTING, *c) for c in CASES])
def test_forwarded_headers_change_neither_the_path_nor_the_key(start_proxy, backend, gunicorn_args, target, headers,
                                                               status):
    """The key guards the path that is relayed, with the shipped gunicorn.conf.py and, behind it, in the app."""
    env = {"PROXY_API_KEY": "k1", **({"GUNICORN_CMD_ARGS": gunicorn_args} if gunicorn_args else {})}
    p = start_proxy(**env)
    backend.script(Reply(body=b'{"ok":true}'))
    body = CHAT if "chat" in target else None  # the chat handler would add its web_search tool to it
    got, _, data = raw_request(p.url, "POST" if body else "GET", target, body, headers)
    assert got == status, data
    if status == 401:
        assert json.loads(data)["error"]["type"] == "authentication_error" and backend.received == []
    else:
        assert data == b'{"ok":true}'
        assert [(r.path, r.body) for r in backend.received] == [(target, body or b"")]
        for name, value in headers.items():  # X-Forwarded-* are vLLM's to ignore: relayed unchanged
            if name.startswith(("X-", "Forwarded")):
                assert backend.received[0].headers[name.lower()] == value


def test_client_key_passes_through_when_the_proxy_has_none(proxy, backend):
    backend.script(Reply(body=b"{}"))
    raw_request(proxy.url, "GET", "/v1/models", None, {"Authorization": "Bearer client-key"})
    assert backend.received[0].headers["authorization"] == "Bearer client-key"


def test_access_log_has_one_line_without_prompt_text(proxy, backend):
    backend.script(json_reply(completion(content="SECRET-ANSWER")))
    raw_request(proxy.url, "POST", "/v1/chat/completions",
                b'{"messages":[{"role":"user","content":"SECRET-PROMPT"}]}')
    time.sleep(0.2)
    log = proxy.log()
    assert "POST /v1/chat/completions 200" in log and "searches=0" in log
    assert "SECRET-PROMPT" not in log and "SECRET-ANSWER" not in log


def test_vllm_error_reply_status_mapping_on_chat(proxy, backend):
    backend.script(error_reply(400, "max_tokens is too large", "BadRequestError", "max_tokens"))
    status, _, data = raw_request(proxy.url, "POST", "/v1/chat/completions", CHAT)
    assert status == 400 and json.loads(data)["error"]["param"] == "max_tokens"


def test_the_development_server_serves_the_same_app(backend, searxng):
    """`python proxy-passthrough.py` (the README's way to run it on the host) really serves."""
    env = {**os.environ, "PROXY_BIND": "127.0.0.1:0", "BACKEND_URL": backend.url,
           "SEARXNG_URL": searxng.url}
    proc = subprocess.Popen([sys.executable, "proxy-passthrough.py"], cwd=SAMPLES.parents[2], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "the development server did not start"
        backend.script(json_reply(completion(tool_calls=[tool_call("web_search", {"query": "dev server"})])),
                       json_reply(completion(content="answered")))
        status, _, data = raw_request(url, "POST", "/v1/chat/completions",
                                      b'{"model":"foundation","messages":[{"role":"user","content":"x"}]}')
        assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "answered"
        assert searxng.queries == ["dev server"]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow  # outlives gunicorn's worker timeout on purpose
@pytest.mark.parametrize("streamed", [True, False])
def test_generations_longer_than_the_worker_timeout_survive(start_proxy, backend, streamed):
    """gunicorn's worker timeout guards against a stuck worker, never a long generation:
    with a 1 s timeout, a 4 s answer still arrives whole."""
    p = start_proxy(PROXY_WORKER_TIMEOUT="1", KEEPALIVE_INTERVAL="0.2")
    body = {"model": "foundation", "messages": [{"role": "user", "content": "x"}], "stream": streamed}
    if streamed:
        frames = stream_frames(content=["slow ", "but ", "whole"])
        backend.script(sse_reply(frames, gap=1.0))
    else:
        reply = json_reply(completion(content="slow but whole"))
        reply.delay = 4
        backend.script(reply)
    status, _, data = raw_request(p.url, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200
    assert (data == b"".join(frames)) if streamed else json.loads(data)["choices"][0]["message"]["content"] == "slow but whole"
    assert "WORKER TIMEOUT" not in p.log() and p.log().count("Booting worker") == 1
