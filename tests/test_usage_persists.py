"""Usage, quotas and the fair queue outlive a restart without any setting: with a keys file and no PROXY_STATE_DB,
the proxy keeps them in a lasting file in the user's state folder (Config.default_state_db), says where in its log,
and finds them there after gunicorn stops and starts again. Before, such a run kept them in a temporary folder that
gunicorn removed at exit: every restart lost the day's usage and reset the daily quotas.

Run: tests/run.sh tests/test_usage_persists.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxy.core.config import Config, default_state_db
from standins.proxy_process import ProxyProcess
from standins.rawhttp import raw_request

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "admin-key-for-the-usage-tests"


@pytest.mark.parametrize("environ,path", [
    ({"HOME": "/home/ann"}, "/home/ann/.local/state/coding-stack/proxy-state.sqlite3"),
    ({"HOME": "/home/ann", "XDG_STATE_HOME": "/var/state"}, "/var/state/coding-stack/proxy-state.sqlite3"),
    # The XDG spec: a relative XDG_STATE_HOME is invalid and ignored.
    ({"HOME": "/home/ann", "XDG_STATE_HOME": "state"}, "/home/ann/.local/state/coding-stack/proxy-state.sqlite3"),
    ({"HOME": "/home/ann", "PROXY_STATE_DB": ""}, "/home/ann/.local/state/coding-stack/proxy-state.sqlite3"),
    ({"HOME": "/home/ann", "PROXY_STATE_DB": "/srv/usage.db"}, "/srv/usage.db"),
])
def test_the_state_file_lasts_unless_named(environ, path):
    assert Config.from_env(environ).proxy_state_db == path
    if "PROXY_STATE_DB" not in environ:
        assert default_state_db(environ) == path


@pytest.fixture
def backend():
    proc = subprocess.Popen([sys.executable, str(ROOT / "standins" / "paced_backend.py"), "--port", "0", "--gap",
                             "0.001"], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_usage_survives_a_restart_without_proxy_state_db(tmp_path, backend):
    keys = tmp_path / "keys.json"
    added = subprocess.run([sys.executable, str(ROOT / "scripts" / "keys.py"), "add", "alice", "--file", str(keys)],
                           capture_output=True, text=True, check=True)
    alice = added.stdout.strip()
    env = {"BACKEND_URL": backend, "SEARXNG_URL": "http://127.0.0.1:9", "PROXY_WORKERS": "2",
           "PROXY_API_KEY": ADMIN, "PROXY_KEYS_FILE": str(keys), "PROXY_STATE_DB": "",
           "XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(tmp_path / "home")}
    body = json.dumps({"model": "foundation", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                       "ignore_eos": True}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {alice}"}
    before = ProxyProcess(env, tmp_path / "before.log")
    try:
        for _ in range(3):
            assert raw_request(before.url, "POST", "/v1/chat/completions", body, headers)[0] == 200
        # A request's tokens are recorded as its answer ends, just after the client has it: wait for the third's
        # (three tokens each, ignore_eos), or a restart would seem to have found usage it never lost.
        deadline = time.monotonic() + 30
        while sum(day["completion_tokens"] for day in read_usage(before)["alice"].values()) < 9:
            assert time.monotonic() < deadline, read_usage(before)
            time.sleep(0.05)
        used = read_usage(before)["alice"]
    finally:
        before.stop()
    expected = tmp_path / "state" / "coding-stack" / "proxy-state.sqlite3"
    assert f"kept in {expected} (PROXY_STATE_DB)" in before.log()
    assert expected.is_file() and not (tmp_path / "home").exists()
    after = ProxyProcess(env, tmp_path / "after.log")
    try:
        assert read_usage(after)["alice"] == used
        assert next(iter(used.values()))["requests"] == 3
    finally:
        after.stop()


def read_usage(proxy: ProxyProcess) -> dict:
    status, _, raw = raw_request(proxy.url, "GET", "/proxy/usage", headers={"Authorization": f"Bearer {ADMIN}"})
    assert status == 200, raw
    return json.loads(raw)["keys"]
