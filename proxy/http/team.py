"""A stack shared by a team: who a request's key belongs to (PROXY_API_KEY's keys are the admin, PROXY_KEYS_FILE's
are people), their quotas (a 429 in the route's error shape over a limit), and what each request used, added to
its key's day when the request ends. create_app installs it before every route; not run on its own.

A key is never logged and never a metric label: the name is. The usage of a request is read from the answer its
client got (proxy/observe/usage.py), its searches and page reads from the engine's events.
"""
from __future__ import annotations

import datetime
import hmac
import logging
import math
import secrets
import sqlite3

from flask import Response

from proxy.backends.state.keys import ADMIN, KeysFile, Limits, Person
from proxy.backends.state.teamstore import Admitted, Refusal, StoreError, TeamStorage
from proxy.core import codec, routes
from proxy.core.config import Config
from proxy.core.errors import Wire, error_response
from proxy.engine.events import RequestEnded
from proxy.engine.flow import ANONYMOUS, Flow, UsageReader
from proxy.observe import metrics
from proxy.observe.usage import UsageScan
from proxy.observe.usage import figures as figures_of

log = logging.getLogger("proxy")

UNAUTHORIZED = ("Missing or invalid API key: send it as `Authorization: Bearer <key>` (or `x-api-key: <key>`) "
                "with a key from PROXY_API_KEY or made by scripts/keys.py.")
# With people's keys, what names every person's figures is the admin's alone: usage per key and day, and the
# metrics (proxy_key_usage_total, proxy_key_limited and the queue's waits carry the key's name as a label).
ADMIN_ONLY = frozenset({routes.PROXY_USAGE, routes.PROXY_METRICS})
LIMIT_WORDS = {"rpm": "requests per minute", "tokens_per_day": "tokens per day (UTC)",
               "concurrent": "requests at once"}


def presented_key(headers) -> str | None:
    """The key a client sent: `Authorization: Bearer K` (OpenAI) or `x-api-key: K` (Anthropic)."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key") or None


def key_ok(key: str | None, keys: tuple[str, ...]) -> bool:
    """Constant-time check against every configured key (no early exit on a match)."""
    if key is None:
        return False
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(key.encode(), k.encode())
    return ok


def metered(method: str, path: str) -> bool:
    """Requests counted and limited per key: every POST (they make vLLM or the tools work) outside the proxy's own
    paths; GETs (models, health, metrics) cost nothing worth a quota. Pure."""
    return method == "POST" and routes.route_of(path).metered


def rate_limit_headers(refusal: Refusal, now: float) -> dict[str, str]:
    """Retry-After and the headers the OpenAI and Anthropic SDKs read on a 429. Pure."""
    seconds = max(1, math.ceil(refusal.retry_after))
    reset = datetime.datetime.fromtimestamp(now + seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kind = "tokens" if refusal.limit == "tokens_per_day" else "requests"
    return {"Retry-After": str(seconds), "retry-after-ms": str(math.ceil(refusal.retry_after * 1000)),
            f"x-ratelimit-limit-{kind}": str(refusal.allowed), f"x-ratelimit-remaining-{kind}": "0",
            f"x-ratelimit-reset-{kind}": f"{seconds}s",
            f"anthropic-ratelimit-{kind}-limit": str(refusal.allowed),
            f"anthropic-ratelimit-{kind}-remaining": "0", f"anthropic-ratelimit-{kind}-reset": reset}


def refused(wire: Wire, name: str, refusal: Refusal, now: float) -> Response:
    """A 429 in the route's error shape, with the headers clients retry by."""
    seconds = max(1, math.ceil(refusal.retry_after))
    resp = wire.error(429, f"Rate limit: the key {name!r} has used its {refusal.allowed} "
                      f"{LIMIT_WORDS[refusal.limit]} (its limit in PROXY_KEYS_FILE); try again in {seconds} s.",
                      wire.rate_limit_type)
    resp.headers.update(rate_limit_headers(refusal, now))
    return resp


