# The proxy's image (proxy-passthrough.py under gunicorn on :11433); built by `docker compose build proxy`.
FROM python:3.11-slim

# No .pyc files in the image, logs straight to `docker logs`, no pip self-update nag at build time.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: editing the proxy's code does not re-run pip.
COPY requirements.txt ./
# The pinned versions are installed once, here, never at container start.
RUN pip install --no-cache-dir -r requirements.txt

# An unprivileged account: a bug in the proxy must not get root in the container.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin proxy

COPY gunicorn.conf.py proxy-passthrough.py ./
COPY proxy/ ./proxy/

USER proxy
EXPOSE 11433
CMD ["gunicorn", "--config", "gunicorn.conf.py", "proxy-passthrough:app"]
