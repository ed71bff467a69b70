"""People's keys: the keys file (PROXY_KEYS_FILE) that scripts/keys.py writes and the proxy reads, again whenever it
changes. Pure but for KeysFile's stat and read; proxy/http/app.py asks it who a request's key belongs to.

The file holds, per person, a name, the SHA-256 of the key (never the key), optional limits and a disabled flag:

    {"version": 1, "keys": [{"name": "alice", "sha256": "<64 hex>", "rpm": 60, "tokens_per_day": null,
                             "concurrent": 2, "disabled": false, "created": "2026-12-04T23:40:00Z"}]}

Why a plain SHA-256 and not a slow password hash: the keys are 256 random bits made by scripts/keys.py
(`secrets.token_urlsafe(32)`), not passwords a person picked, so there is no dictionary to try and 2^256 guesses
to make; a slow hash would only cost every request milliseconds of CPU. The hash keeps a leaked file (a backup, a
mount read by another container) from handing out working keys.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("proxy")

ADMIN = "admin"              # the name usage and the logs give PROXY_API_KEY's keys; no keys-file entry may take it
PREFIX = "sk-cs-"            # marks a key as this stack's in a leaked-secrets scan; the random part follows
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LIMITS = ("rpm", "tokens_per_day", "concurrent")


@dataclass(frozen=True)
class Limits:
    """A key's quotas; None is no limit."""
    rpm: int | None = None              # requests in any 60 seconds
    tokens_per_day: int | None = None   # prompt + completion tokens per UTC day
    concurrent: int | None = None       # requests in flight at once


@dataclass(frozen=True)
class Person:
    name: str
    sha256: str
    limits: Limits = Limits()
    disabled: bool = False
    created: str = ""


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str) -> str:
    """The name as given, or ValueError: it becomes a metric label and a log word, so it is kept plain."""
    if not NAME.fullmatch(name):
        raise ValueError(f"a key's name is 1-64 letters, digits, '.', '_' or '-' (starting with a letter or digit), "
                         f"not {name!r}")
    # In any case: "Admin" beside "admin" in the usage and the metrics would pass for the admin's figures.
    if name.casefold() == ADMIN:
        raise ValueError(f"{ADMIN!r} is the name of PROXY_API_KEY's keys; choose another")
    return name


def _limit(entry: dict, name: str) -> int | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{entry.get('name')!r}: {name} must be a whole number above 0 or null, not {value!r}")
    return value


def parse(text: str) -> list[Person]:
    """The people in a keys file's text, or ValueError saying what is wrong (never quoting a hash). Pure."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise ValueError('not a keys file: expected {"version": 1, "keys": [...]}')
    people, names = [], set()
    for entry in data["keys"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError("every entry needs a name")
        name = check_name(entry["name"])
        if name.casefold() in names:  # "Bob" and "bob" would read as one person in the usage
            raise ValueError(f"{name!r} appears twice (names are compared ignoring case)")
        names.add(name.casefold())
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError(f"{name!r}: sha256 must be 64 lowercase hex digits")
        people.append(Person(name, sha, Limits(*(_limit(entry, k) for k in LIMITS)), entry.get("disabled") is True,
                             str(entry.get("created") or "")))
    return people


def dump(people: list[Person]) -> str:
    """The keys file's text for `people`. Pure."""
    entries: list[dict[str, Any]] = [
        {"name": p.name, "sha256": p.sha256, "rpm": p.limits.rpm, "tokens_per_day": p.limits.tokens_per_day,
         "concurrent": p.limits.concurrent, "disabled": p.disabled, "created": p.created} for p in people]
    return json.dumps({"version": 1, "keys": entries}, indent=2) + "\n"


def find(people: tuple[Person, ...], key: str) -> Person | None:
    """The person whose key this is, compared in constant time against every entry (no early exit on a match, so
    the time taken does not tell how far down the file a key is). Disabled people are found too: the caller
    refuses them."""
    want = digest(key).encode()
    found = None
    for p in people:
        if hmac.compare_digest(want, p.sha256.encode()):
            found = p
    return found


class KeysFile:
    """PROXY_KEYS_FILE as the proxy reads it: parsed at first use and again when its stat (inode, size, mtime)
    changes, which scripts/keys.py's rename always does. One stat per request: a revoked key is refused at the
    next request, with no restart. A file that turns invalid keeps the last good table (logged once per change),
    so a half-edited file never opens or closes the door for everyone.

    It fails closed. A file this worker has read that then goes missing keeps its last table, and the stack stays
    behind keys (opening a shared stack takes a restart without PROXY_KEYS_FILE, never a deleted file). A file that
    is there but cannot be read (permissions, a directory in its place, a symlink loop) may hold a revoke the proxy
    cannot see, so no person's key works until it can be read again: their requests get a 503 saying so, the admin
    key still works, and the log says it at every change."""

    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple | None = None
        self._people: tuple[Person, ...] = ()
        self._seen = False         # this worker has found the file once: from then on it never opens the stack
        self.unreadable = False    # there, but not readable: no person's key works (Team.check's 503)

    def people(self) -> tuple[Person, ...]:
        try:
            st = os.stat(self.path)
            stamp: tuple = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = ("missing",)
        except OSError as e:
            stamp = ("unreadable", e.errno)
        if stamp != self._stamp:
            self._stamp = stamp
            self._reload(stamp)
        return () if self.unreadable else self._people

    def _reload(self, stamp: tuple) -> None:
        if stamp[0] == "missing":
            if self._seen:
                log.error("PROXY_KEYS_FILE %s is gone: keeping the %d keys read before, and a key is still needed "
                          "(restart without PROXY_KEYS_FILE to open the stack)", self.path, len(self._people))
            else:
                log.info("PROXY_KEYS_FILE %s does not exist (yet): no people's keys, PROXY_API_KEY alone decides",
                         self.path)
            self.unreadable = False
            return
        self._seen = True
        try:
            if stamp[0] == "unreadable":
                raise OSError(stamp[1], os.strerror(stamp[1]))
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            self.unreadable = True
            log.error("PROXY_KEYS_FILE %s cannot be read (%s): it may hold a revoke, so no person's key works until "
                      "it can be read; the admin key (PROXY_API_KEY) does", self.path, e)
            return
        self.unreadable = False
        try:
            people = parse(text)
        except ValueError as e:
            log.error("PROXY_KEYS_FILE %s: %s; keeping the %d keys read before", self.path, e, len(self._people))
            return
        self._people = tuple(people)
        log.info("PROXY_KEYS_FILE %s: %d keys (%d disabled)", self.path, len(people), sum(p.disabled for p in people))

    def exists(self) -> bool:
        """Whether a key is needed: there is a keys file (perhaps with nobody left in it, perhaps unreadable), or
        this worker has read one. A stack that never made one stays as it was, open or behind PROXY_API_KEY; once
        it exists, a key is needed even after the last person is revoked or the file is deleted."""
        self.people()
        return self._seen

    def find(self, key: str) -> Person | None:
        return find(self.people(), key)
