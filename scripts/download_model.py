"""The logic of download-model.sh and of the compose `model` service (fetch or verify the checkpoint in the HF cache);
run it through ./download-model.sh, or `docker compose up model` (model/Dockerfile), never by hand.

It needs huggingface_hub 2.4.0 (the script's private venv, or the model image, provides it) and reads MODEL_DIR,
MODEL_ID, MODEL_REVISION, HF_TOKEN and HF_ENDPOINT from the environment; DOWNLOAD_PROG names it in its messages
and PROGRESS_INTERVAL (seconds, 0 = off) paces its progress lines, on by default when stderr is not a terminal
(`docker compose logs`), where a progress bar would be one endless line. Every failure ends in one line on stderr
and exit status 1; the last line on stdout says what was found or done.
"""
import datetime
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

PROG = os.environ.get("DOWNLOAD_PROG") or "download-model.sh"
DEFAULT_MODEL = "shawnw3i/Huihui-Qwen3.8-27B-abliterated-AWQ-MTP"
# Recorded inside the repo's cache folder, so deleting that folder resets the record with the files.
MANIFEST = ".coding-stack-manifest.json"
# Room left on the disk after the download, for the filesystem and vLLM's own writes under HF_HOME.
HEADROOM = 512 * 2**20


def die(message):
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(1)


def info(message):
    print(f"{PROG}: {message}", file=sys.stderr)


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def rate_text(bytes_per_s):
    return f"{bytes_per_s / 2**20:.1f} MiB/s"


def duration_text(seconds):
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def progress_line(done_files, total_files, have, total, fetched, elapsed):
    """One log line: files, bytes, share, the rate of this run (bytes fetched over seconds) and the ETA it gives."""
    share = 100 * have / total if total else 100
    line = f"{done_files}/{total_files} files, {gib(have)} of {gib(total)} ({share:.0f}%)"
    if elapsed <= 0 or fetched <= 0:
        return f"{line}, waiting for data"
    rate = fetched / elapsed
    return f"{line}, {rate_text(rate)}, ETA {duration_text(max(total - have, 0) / rate)}"


def enough_disk(need, free, headroom=None):
    """None when `need` bytes (plus headroom) fit in `free`, else the one line that says they don't."""
    headroom = HEADROOM if headroom is None else headroom
    if need + headroom <= free:
        return None
    return (f"{gib(need)} to download (+{gib(headroom)} headroom), {gib(free)} free: "
            f"free {gib(need + headroom - free)} or point MODEL_DIR at a bigger disk")


def progress_interval():
    value = os.environ.get("PROGRESS_INTERVAL")
    if value:
        try:
            return max(float(value), 0.0)
        except ValueError:
            die(f"PROGRESS_INTERVAL must be a number of seconds, not {value!r}")
    return 0.0 if sys.stderr.isatty() else 10.0


class Progress:
    """Prints a progress line every `interval` seconds while the client downloads, and one at the end.

    It measures what is on disk, not what the client reports: complete files in the snapshot folder plus the
    `.incomplete` blobs the client is writing, so it is right whatever the client does with its own bars."""

    def __init__(self, storage, snapshot, files, interval):
        self.storage, self.snapshot, self.files, self.interval = storage, snapshot, files, interval
        self.total = sum(files.values())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start_have, self._started = self.measure()[1], time.monotonic()

    def measure(self):
        done, have = 0, 0
        for path, want in self.files.items():
            local = self.snapshot / path
            if local.exists() and local.stat().st_size == want:
                done, have = done + 1, have + want
        for partial in (self.storage / "blobs").glob("*.incomplete"):
            try:
                have += partial.stat().st_size
            except OSError:  # finished and renamed meanwhile
                pass
        return done, min(have, self.total)

    def line(self):
        done, have = self.measure()
        return progress_line(done, len(self.files), have, self.total, have - self._start_have,
                             time.monotonic() - self._started)

    def _run(self):
        while not self._stop.wait(self.interval):
            info(self.line())

    def __enter__(self):
        if self.interval > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.interval > 0:
            self._thread.join()
            info(self.line())


def one_line(error):
    text = str(error).strip().splitlines()
    return (f"{type(error).__name__}: {text[0]}" if text else type(error).__name__)[:300]


