#!/usr/bin/env python3
"""Manage the people's keys of a shared stack (docs/operations.md, "Sharing the stack"): the keys file PROXY_KEYS_FILE names.

  scripts/keys.py add NAME [--rpm N] [--tokens-per-day N] [--concurrent N]   prints the new key, once
  scripts/keys.py revoke NAME                                                 the proxy refuses it at the next request
  scripts/keys.py list                                                        names and limits, never keys

Every command takes --file PATH (default: $PROXY_KEYS_FILE). The file keeps a SHA-256 of each key, never the key;
it is written whole to a temporary file beside it and renamed over it (a reader sees the old file or the new one,
never half of one), readable by its owner alone (0600). The proxy notices the change at its next request.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from proxy.backends.state.keys import Limits, Person, check_name, digest, dump, new_key, parse  # noqa: E402


class Failure(Exception):
    """A one-line reason to stop, printed without a traceback."""


def read(path: str) -> list[Person]:
    try:
        with open(path, encoding="utf-8") as f:
            return parse(f.read())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise Failure(f"{path}: {e}") from None


def write(path: str, people: list[Person]) -> None:
    """Atomically: a temporary file in the same folder (so the rename stays on one file system), 0600, synced.
    A symlinked keys file (a mounted secret, a file kept elsewhere) is written where it points, the link kept."""
    path = os.path.realpath(path)
    folder = os.path.dirname(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".keys-", dir=folder)
    except OSError as e:
        raise Failure(f"cannot write beside {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            keep_owner(f.fileno(), path)
            f.write(dump(people))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise Failure(f"cannot write {path}: {e.strerror}") from None


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake as one line on stderr and exit status 2, like every other failure here (one line, non-zero)."""

    def error(self, message):
        self.exit(2, f"keys.py: {message} (see scripts/keys.py -h)\n")


def keep_owner(fd: int, path: str) -> None:
    """The new file keeps the old one's owner when we may give it (run as root): the proxy's container reads the
    file as uid 10001, and a 0600 file is readable by its owner alone (docs/operations.md, "Sharing the stack")."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
        os.fchown(fd, st.st_uid, st.st_gid)


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be above 0, not {value}")
    return value


def add(path: str, args) -> None:
    name = check_name(args.name)
    people = read(path)
    if any(p.name.casefold() == name.casefold() for p in people):
        raise Failure(f"{name!r} already has a key: revoke it first to give them a new one")
    key = new_key()
    created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    people.append(Person(name, digest(key), Limits(args.rpm, args.tokens_per_day, args.concurrent), False, created))
    write(path, people)
    print(key)  # the one time the key exists outside its holder's hands


def revoke(path: str, args) -> None:
    people = read(path)
    if not any(p.name == args.name for p in people):
        raise Failure(f"no key named {args.name!r} in {path}")
    # The entry is removed, not flagged: a revoked key has nothing left to match.
    write(path, [p for p in people if p.name != args.name])
    print(f"revoked {args.name}", file=sys.stderr)


def show(path: str, _args) -> None:
    def limit(value):
        return "-" if value is None else str(value)
    print(f"{'name':<24} {'rpm':>8} {'tokens/day':>12} {'concurrent':>10}  state     created")
    for p in read(path):
        print(f"{p.name:<24} {limit(p.limits.rpm):>8} {limit(p.limits.tokens_per_day):>12} "
              f"{limit(p.limits.concurrent):>10}  {'disabled' if p.disabled else 'active':<8}  {p.created}")


def main(argv=None) -> int:
    parser = OneLineParser(prog="scripts/keys.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = OneLineParser(add_help=False)
    common.add_argument("--file", default=os.environ.get("PROXY_KEYS_FILE", ""),
                        help="the keys file (default: $PROXY_KEYS_FILE)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    p_add = sub.add_parser("add", parents=[common], help="make a key for NAME and print it")
    p_add.add_argument("name")
    p_add.add_argument("--rpm", type=positive, help="requests per minute (default: no limit)")
    p_add.add_argument("--tokens-per-day", type=positive, help="prompt + completion tokens per UTC day")
    p_add.add_argument("--concurrent", type=positive, help="requests in flight at once")
    p_revoke = sub.add_parser("revoke", parents=[common], help="remove NAME's key")
    p_revoke.add_argument("name")
    sub.add_parser("list", parents=[common], help="names and limits (never keys)")
    args = parser.parse_args(argv)
    if not args.file:
        parser.error("no keys file: give --file PATH or set PROXY_KEYS_FILE")
    try:
        {"add": add, "revoke": revoke, "list": show}[args.command](args.file, args)
    except (Failure, ValueError) as e:
        print(f"keys.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
