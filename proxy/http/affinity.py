"""The session key the proxy sends vLLM's router as `X-Session-ID` on every request (docs/operations.md, "Scaling past one card").

vllm-router's `consistent_hash` policy sends every request with the same X-Session-ID to the same vLLM worker, and
an agent session that stays on one worker has its growing prompt in that worker's prefix cache: the next turn is
not prefilled again. So the key must be the same for every request of one session (relay and loop turns, streamed
or not, count_tokens and the turn it counts) and differ between sessions.

Where it comes from, in order:
- the agent's own session id, where the client sends one: Claude Code's `X-Claude-Code-Session-Id`, Codex's
  `session-id` (0.171; older releases `session_id` / `conversation_id`), or an `X-Session-ID` of the client's own;
- else the conversation's start: the system prompt and the first user message a person wrote, which every later turn
  of the same conversation resends unchanged (chat `messages`, Messages `system` + `messages`, Responses
  `instructions` + `input`). A user message the client generated is skipped (Codex's `<environment_context>` and
  `# AGENTS.md instructions`, recognised as URL provenance recognises them, proxy/apis/given.py): it is the same
  for every session started in one folder, and would send all of them to one worker;
- else (GET /v1/models, a body with no conversation) a random key: such a request belongs to no session and may go
  to any worker.

Either source is keyed with a per-install secret (HMAC-SHA-256, SESSION_ID_SECRET, or one shared through STATE_URL's
store: Secret) and cut to 128 bits, so the
header says nothing about the session or the prompt to whoever reads the router's logs, and a client-chosen value
cannot carry anything (a key, a user name) past the proxy. Pure functions; proxy/http/app.py adds the header.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from proxy.apis.given import user_given
from proxy.backends.state.state import State, StateDown
from proxy.core import codec

HEADER = "X-Session-ID"
# The clients' own session headers, lower-cased, in the order they are believed (tests/data/agent-wire holds
# Claude Code 2.1.332's and Codex 0.171's requests). gunicorn drops a header with an underscore in its name (its
# `header_map` default), so older Codex releases' `session_id` and `conversation_id` count only under another server;
# under gunicorn those sessions are told apart by their start.
CLIENT_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "conversation_id", "x-session-id")
# Markers that keep the two sources apart: a client id that happens to equal a prompt never gives its key.
_FROM_CLIENT, _FROM_START = b"client\0", b"start\0"


def session_key(headers, body: bytes | codec.Decoded, secret: bytes) -> str:
    """X-Session-ID's value for one client request: `headers` the client's (name, value) pairs, `body` its bytes
    (or them in a codec.Decoded, which the request's handler reads again without decoding them again)."""
    # Read once per wanted name: werkzeug's `request.headers.items()` is a generator, and read as it came only the
    # first name (Claude Code's) was ever looked for, so every Codex session of one folder got one key.
    headers = list(headers)
    for wanted in CLIENT_HEADERS:
        for name, value in headers:
            if name.lower() == wanted and value.strip():
                return _keyed(secret, _FROM_CLIENT + value.strip().encode("utf-8", "surrogateescape"))
    start = conversation_start(body)
    if start is None:
        return secrets.token_hex(16)
    return _keyed(secret, _FROM_START + start)


def _keyed(secret: bytes, data: bytes) -> str:
    return hmac.new(secret, data, hashlib.sha256).hexdigest()[:32]


def conversation_start(body: bytes | codec.Decoded) -> bytes | None:
    """The canonical bytes of a request's system prompt and first user message, or None when it has neither
    (not JSON, not an object, no conversation). The same for every turn of one conversation: only the text and
    the blocks' content count, not where a client put `cache_control` this turn."""
    decoded = body if isinstance(body, codec.Decoded) else codec.Decoded(body)
    if not decoded.raw or decoded.raw[:1] not in (b"{", b" ", b"\n", b"\t", b"\r"):
        return None
    try:
        req = decoded.value()
    except (ValueError, RecursionError):
        return None
    if not isinstance(req, dict):
        return None
    system, first = _start_of(req)
    if system is None and first is None:
        return None
    return codec.dumps([_canonical(system), _canonical(first)])


def _start_of(req: dict):
    """(system, first user message) of a chat, Messages or Responses body; either may be None."""
    if "input" in req or "instructions" in req:  # Responses
        items = req.get("input")
        if isinstance(items, str):
            return req.get("instructions"), items
        return req.get("instructions"), _first_user(items)
    messages = req.get("messages")
    system = req.get("system")  # Messages
    if system is None and isinstance(messages, list):  # chat: the leading system/developer messages
        lead = []
        for m in messages:
            if not (isinstance(m, dict) and m.get("role") in ("system", "developer")):
                break
            lead.append(m.get("content"))
        system = lead or None
    return system, _first_user(messages)


def _first_user(items):
    """The content of the first user message a person wrote something in (None when there is none)."""
    if not isinstance(items, list):
        return None
    for item in items:
        if isinstance(item, dict) and item.get("role") == "user" and _typed(item.get("content")):
            return item.get("content")
    return None


def _typed(content) -> bool:
    """Whether a user message holds anything a person wrote: not only what a client generated into it."""
    return any(g.origin == "user" and (not isinstance(g.value, str) or g.value.strip()) for g in user_given(content))


def _canonical(value):
    """A content value without the parts a client moves between turns (cache_control marks)."""
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items() if k != "cache_control"}
    return value


class Secret:
    """The HMAC key, called for each request: SESSION_ID_SECRET when set; else, with a shared store (STATE_URL), the
    one key in it, which the first replica to ask puts there (replicas on other hosts share no key file); else a
    random one for this process (gunicorn.conf.py makes one in the master when there is no store, so its workers
    agree). The store is asked again every REFRESH seconds: one that lost its key (restarted without persistence)
    gets this worker's back, so replicas started since agree again; while it does not answer, this process's own
    random key stands in."""

    USE, KEY = "session-secret", "x-session-id"
    REFRESH = 60.0
    TTL = 30 * 86400.0  # renewed by every claim; only a store no replica asked for a month forgets it

    def __init__(self, configured: str, state: State | None = None, clock=time.monotonic):
        self._state = None if configured else state
        self._key = configured.encode() if configured else secrets.token_bytes(32)
        self._shared = ""
        self._clock, self._next = clock, 0.0

    def __call__(self) -> bytes:
        if self._state is None or self._clock() < self._next:
            return self._key
        try:
            value = self._state.claim(self.USE, self.KEY, self._shared or secrets.token_hex(32), self.TTL)
        except StateDown:
            return self._key  # asked again once the store's circuit lets a call through
        self._next = self._clock() + self.REFRESH
        if isinstance(value, str) and len(value) >= 32:
            self._shared, self._key = value, value.encode()
        return self._key
