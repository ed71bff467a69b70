# The proxy's image (proxy-passthrough.py under gunicorn on :11433); built by `docker compose build proxy`.
FROM python:3.11-slim

# No .pyc files in the image, logs straight to `docker logs`, no pip self-update nag at build time.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: editing the proxy's code does not re-run pip.
COPY requirements.txt ./
# Exactly the hashed lock the test suite runs on, transitive packages included (--require-hashes refuses anything
# unpinned or altered), installed once here and never at container start. --no-deps: the lock is the whole list,
# so pip never resolves and no release upstream, nor any pip version's reading of an extra (justext's
# lxml[html_clean]), can change or refuse what gets installed; pip check then fails the build, not an import, on a
# requirement the lock left out. tests/test_lock_install.py runs this line on every change, and checks the extras
# that dependencies ask for too, which pip check does not.
RUN pip install --no-cache-dir --no-deps --require-hashes -r requirements.txt && pip check

# An unprivileged account: a bug in the proxy must not get root in the container. Not named `proxy`: Debian's
# base-passwd already has a `proxy` user (uid 13) in every Debian image, so useradd would fail.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin coding-stack

# gunicorn's workers write their metric values here and a scrape of /proxy/metrics sums them (proxy/observe/metrics.py);
# compose mounts an empty tmpfs over it at each start. Without one (a bare `docker run`), add `--tmpfs /tmp/proxy-metrics`.
ENV PROMETHEUS_MULTIPROC_DIR=/tmp/proxy-metrics
RUN mkdir -p /tmp/proxy-metrics && chown coding-stack /tmp/proxy-metrics
# PROXY_STATE_DB's folder, and where compose.scale.yaml's replicas keep their shared X-Session-ID key: a new named
# volume takes this folder's owner, so the unprivileged user can write it.
RUN mkdir -p /var/lib/proxy && chown coding-stack /var/lib/proxy
# The image's user has no home folder, so the default beside it (~/.local/state) is no place: a bare `docker run`
# with keys keeps usage here, which lasts as long as a volume mounted on the folder (compose mounts one).
ENV PROXY_STATE_DB=/var/lib/proxy/state.sqlite3

# glibc's malloc keeps a worker's big freed blocks for the next request instead of handing them back at once. Decoding a
# body over ~2.7 MB (a late turn of a long agent session), orjson reserves a working buffer 12 times its size (37 MB
# at 3.1 MB): above the 32 MB up to which glibc reuses mapped memory, so by default it was mapped anew, and faulted in
# page by page, on every such request. With no mmap for malloc (mmap_max=0) it comes from the heap, and a heap top of
# up to 128 MB stays for reuse (trim_threshold): 1-1.7 ms less at 3.1 MB, ~10-40 MB more resident per worker after
# big requests; what is freed above 128 MB goes back. Huge pages (hugetlb=1) where the heap grows. docs/performance.md,
# "Freed after the answer, and big blocks kept". Read by glibc when gunicorn starts; the tests' proxies take this line
# too (standins/proxy_process.py).
ENV GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=134217728

COPY gunicorn.conf.py proxy-passthrough.py ./
COPY proxy/ ./proxy/

USER coding-stack
EXPOSE 11433
CMD ["gunicorn", "--config", "gunicorn.conf.py", "proxy-passthrough:app"]
