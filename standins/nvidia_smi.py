#!/usr/bin/env python3
"""A stand-in for `nvidia-smi` answering `--query-gpu=... --format=csv[,noheader][,nounits]` as the real one prints it;
tests/test_preflight.py puts it on PATH as `nvidia-smi`.

The cards come from FAKE_NVIDIA_SMI_GPUS: rows "name|driver|total MiB|used MiB" separated by ";" (free is total minus
used; the real tool also keeps a little reserved, which only makes free smaller). FAKE_NVIDIA_SMI_FAIL=1 answers as nvidia-smi does when it
cannot reach the kernel driver (its own message, exit 9). Formats follow nvidia-smi 580: ", " between fields,
"[MiB]" units in the header, " MiB" after values unless nounits.
"""
import os
import sys

FAIL_MESSAGE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                "Make sure that the latest NVIDIA driver is installed and running.")
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB"}


def main(argv):
    if os.environ.get("FAKE_NVIDIA_SMI_FAIL") == "1":
        print(FAIL_MESSAGE)
        return 9
    args = dict(a.split("=", 1) for a in argv if "=" in a)
    if "--query-gpu" not in args or "--format" not in args:
        print("stand-in nvidia-smi: only --query-gpu=... --format=csv is implemented", file=sys.stderr)
        return 2
    fields = args["--query-gpu"].split(",")
    fmt = set(args["--format"].split(","))
    rows = []
    for index, spec in enumerate(filter(None, os.environ.get("FAKE_NVIDIA_SMI_GPUS", "").split(";"))):
        name, driver, total, used = spec.split("|")
        rows.append({"index": str(index), "name": name, "driver_version": driver, "memory.total": total,
                     "memory.used": used, "memory.free": str(int(total) - int(used))})
    unknown = [f for f in fields if rows and f not in rows[0]]
    if unknown:
        print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stdout)
        return 2
    if "noheader" not in fmt:
        print(", ".join(f if "nounits" in fmt or f not in UNITS else f"{f} [{UNITS[f]}]" for f in fields))
    for row in rows:
        print(", ".join(row[f] if "nounits" in fmt or f not in UNITS else f"{row[f]} {UNITS[f]}" for f in fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