def charged_tokens(scan: UsageReader, unseen: object, body_bytes: int) -> dict[str, int]:
    """The tokens a request is charged: the usage its answer carried, or the one the proxy kept from a stream that
    did not ask for it; and for a stream whose usage never came (its client hung up first, or it was relayed as it
    was without asking), at least every token its events carried and its prompt counted as a token per 4 bytes of
    the request's body. Pure."""
    tokens = scan.result()
    if isinstance(unseen, dict):  # a stream whose usage the client did not ask for: the proxy kept it
        tokens = {k: max(v, figures_of(unseen)[k]) for k, v in tokens.items()}
    if scan.stream:
        tokens["completion_tokens"] = max(tokens["completion_tokens"], scan.text_events)
        if not scan.usage_seen and not isinstance(unseen, dict):
            tokens["completion_tokens"] = max(tokens["completion_tokens"], scan.streamed_tokens())
            tokens["prompt_tokens"] = max(tokens["prompt_tokens"], -(-body_bytes // 4))
    return tokens


class Team:
    """One worker's keys, quotas and usage."""

    def __init__(self, cfg: Config, store: TeamStorage | None):
        self.cfg = cfg
        self.keys = KeysFile(cfg.proxy_keys_file) if cfg.proxy_keys_file else None
        if self.keys is not None:
            self.keys.people()  # read at the worker's start: a file broken later keeps this table in every worker
        self.store = store
        # SESSION_ID_SECRET (gunicorn.conf.py makes one for all workers when unset; replicas share the overlay's).
        self._salt_key = (cfg.session_id_secret or secrets.token_hex(32)).encode()

    def cache_salt(self, name: str) -> str:
        """The key's salt for vLLM's prefix cache: vLLM keeps the cached blocks of different salts apart, so no
        person can confirm a guess of another's prompt, block by block, from `cached_tokens` or from how fast the
        answer began. Derived with a secret, so nobody can compute another's and send it; 32 hex digits (vLLM takes
        up to 128 characters, none of '@', '/', backslash or NUL). Pure."""
        return hmac.new(self._salt_key, b"cache_salt:" + name.encode(), "sha256").hexdigest()[:32]

    @property
    def guarded(self) -> bool:
        """Whether a key is needed: PROXY_API_KEY is set, or the keys file exists."""
        return bool(self.cfg.proxy_api_keys) or (self.keys is not None and self.keys.exists())

    def who(self, key: str | None) -> Person | None:
        """The admin, a person with a live key, or None. Both checks run whatever the first found, so the time
        taken does not tell which kind of key was sent."""
        admin = key_ok(key, self.cfg.proxy_api_keys)
        person = self.keys.find(key) if self.keys is not None and key is not None else None
        if admin:
            return Person(ADMIN, "")
        return person if person is not None and not person.disabled else None

    def check(self, flow: Flow, headers, now: float) -> Response | None:
        """Before every route: a 401 for a key nobody holds, a 429 over a limit, else None with the request's
        key name (and, when metered, its place among the requests in flight) in its flow."""
        path, wire = flow.path, flow.wire
        if not self.guarded:
            return None
        if path in routes.OPEN_PATHS:
            return None
        key = presented_key(headers)
        person = self.who(key)
        if person is None and key is not None and self.keys is not None and self.keys.unreadable:
            # Loud, not a quiet 401: the person's key may be fine, the proxy cannot tell (keys.KeysFile).
            return wire.error(503, "The proxy cannot read its keys file (PROXY_KEYS_FILE), so no person's "
                                   "key can be checked; see its log.")
        if person is None:
            return wire.error(401, UNAUTHORIZED, "authentication_error")
        # Without a keys file everyone is the one admin: a single key, as before, and one line in the queue.
        flow.key_name = person.name if self.keys is not None else ANONYMOUS
        if self.keys is not None and person.name != ADMIN and path in ADMIN_ONLY:
            return wire.error(403, f"GET {path} needs the admin key (PROXY_API_KEY): it shows every "
                                   "key's usage by name.", "permission_error")
        if self.keys is not None:
            flow.cache_salt = self.cache_salt(person.name)
        if self.keys is None or self.store is None or not metered(flow.method, path):
            return None
        try:
            verdict = self.store.admit(person.name, person.limits if person.name != ADMIN else Limits())
        except (sqlite3.Error, StoreError) as e:
            log.error("usage store %s: %s", self.store.path, e)
            return wire.error(503, "The proxy cannot reach its usage store (PROXY_STATE_DB, or STATE_URL when "
                                   "set); see its log.")
        if isinstance(verdict, Refusal):
            metrics.key_limited(person.name, verdict.limit)
            return refused(wire, person.name, verdict, now)
        flow.admitted = verdict
        if flow.scan is None:  # a token count's, alpha search's or MCP's answer counts for a key's day all the same
            flow.scan = UsageScan()
        return None

    # ---- what the engine tells (subscribed by wiring.observe_team) ---------------------------------------

    def request_ended(self, flow: Flow, _done: RequestEnded) -> None:
        """The request's figures (its tokens, and the searches, page reads and refused fetches its flow's tally
        counted) added to its key's day, and it leaves the requests in flight."""
        admitted: Admitted | None = flow.admitted
        if admitted is None or self.store is None:
            return
        name = flow.key_name
        scan = flow.scan if flow.scan is not None else UsageScan()  # check() set one with `admitted`
        tokens = charged_tokens(scan, flow.usage_unseen, flow.body_bytes)
        figures: dict[str, float] = {**tokens, **flow.tally.figures(), "queued_seconds": flow.queued or 0.0}
        metrics.key_used(name, {"requests": 1, **figures})
        try:
            self.store.ended(admitted.id, name, figures)
        except (sqlite3.Error, StoreError) as e:  # the lease frees its concurrency slot; the figures are lost, and said so
            log.error("usage store %s: usage of a request of %r not recorded: %s", self.store.path, name, e)

    def usage(self) -> Response:
        """GET /proxy/usage: per key name, per UTC day, every figure (admin key only); a 503 while the store does
        not answer."""
        try:
            body = {"keys": self.store.usage() if self.store is not None else {},
                    "queue": self.store.queue_view() if self.store is not None and self.cfg.max_num_seqs else None}
        except (sqlite3.Error, StoreError) as e:
            log.error("usage store %s: %s", self.store.path if self.store is not None else "-", e)
            return error_response(503, "The proxy cannot reach its usage store (PROXY_STATE_DB, or STATE_URL when "
                                       "set); see its log.")
        return Response(codec.dumps(body), mimetype="application/json")
