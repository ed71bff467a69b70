"""The container tier's stack: the compose command line, the Stack handle the tests use, and the session fixture that builds
the images, starts the Hub stand-in the model service downloads from, and brings the CPU trial up; used by
tests/container/conftest.py and test_stack.py.

The stack is the CPU trial as a user runs it (docker-compose.yaml + compose.cpu.yaml), plus the tier's overlay
tests/compose.cpu-test.yaml and env file tests/compose.cpu-test.env (the tiny model's settings).
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "real_vllm"))

import engine as engine_mod  # noqa: E402
import images  # noqa: E402
import realvllm  # noqa: E402

from standins.hf_hub import HubStandin  # noqa: E402

COMPOSE_FILES = [REPO / "docker-compose.yaml", REPO / "compose.cpu.yaml", REPO / "tests" / "compose.cpu-test.yaml"]
ENV_FILE = REPO / "tests" / "compose.cpu-test.env"
WORK = REPO / "tests" / ".work" / "container"
# The bound on `up --wait` once the images exist: vLLM's CPU boot of the tiny model is most of it.
UP_TIMEOUT_S = 300
# One JSON value with spaces and quotes, as a user would write it in .env: it must reach `vllm serve` as one
# argument (and vLLM must accept it). It also bounds every answer at 1024 tokens: the random model never stops
# on its own, and Codex asks for no limit; long enough for the stream that vLLM's death cuts.
EXTRA_VLLM_ARGS = """--override-generation-config '{"max_new_tokens": 1024, "temperature": 0.7}'"""
PROJECT = "coding-stack"


@dataclass
class Stack:
    engine: engine_mod.Engine
    env: dict
    model: Path                      # the tiny model's files (for token ids)
    proxy_url: str
    vllm_url: str
    hub: HubStandin                  # serves the tiny model under the CPU trial's repo id; tests stop and restart it
    model_dir: Path
    model_id: str
    up_seconds: float = 0.0
    notes: list = field(default_factory=list)

    def compose(self, *args, check=True, timeout=600, env=None) -> subprocess.CompletedProcess:
        proc = subprocess.run(compose_cmd(*args), cwd=REPO, env=env or self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        return proc

    def docker(self, *args, **kw) -> subprocess.CompletedProcess:
        return self.engine.docker(*args, **kw)

    def inspect(self, container: str) -> dict:
        return json.loads(self.docker("inspect", container).stdout)[0]

    def logs(self, service: str) -> str:
        proc = self.compose("logs", "--no-color", "--no-log-prefix", service)
        return proc.stdout + proc.stderr

    def token_id(self, text: str) -> int:
        tok = json.loads((self.model / "tokenizer.json").read_text())
        return next(a["id"] for a in tok["added_tokens"] if a["content"] == text)

    def wait_healthy(self, container: str, timeout: float) -> float:
        started = time.monotonic()
        while True:
            state = self.inspect(container)["State"]
            if state.get("Health", {}).get("Status") == "healthy":
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise AssertionError(f"{container} not healthy after {timeout} s: {state}")
            time.sleep(1)


def compose_cmd(*args) -> list[str]:
    files = [a for f in COMPOSE_FILES for a in ("-f", str(f))]
    return [realvllm.compose_binary(), *files, "--env-file", str(ENV_FILE), *args]


def merged_config() -> dict:
    """`docker compose config` of the tier's three files, with only PATH and HOME from outside."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.run([*compose_cmd("config", "--format", "json")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        pytest.fail(f"docker compose config of the tier's files failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def _base_images() -> set[str]:
    return {re.search(r"^FROM (\S+)$", (REPO / d).read_text(), re.M).group(1) for d in ("Dockerfile", "model/Dockerfile")}


def tiny_files(tiny: Path) -> dict:
    return {str(p.relative_to(tiny)): p.read_bytes() for p in tiny.rglob("*")
            if p.is_file() and not p.name.startswith(".")}


PROBE_NAME = "cs-host-gateway"


def host_gateway(eng, image: str) -> str:
    """Where `host-gateway` (the compose file's host.docker.internal) points from a container, as the engine itself
    resolves it: the /etc/hosts line it writes into a throwaway container of `image`. Not the bridge network's
    IPAM Gateway: Docker 20.10's first start on a host with no docker0 leaves that empty, though the bridge it
    makes has 172.17.0.1 and host-gateway resolves to it (tests/container/test_fresh_engine.py)."""
    proc = eng.docker("run", "--rm", "--add-host", f"{PROBE_NAME}:host-gateway", "--entrypoint", "getent", image,
                      "hosts", PROBE_NAME, check=False, timeout=120)
    words = proc.stdout.split()
    try:
        return str(ipaddress.ip_address(words[0] if proc.returncode == 0 and words else ""))
    except ValueError:
        pytest.fail(f"the engine resolves host-gateway to no address, so no container can reach this host "
                    f"(docker run --add-host {PROBE_NAME}:host-gateway exited {proc.returncode}: "
                    f"{(proc.stdout + proc.stderr).strip()[-500:]})")


