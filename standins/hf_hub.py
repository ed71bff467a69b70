"""A stand-in Hugging Face Hub on loopback serving one tiny generated model repo; tests use `with HubStandin() as hub`.

It answers the requests huggingface_hub 2.4.0 really makes for snapshot_download (read from its source):
GET /api/models/{repo}/revision/{rev} (repo_info: id, sha, siblings), GET /api/models/{repo}/tree/{rev}
(list_repo_tree: type, path, size, oid, lfs) and HEAD/GET /{repo}/resolve/{rev}/{file} with X-Repo-Commit,
ETag and Content-Length, and byte ranges (206) for the client's resume after a dropped connection.
Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound) as the Hub's do.
"""
import hashlib
import json
import random
import re
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit

from .server import StandInServer

REPO_ID = "shawnw3i/Huihui-Qwen3.8-27B-abliterated-AWQ-MTP"


def tiny_repo(seed=7, shard_size=48 * 1024):
    """The real checkpoint's file names (7 shards + extra tensors, configs, tokenizer, template), tiny contents."""
    rng = random.Random(seed)
    files = {f"model-{i:05d}-of-00007.safetensors": rng.randbytes(shard_size + i) for i in range(1, 8)}
    files["model_extra_tensors.safetensors"] = rng.randbytes(shard_size // 2)
    files["model.safetensors.index.json"] = json.dumps(
        {"weight_map": {f"layer.{i}": f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)}}).encode()
    files["config.json"] = json.dumps({"architectures": ["Qwen3ForCausalLM"], "torch_dtype": "float16"}).encode()
    files["generation_config.json"] = b'{"do_sample": true, "temperature": 0.6}\n'
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode()
    files["tokenizer_config.json"] = b'{"eos_token": "<|im_end|>"}\n'
    files["chat_template.jinja"] = b"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    return files


class HubStandin(StandInServer):
    """Serves `files` as REPO_ID at branch `main`; knobs below let a test shape the hub's behaviour."""

    def __init__(self, files=None, repo_id=REPO_ID, host="127.0.0.1"):
        self.repo_id = repo_id
        self.files = dict(files if files is not None else tiny_repo())
        self.commit = hashlib.sha1(b"".join(k.encode() + v for k, v in sorted(self.files.items()))).hexdigest()
        self.advertised_sizes = {}  # path -> size the listing claims (e.g. a huge one to test the disk check)
        self.cut_once = set()  # paths whose first full GET is cut half-way (the client must resume with Range)
        self.requests = []  # (method, path, headers) of every request, for assertions
        # (status, X-Error-Code, message) every repo request is answered with, e.g. a gated repo without access:
        # the Hub answers 401 or 403 with X-Error-Code GatedRepo, and 401 for a token it doesn't know.
        self.deny = None
        self._lock = threading.Lock()
        # Started by `with` or start(); the container tier binds the Docker bridge's gateway, which containers can
        # reach. A restart after stop() takes the same port, as a hub back up would.
        super().__init__(host, start=False)

    def stop(self):
        """The hub goes down (a test then start()s it again)."""
        self.close()

    def downloads(self):
        """Paths fetched with GET .../resolve/... (HEAD requests are metadata, not downloads)."""
        return [p for m, p, _ in self.requests if m == "GET" and "/resolve/" in p]

    # -- content
    def etag(self, path):
        return hashlib.sha256(self.files[path]).hexdigest()

    def size(self, path):
        return self.advertised_sizes.get(path, len(self.files[path]))

    def tree_entry(self, path):
        data = self.files[path]
        entry = {"type": "file", "path": path, "size": self.size(path),
                 "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
        if path.endswith(".safetensors"):  # weights are LFS files on the real Hub
            entry["lfs"] = {"oid": self.etag(path), "size": self.size(path), "pointerSize": 134}
        return entry

    def handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_HEAD(self):
                self._route(body=False)

            def do_GET(self):
                self._route(body=True)

            def _send(self, status, payload=b"", headers=None, body=True):
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _json(self, status, obj, headers=None, body=True):
                self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})},
                           body)

            def _error(self, status, code, message, body=True):
                self._json(status, {"error": message}, {"X-Error-Code": code}, body)

            def _route(self, body):
                path = unquote(urlsplit(self.path).path)
                with hub._lock:
                    hub.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
                repo = re.escape(hub.repo_id)
                if hub.deny and hub.repo_id in path:
                    status, code, message = hub.deny
                    headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
                    return self._json(status, {"error": message}, headers, body)
                if m := re.fullmatch(rf"/api/models/{repo}/revision/([^/]+)", path):
                    if m[1] not in ("main", hub.commit):
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {m[1]}", body)
                    return self._json(200, {
                        "id": hub.repo_id, "modelId": hub.repo_id, "sha": hub.commit, "private": False,
                        "gated": False, "disabled": False,
                        "siblings": [{"rfilename": p} for p in sorted(hub.files)]}, body=body)
                if m := re.fullmatch(rf"/api/models/{repo}/tree/([^/]+)/?", path):
                    if m[1] not in ("main", hub.commit):
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {m[1]}", body)
                    return self._json(200, [hub.tree_entry(p) for p in sorted(hub.files)], body=body)
                if m := re.fullmatch(rf"/{repo}/resolve/([^/]+)/(.+)", path):
                    if m[1] not in ("main", hub.commit):
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {m[1]}", body)
                    if m[2] not in hub.files:
                        return self._error(404, "EntryNotFound", f"{m[2]} does not exist", body)
                    return self._file(m[2], body)
                if path.startswith("/api/models/") or "/resolve/" in path:
                    return self._error(404, "RepoNotFound", "Repository not found", body)
                return self._send(404, b"not found", body=body)

            def _file(self, name, body):
                data = hub.files[name]
                headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{hub.etag(name)}"', "Accept-Ranges": "bytes",
                           "Content-Type": "application/octet-stream"}
                start = 0
                if m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
                    start = int(m[1])
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                part = data[start:]
                status = 206 if start else 200
                if body and not start and name in hub.cut_once:
                    # Announce the whole file, send half, drop the connection: what a flaky network does.
                    hub.cut_once.discard(name)
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(part)))
                    self.end_headers()
                    self.wfile.write(part[: len(part) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._send(status, part, headers, body)

        return Handler
