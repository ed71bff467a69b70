"""A new user's first Docker start, on every run: a dockerd of the tier's own in a network namespace of its own (so
no docker0 exists before it, whatever engines this host ran) on an empty data root, and the path the model service
takes to a Hub mirror on the host (host.docker.internal, i.e. host-gateway) checked on it; run with
`tests/run.sh tests/container/test_fresh_engine.py`.

The tier's main engine keeps its data root between runs (the stand-in images take minutes to build), so on a
developer's machine it only ever sees a first start once; this file is what makes `.ci/run` see one every time.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import engine as engine_mod
import pytest
from compose_stack import WORK, _base_images, host_gateway

pytestmark = [pytest.mark.container, pytest.mark.real_vllm]  # it shares the tier's session (the `stack` fixture)

SERVER_PORT = 8808  # inside the namespace of our own nothing else listens


@pytest.fixture(scope="module")
def fresh(stack):
    """(engine, namespace, image) for a dockerd started as on a machine that never ran one, with the tier's
    python:3.11-slim stand-in copied in (the fresh engine cannot pull it either)."""
    root = WORK / f"fresh-engine-{os.getpid()}"
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir(parents=True)
    ns = engine_mod.NetNamespace(f"cs-fresh-{os.getpid()}")
    try:
        ns.__enter__()
    except RuntimeError as e:  # not root, or no iproute2: the tier's own engine could not start either
        pytest.fail(str(e))
    with contextlib.closing(ns):
        assert ns.ip("link", "show", "docker0").returncode != 0, "a new namespace has no docker0"
        try:
            eng = engine_mod.start_fresh(root, ns.name)
        except RuntimeError as e:
            pytest.fail(str(e))
        try:
            image = _base_image()
            save = subprocess.Popen(["docker", "save", image], env=stack.engine.env, stdout=subprocess.PIPE)
            eng.docker("load", stdin=save.stdout, timeout=300)
            save.stdout.close()
            assert save.wait(timeout=60) == 0
            yield eng, ns, image
        finally:
            engine_mod.stop(eng)
            subprocess.run(["rm", "-rf", str(root)], check=False)
    # Nothing of it is left: its namespace (and the docker0 inside), its data root, its dockerd.
    assert not Path(f"/run/netns/{ns.name}").exists()
    assert not root.exists()
    assert eng.proc is not None and eng.proc.poll() is not None


def _base_image() -> str:
    (base,) = _base_images()  # the proxy's and the model service's images start from it
    return base


def test_a_first_engine_start_makes_the_bridge_the_tier_finds(fresh):
    eng, ns, image = fresh
    bridge = json.loads(eng.docker("network", "inspect", "bridge").stdout)[0]
    shown = ns.ip("-4", "-o", "addr", "show", "docker0")
    assert shown.returncode == 0, f"the fresh engine made no docker0: {shown.stderr}"
    interface_address = shown.stdout.split("inet ", 1)[1].split("/", 1)[0]
    gateway = host_gateway(eng, image)
    # Where containers are sent is the address the engine gave its new bridge, whatever `network inspect` says
    # (Docker 20.10 shows only the subnet on a first start: the failure this file guards against).
    assert gateway == interface_address, (gateway, shown.stdout, bridge["IPAM"])
    print(f"fresh engine: docker0 {interface_address}, IPAM config {bridge['IPAM']['Config']}")


def test_a_container_on_a_fresh_engine_reaches_a_server_on_host_gateway(fresh, tmp_path):
    """The model service's path to a Hub mirror on the host, on a first engine start: a server bound to the address
    host_gateway found (as HubStandin is), fetched from a container as http://host.docker.internal:PORT."""
    eng, ns, image = fresh
    gateway = host_gateway(eng, image)
    token = uuid.uuid4().hex
    (tmp_path / "token").write_text(token)
    server = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{ns.name}", sys.executable, "-m", "http.server", "--bind", gateway,
         "--directory", str(tmp_path), str(SERVER_PORT)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        script = ("import sys, time, urllib.request\n"
                  "for _ in range(50):\n"
                  "    try:\n"
                  f"        print(urllib.request.urlopen('http://host.docker.internal:{SERVER_PORT}/token', timeout=5)"
                  ".read().decode()); sys.exit(0)\n"
                  "    except OSError as e:\n"
                  "        err = e; time.sleep(0.2)\n"
                  "sys.exit(f'unreachable: {err}')\n")
        started = time.monotonic()
        run = eng.docker("run", "--rm", "--add-host", "host.docker.internal:host-gateway", "--entrypoint", "python3",
                         image, "-c", script, check=False, timeout=120)
        assert run.returncode == 0 and run.stdout.strip() == token, (run.stdout, run.stderr, time.monotonic() - started)
    finally:
        server.terminate()
        server.wait(timeout=10)