def _free_port() -> int:
    return realvllm.free_port()


@pytest.fixture(scope="session", name="stack")
def stack_session():
    WORK.mkdir(parents=True, exist_ok=True)
    cache = realvllm.cache_dir()
    env_info = realvllm.locate_env()
    log = open(WORK / "setup.log", "wb")
    try:
        eng = engine_mod.start(cache)
    except RuntimeError as e:
        pytest.fail(str(e))
    st = hub = None
    try:
        config = merged_config()
        (base,) = _base_images()  # the proxy's and the model service's images start from the same one
        wanted = [images.python_slim(base, images.base_pip_wheel(cache)), images.searxng(config["services"]["searxng"]["image"]),
                  images.vllm(config["services"]["vllm"]["image"], env_info.python.parent.parent)]
        notes = []
        for image in wanted:
            started = time.monotonic()
            notes.append(f"{images.ensure(eng, image, log)} in {time.monotonic() - started:.0f} s")

        # Not created here: the model service's bind creates MODEL_DIR, as on a fresh host.
        model_dir = WORK / "models"
        subprocess.run(["rm", "-rf", str(model_dir)], check=True)
        model_id = config["services"]["model"]["environment"]["MODEL_ID"]
        gateway = host_gateway(eng, base)
        hub = HubStandin(tiny_files(env_info.model_dir), repo_id=model_id, host=gateway)
        try:
            hub.start()
        except OSError as e:  # a remote engine's host-gateway is another machine's address
            hub = None
            pytest.fail(f"host-gateway points at {gateway}, which the Hub stand-in cannot listen on here: {e}")
        notes.append(f"host-gateway is {gateway}")
        proxy_port, vllm_port = _free_port(), _free_port()
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "DOCKER_HOST": eng.host,
               "MODEL_DIR": str(model_dir), "PROXY_PORT": str(proxy_port), "VLLM_PORT": str(vllm_port),
               "HF_ENDPOINT": f"http://host.docker.internal:{hub.port}",
               "EXTRA_VLLM_ARGS": EXTRA_VLLM_ARGS,
               # Two rounds: a forced search reaches the cap after one search and one repeat.
               "MAX_SEARCH_ITER": "2", "KEEPALIVE_INTERVAL": "1"}
        st = Stack(eng, env, env_info.model_dir, f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{vllm_port}",
                   hub=hub, model_dir=model_dir, model_id=model_id, notes=notes)
        # Leftovers of an interrupted run would keep the fixed container names taken.
        st.compose("down", "-v", "--remove-orphans", check=False)
        started = time.monotonic()
        # --no-cache: every run builds as a new user's first build does, from the lock and the base image alone; a
        # cached layer once hid a lock that today's pip refused.
        st.compose("build", "--no-cache", "proxy", "model", timeout=900)
        notes.append(f"proxy and model images built in {time.monotonic() - started:.0f} s")
        started = time.monotonic()
        up = st.compose("up", "-d", "--wait", "--wait-timeout", str(UP_TIMEOUT_S), check=False, timeout=UP_TIMEOUT_S + 60)
        st.up_seconds = time.monotonic() - started
        if up.returncode != 0:
            logs = "\n".join(f"--- {s}:\n{st.compose('logs', '--no-color', '--tail', '60', s, check=False).stdout}"
                             for s in ("preflight", "model", "vllm", "proxy", "searxng"))
            pytest.fail(f"docker compose up --wait exited {up.returncode}:\n{up.stderr[-3000:]}\n{logs}")
        for name in ("preflight", "model"):
            state = st.inspect(f"coding-stack-{name}")["State"]
            notes.append(f"{name}: started {state['StartedAt']}, finished {state['FinishedAt']}")
        notes.append(f"vllm: started {st.inspect('coding-stack-vllm')['State']['StartedAt']}")
        (WORK / "notes.txt").write_text("\n".join([*notes, f"up --wait returned in {st.up_seconds:.0f} s"]) + "\n")
        yield st
    finally:
        if st is not None:
            st.compose("down", "-v", "--remove-orphans", check=False)
        if hub is not None:
            hub.stop()
        engine_mod.stop(eng)
        log.close()


def get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""  # nothing listening (yet)