def remote_listing(repo_id, revision):
    """(commit, {path: size}) from the hub, or (None, reason) when the hub cannot be reached."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()  # endpoint from HF_ENDPOINT and token from HF_TOKEN, as huggingface_hub reads them
    try:
        commit = api.model_info(repo_id, revision=revision, timeout=30).sha
        files = {f.path: f.size for f in api.list_repo_tree(repo_id, revision=commit, recursive=True)
                 if isinstance(f, RepoFile)}
    except (httpx2.TransportError, OfflineModeIsEnabled) as error:
        return None, one_line(error)
    except GatedRepoError:
        die(f"{repo_id} is gated: accept its terms on the hub, then set HF_TOKEN to a token of that account")
    except RepositoryNotFoundError:
        die(f"{repo_id} not found on {constants.ENDPOINT} (a private or gated repo needs HF_TOKEN: set it in .env)")
    except RevisionNotFoundError:
        die(f"{repo_id} has no revision '{revision}' on {constants.ENDPOINT}")
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else 0
        if status in (401, 403):
            die(f"the hub refused access to {repo_id} (HTTP {status}): check HF_TOKEN")
        if status >= 500:  # the hub is down: as good as unreachable, the local record decides
            return None, f"HTTP {status} from {constants.ENDPOINT}"
        die(f"the hub answered HTTP {status} for {repo_id}: {one_line(error)}")
    if not commit or not files:
        die(f"the hub at {constants.ENDPOINT} listed no files for {repo_id}@{revision}")
    return commit, files


def check(snapshot, files):
    """Lists of (path) missing and (path, have, want) wrong-size files under the snapshot folder."""
    missing, wrong = [], []
    for path, want in sorted(files.items()):
        local = snapshot / path
        if not local.exists():  # also a dangling symlink whose blob was deleted
            missing.append(path)
        elif local.stat().st_size != want:
            wrong.append((path, local.stat().st_size, want))
    return missing, wrong


def describe(missing, wrong):
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    for path, have, want in wrong[:3]:
        parts.append(f"{path} has {have} of {want} bytes")
    return "; ".join(parts)


def write_manifest(path, repo_id, revision, commit, files, endpoint):
    record = {"repo_id": repo_id, "revision": revision, "commit": commit, "endpoint": endpoint,
              "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "files": files}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def main():
    interval = progress_interval()
    if interval > 0:
        # The client's own bars redraw one line with carriage returns: noise in a log. Read at its import.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from huggingface_hub import constants, snapshot_download

    model_dir = Path(os.environ.get("MODEL_DIR") or "/storage-models/vllm")
    repo_id = os.environ.get("MODEL_ID") or DEFAULT_MODEL
    revision = os.environ.get("MODEL_REVISION") or "main"
    cache_dir = model_dir / "hub"  # the layout vLLM reads with HF_HOME=/models
    storage = cache_dir / ("models--" + repo_id.replace("/", "--"))
    manifest_path = storage / MANIFEST
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        die(f"cannot create {cache_dir}: {error.strerror} (set MODEL_DIR to a folder you can write)")
    if not os.access(cache_dir, os.W_OK):
        die(f"{cache_dir} is not writable (set MODEL_DIR to a folder you can write)")

    commit, files = remote_listing(repo_id, revision)
    if commit is None:
        reason = files
        if not manifest_path.is_file():
            die(f"cannot reach the hub at {constants.ENDPOINT} ({reason}) and {storage} has no download record: "
                f"check the network (HF_ENDPOINT names a mirror), then run again")
        try:
            record = json.loads(manifest_path.read_text())
            commit, files = record["commit"], {k: int(v) for k, v in record["files"].items()}
        except (ValueError, KeyError, TypeError) as error:
            die(f"cannot reach the hub ({reason}) and the download record {manifest_path} is unreadable: {error}")
        missing, wrong = check(storage / "snapshots" / commit, files)
        if missing or wrong:
            die(f"cannot reach the hub at {constants.ENDPOINT} ({reason}) and the cache is incomplete: "
                f"{describe(missing, wrong)}; run again when the hub is reachable")
        print(f"already cached: {len(files)} files, {gib(sum(files.values()))} in {storage} "
              f"(hub unreachable; checked against the record of {record.get('recorded_at', '?')})")
        return

    snapshot = storage / "snapshots" / commit
    missing, wrong = check(snapshot, files)
    total = sum(files.values())
    if not missing and not wrong:
        write_manifest(manifest_path, repo_id, revision, commit, files, constants.ENDPOINT)
        print(f"already cached: {len(files)} files, {gib(total)} in {storage}")
        return

    # huggingface_hub trusts any file already in the cache, so a wrong-sized one must go before it fetches again.
    for path, have, want in wrong:
        info(f"{'truncated' if have < want else 'wrong size'}: {path} ({have} of {want} bytes), fetching it again")
        local = snapshot / path
        blob = Path(os.path.realpath(local))
        local.unlink()
        if blob != local and blob.exists():
            blob.unlink()
    need = sum(files[p] for p in missing) + sum(want for _, _, want in wrong)
    problem = enough_disk(need, shutil.disk_usage(cache_dir).free)
    if problem:
        die(f"not enough disk space in {cache_dir}: {problem}")
    info(f"fetching {len(missing) + len(wrong)} of {len(files)} files ({gib(need)}) "
         f"from {constants.ENDPOINT} into {storage}")
    try:
        with Progress(storage, snapshot, files, interval):
            snapshot_download(repo_id, revision=revision, cache_dir=str(cache_dir))
    except Exception as error:  # whatever the client raises, the user gets one line, not a traceback
        die(f"download failed (files already complete are kept; run again for the rest): {one_line(error)}")
    missing, wrong = check(snapshot, files)
    if missing or wrong:
        die(f"download finished but the cache does not match the hub: {describe(missing, wrong)}")
    write_manifest(manifest_path, repo_id, revision, commit, files, constants.ENDPOINT)
    print(f"downloaded: {len(files)} files, {gib(total)} in {storage}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        die("interrupted (files already complete are kept; run again for the rest)")
