"""The per-key prefix-cache salt on the real engine: with a keys file, the proxy sends every call to vLLM a
`cache_salt` of the caller's key (proxy/http/team.py), so one person's prompt prefix is never served from another's
cached blocks (vLLM keys its prefix-cache blocks by the salt), and `cached_tokens` cannot tell one member whether
another sent a guessed prefix. The same person's next turn still reads her own cache. Run with
`tests/run.sh tests/real_vllm/test_cache_salt_real.py`.
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from realvllm import chat

pytestmark = pytest.mark.real_vllm

REPO = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"


def add_key(path: Path, name: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "keys.py"), "add", name, "--file", str(path)],
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()


def cached(http_client, url: str, key: str, prompt: str) -> int:
    body = chat(messages=[{"role": "user", "content": prompt}], max_tokens=1,
                chat_template_kwargs={"enable_thinking": False}, tool_choice="none")
    reply = http_client.post(url + CHAT, body, headers={"Authorization": f"Bearer {key}"})
    assert reply.status == 200, reply.body[:300]
    usage = json.loads(reply.body)["usage"]
    assert usage["prompt_tokens"] > 256, usage  # many blocks of 16 tokens: a shared prefix would show
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_one_persons_prefix_is_not_served_from_anothers_cache(real_vllm, start_proxy, http_client, tmp_path):
    keys = tmp_path / "keys.json"
    alice, bob = add_key(keys, "alice"), add_key(keys, "bob")
    proxy = start_proxy(BACKEND_URL=real_vllm.url, PROXY_KEYS_FILE=str(keys), PROXY_API_KEY="admin-for-the-salt",
                        PROXY_STATE_DB=str(tmp_path / "state.sqlite3"))
    # A prompt no earlier test sent (vLLM's cache outlives a test), long enough for many cache blocks.
    prompt = f"{uuid.uuid4()} " + " ".join(f"word{i}" for i in range(400))
    first = cached(http_client, proxy.url, alice, prompt)
    again = cached(http_client, proxy.url, alice, prompt)
    other = cached(http_client, proxy.url, bob, prompt)
    assert first == 0 and again > 256, (first, again)  # her own cache serves her
    assert other == 0, f"bob's request read {other} tokens of alice's cached prefix"
