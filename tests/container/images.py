"""Stand-ins, built from Debian packages, for the images the CPU trial (and its monitoring profile) pins but this machine
cannot pull, each tagged with the exact name the compose files and Dockerfiles use so they all
run unchanged; used by tests/container/conftest.py.

Each is a Debian root filesystem made by mmdebstrap and imported with `docker import`, keyed by
everything that goes into it: an image whose key matches is reused ("already built").
- python:3.11-slim: Debian's python3.11 with the real image's pip (24.0, base-pip.txt, hashed; not Debian's 23.0.1:
  pip's version decides how a lock is read), `python`/`pip` on PATH, pip free to install (no EXTERNALLY-MANAGED
  marker, as in the real image), Debian's base-passwd accounts (so its `proxy` user, uid 13, is there as in the real
  one), and the host's CA bundle so pip inside a build trusts what pip on the host trusts. What still differs from
  the real image: its Python is Debian bookworm's 3.11.2 build in /usr/bin, the real one a 3.11 patch release of its
  own in /usr/local, on a Debian that moves with the tag (docs/testing.md, "Base images").
- vLLM's CPU image (public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo, compose.cpu.yaml): the real
  `vllm serve` (the CPU build the real-vLLM tier uses, copied from its venv) behind the image's
  entrypoint contract: `vllm serve` as entrypoint, python3 and curl on PATH, root, /vllm-workspace.
- prom/prometheus (the `monitoring` profile, tests/container/test_monitoring_profile.py): Debian's prometheus
  package, the server the real-vLLM tier's monitoring tests run, as the image's user with its paths.
- searxng/searxng: standins/searxng.py (and the server.py it builds on) serving SearXNG's JSON API and /healthz on 8080 from
  /usr/local/searxng/entrypoint.sh, with GNU wget, as the `searxng` user.
"""
from __future__ import annotations

import hashlib
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SUITE = "bookworm"  # the Debian release with python3.11, the version python:3.11-slim carries
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
KEY_LABEL = "org.coding-stack.standin-key"
# Bump when the recipe below changes in a way its inputs don't show.
RECIPE = "2"
BASE_PIP = HERE / "base-pip.txt"


@dataclass
class Image:
    tag: str
    packages: list[str]
    hooks: list[str]           # mmdebstrap --customize-hook commands ($1 is the new root)
    changes: list[str]         # Dockerfile instructions for `docker import --change`
    inputs: list[Path]         # files whose content goes into the image (part of the key)
    extra_key: str = ""

    def key(self) -> str:
        h = hashlib.sha256(f"{RECIPE}\n{SUITE}\n{self.tag}\n{self.packages}\n{self.hooks}\n{self.changes}\n{self.extra_key}".encode())
        for path in self.inputs:
            h.update(path.read_bytes())
        return h.hexdigest()[:16]


def base_pip_wheel(cache: Path) -> Path:
    """The wheel base-pip.txt names, downloaded once into `cache` with its hash checked (pip's --require-hashes)."""
    folder = cache / "base-pip"
    wheels = sorted(folder.glob("pip-*.whl")) if folder.is_dir() else []
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                        "--only-binary", ":all:", "-d", str(folder), "-r", str(BASE_PIP)], check=True, timeout=300)
        wheels = sorted(folder.glob("pip-*.whl"))
    (wheel,) = wheels
    return wheel


def python_slim(tag: str, pip_wheel: Path) -> Image:
    return Image(
        tag=tag,
        packages=["python3.11", "python3-setuptools", "python3-wheel", "ca-certificates", "netbase", "tzdata"],
        hooks=[
            # The real image's interpreter is its own build in /usr/local, which pip may install into.
            'rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED',
            'ln -sf /usr/bin/python3.11 "$1"/usr/local/bin/python',
            'ln -sf /usr/bin/python3.11 "$1"/usr/local/bin/python3',
            # The real image's pip, installed by itself from its own wheel (a wheel runs as a zip on sys.path): it
            # lands in /usr/local with `pip`, `pip3` and `pip3.11` on PATH, as there.
            f'cp {shlex.quote(str(pip_wheel))} "$1"/tmp/{pip_wheel.name}',
            f'chroot "$1" python3.11 /tmp/{pip_wheel.name}/pip install --quiet --no-index --no-deps /tmp/{pip_wheel.name}',
            f'rm "$1"/tmp/{pip_wheel.name}',
            # A host behind a TLS-inspecting proxy: pip in a build must trust the same roots as on the host. The real
            # pip reads its own certifi bundle, not the system's (Debian's pip is patched to), so it is pointed there.
            f'cp {shlex.quote(str(HOST_CA_BUNDLE))} "$1"/etc/ssl/certs/ca-certificates.crt',
            "printf '[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n' > \"$1\"/etc/pip.conf",
        ],
        changes=["ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "ENV LANG=C.UTF-8", "ENV PYTHON_VERSION=3.11", 'CMD ["python3"]'],
        inputs=[HOST_CA_BUNDLE, BASE_PIP],
    )


def vllm(tag: str, venv: Path) -> Image:
    site = venv / "lib" / "python3.11" / "site-packages"
    stamp = (venv / ".complete").read_text().strip()
    return Image(
        tag=tag,
        packages=["python3.11", "curl", "ca-certificates", "libstdc++6", "libnuma1"],
        hooks=[
            'chroot "$1" python3.11 -m venv --without-pip /opt/venv',
            f'cp -a {shlex.quote(str(site))}/. "$1"/opt/venv/lib/python3.11/site-packages/',
            # pip's own console script (its __main__ guard matters: vLLM spawns workers that re-import it),
            # pointed at the image's interpreter.
            f'sed "1s|.*|#!/opt/venv/bin/python|" {shlex.quote(str(venv / "bin" / "vllm"))} > "$1"/opt/venv/bin/vllm',
            'chmod 755 "$1"/opt/venv/bin/vllm',
            'mkdir -p "$1"/vllm-workspace',
        ],
        changes=["ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "ENV VIRTUAL_ENV=/opt/venv", "WORKDIR /vllm-workspace", 'ENTRYPOINT ["vllm", "serve"]'],
        inputs=[],
        extra_key=stamp,
    )


SEARXNG_FILES = [HERE / "searxng_image" / "entrypoint.sh", HERE / "searxng_image" / "server.py",
                 REPO / "standins" / "server.py", REPO / "standins" / "searxng.py"]


def searxng(tag: str) -> Image:
    target = '"$1"/usr/local/searxng'
    return Image(
        tag=tag,
        packages=["python3", "python3-yaml", "wget", "ca-certificates"],
        hooks=[
            f'mkdir -p {target}/standins "$1"/etc/searxng',
            *[f'cp {shlex.quote(str(p))} {target}/{"standins/" if p.parent.name == "standins" else ""}{p.name}'
              for p in SEARXNG_FILES],
            f'chmod 755 {target}/entrypoint.sh',
            'chroot "$1" useradd --system --uid 977 --home-dir /usr/local/searxng --shell /bin/sh searxng',
        ],
        changes=["ENV SEARXNG_SETTINGS_PATH=/etc/searxng/settings.yml", "WORKDIR /usr/local/searxng",
                 "USER searxng", "EXPOSE 8080", 'ENTRYPOINT ["/usr/local/searxng/entrypoint.sh"]'],
        inputs=SEARXNG_FILES,
    )


def prometheus(tag: str) -> Image:
    """The monitoring profile's Prometheus: Debian's own package (the release the real-vLLM tier runs) behind the
    image's contract: the binary at /bin/prometheus, a shell and wget, the `nobody` user, /prometheus its own."""
    return Image(
        tag=tag,
        packages=["prometheus", "wget"],
        hooks=[
            # The real image's data folder: a new named volume copies its owner, so Prometheus (nobody) can write.
            'mkdir -p "$1"/prometheus "$1"/etc/prometheus',
            'chown 65534:65534 "$1"/prometheus',
        ],
        changes=["USER nobody", "EXPOSE 9090", "WORKDIR /prometheus", 'ENTRYPOINT ["/bin/prometheus"]'],
        inputs=[],
    )


def built_key(engine, tag: str) -> str | None:
    proc = engine.docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{KEY_LABEL}"}}}}', tag, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure(engine, image: Image, log) -> str:
    """Builds `image` unless one with its key is there; returns what it found or did."""
    key = image.key()
    if built_key(engine, image.tag) == key:
        return f"{image.tag}: already built ({key})"
    cmd = ["mmdebstrap", "--quiet", "--variant=minbase", "--include=" + ",".join(image.packages)]
    cmd += [f"--customize-hook={hook}" for hook in image.hooks]
    cmd += [SUITE, "-"]
    importer = ["docker", "import", *[a for c in [*image.changes, f"LABEL {KEY_LABEL}={key}"] for a in ("--change", c)],
                "-", image.tag]
    build = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
    imported = subprocess.run(importer, stdin=build.stdout, env=engine.env, stdout=log, stderr=log, timeout=1200)
    build.stdout.close()
    if build.wait(timeout=60) != 0 or imported.returncode != 0:
        raise RuntimeError(f"building the stand-in {image.tag} failed (mmdebstrap {build.returncode}, "
                           f"docker import {imported.returncode}); see {getattr(log, 'name', 'the build log')}")
    if built_key(engine, image.tag) != key:
        raise RuntimeError(f"the stand-in {image.tag} was imported without its key label")
    # The build it replaced is now untagged: without this the cached engine grows by an image per change.
    engine.docker("image", "prune", "--force")
    return f"{image.tag}: built ({key})"
