#!/usr/bin/env bash
# The image as an operator meets it: built from the Dockerfile by a real engine (Debian's podman), run with the
# documented flags, a step of every kind sent, stopped with a browser step and a python step in flight (both
# must finish), and started without privileges (it must stay up and unready, and `sandboxd doctor` must name
# what is missing). The last line is the verdict:
#
#   image-test: bookworm amd64 14 passed, 0 failed
#
#   bash scripts/image-test.sh [--debian bookworm|trixie] [--arch amd64|arm64] [--smoke] [--plan] [--keep]
#
# No registry is reached but the package indexes (Debian's, PyPI, npm): the Dockerfile's base,
# python:<version>-slim-<debian>, is Docker Hub's, so when it is not at hand a stand-in of the same name is made
# from Debian's packages (mmdebstrap --variant=minbase, then `podman import`) with a Python >= 3.12 in
# /usr/local: trixie's own python3 (3.13), or on bookworm (3.11 only) the host's CPython 3.12 copied in. An
# arm64 image builds through qemu-user-static (Debian's), from a trixie base; --smoke then runs the image's
# smoke under emulation (doctor, python, C++, SQL; the browser only where it starts in time).
# Figures (build time, size, start to ready) are printed and belong in docs/deploy.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEBIAN=bookworm ARCH=amd64 SMOKE= PLAN= KEEP=
while (($#)); do
  case $1 in
    --debian) DEBIAN=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --plan) PLAN=1; shift ;;
    --keep) KEEP=1; shift ;;
    *) sed -n 9p "$0" >&2; exit 2 ;;
  esac
done
case $DEBIAN in bookworm | trixie) ;; *) echo "image-test: --debian bookworm or trixie, not $DEBIAN" >&2; exit 2 ;; esac
case $ARCH in amd64 | arm64) ;; *) echo "image-test: --arch amd64 or arm64, not $ARCH" >&2; exit 2 ;; esac
[[ $ARCH == arm64 && $DEBIAN == bookworm ]] && { echo "image-test: arm64 builds from trixie (bookworm has no Python >= 3.12 for it)" >&2; exit 2; }
case $DEBIAN in bookworm) PY=3.12 ;; trixie) PY=3.13 ;; esac
BASE=docker.io/library/python:$PY-slim-$DEBIAN
TAG=localhost/sandboxd-image-test:$DEBIAN-$ARCH
WORK=${SANDBOXD_IMAGE_TEST_DIR:-/var/tmp/sandboxd-image-test}/$DEBIAN-$ARCH
PORT=${SANDBOXD_IMAGE_TEST_PORT:-18080}
KEY=image-test-key-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
if [[ -n $PLAN ]]; then
  echo "base: $BASE ($(command -v podman >/dev/null && podman image exists "$BASE" 2>/dev/null && echo present || echo "a stand-in, from Debian's packages"))"
  echo "build: podman build --format docker --platform linux/$ARCH --build-arg DEBIAN=$DEBIAN --build-arg PYTHON_VERSION=$PY -t $TAG"
  echo "run: podman run --privileged --ulimit nofile=16384:16384 --ulimit nproc=32768:32768 -p 127.0.0.1:$PORT:8080 -e SANDBOXD_API_KEYS_FILE=..."
  echo "cases: $([[ -n $SMOKE ]] && echo smoke || echo "every kind, metrics, doctor, healthcheck, stop with steps in flight, unprivileged start")"
  exit 0
fi
[[ $EUID == 0 ]] || { echo "image-test: needs root (podman, mmdebstrap)" >&2; exit 1; }
log() { printf '[image-test %s] %s\n' "$(date +%T)" "$*"; }
mkdir -p "$WORK"

# ---- the engine: Debian's podman, with runc (crun refuses a hybrid cgroup tree such as this VM's)
pkgs=(podman runc mmdebstrap skopeo uidmap)
[[ $ARCH == arm64 ]] && pkgs+=(qemu-user-static binfmt-support)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PODMAN=(podman --runtime runc)
LIMITS=(--ulimit nofile=16384:16384 --ulimit nproc=32768:32768)

# ---- the base: Docker Hub's python image, or a stand-in of the same name from Debian's packages
if ! "${PODMAN[@]}" image exists "$BASE"; then
  log "making a stand-in for $BASE from Debian's packages"
  rootfs=$WORK/rootfs.tar
  include=ca-certificates,netbase
  [[ $DEBIAN == trixie ]] && include+=,python3,python3-pip,python3-venv
  mmdebstrap --variant=minbase --architectures="$ARCH" --include="$include" "$DEBIAN" "$rootfs" \
    >/dev/null 2>"$WORK/mmdebstrap.log" || { tail -20 "$WORK/mmdebstrap.log" >&2; exit 1; }
  "${PODMAN[@]}" import --arch "$ARCH" "$rootfs" "localhost/debian-minbase:$DEBIAN-$ARCH" >/dev/null
  ctx=$WORK/base
  rm -rf "$ctx" && mkdir -p "$ctx/cas"
  # The host's own CAs (a TLS-inspecting proxy's, say: the package registries are reached through one here) go
  # where Debian's ca-certificates adds them to the image's trust, as an operator behind such a proxy must do.
  cp /usr/local/share/ca-certificates/*.crt "$ctx/cas/" 2>/dev/null || true
  if [[ $DEBIAN == bookworm ]]; then
    # Bookworm's python3 is 3.11: the host's CPython 3.12 (pyenv's build, relocatable) goes to /usr/local; its
    # pip scripts name the host's path in their #! line, so pip is run as a module instead.
    src=$(ls -d /root/.pyenv/versions/3.12* 2>/dev/null | head -1)
    [[ -n $src ]] || { echo "image-test: no CPython 3.12 on this host to make the bookworm base with" >&2; exit 1; }
    cp -a "$src" "$ctx/python"
    cat > "$ctx/Containerfile" <<EOF
FROM localhost/debian-minbase:$DEBIAN-$ARCH
COPY cas /usr/local/share/ca-certificates
COPY python /usr/local
RUN update-ca-certificates >/dev/null && ldconfig && ln -sf python3 /usr/local/bin/python && for p in pip pip3 pip3.12; do \\
      printf '#!/bin/sh\\nexec /usr/local/bin/python3 -m pip "\$@"\\n' > /usr/local/bin/\$p && chmod 755 /usr/local/bin/\$p; \\
    done && python --version && pip --version
EOF
  else
    cat > "$ctx/Containerfile" <<EOF
FROM localhost/debian-minbase:$DEBIAN-$ARCH
COPY cas /usr/local/share/ca-certificates
RUN update-ca-certificates >/dev/null && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && ln -sf /usr/bin/python3 /usr/local/bin/python \\
 && ln -sf /usr/bin/pip3 /usr/local/bin/pip && python --version
EOF
  fi
  "${PODMAN[@]}" build --format docker --platform "linux/$ARCH" -t "$BASE" "$ctx" >"$WORK/base-build.log" 2>&1
fi

# ---- the image
t0=$(date +%s)
log "building $TAG from $ROOT/Dockerfile (log: $WORK/build.log)"
"${PODMAN[@]}" build --format docker --platform "linux/$ARCH" --build-arg "DEBIAN=$DEBIAN" \
  --build-arg "PYTHON_VERSION=$PY" -t "$TAG" -f "$ROOT/Dockerfile" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log" >&2; echo "image-test: $DEBIAN $ARCH 0 passed, 1 failed (the build)"; exit 1; }
built=$(($(date +%s) - t0))
size=$("${PODMAN[@]}" image inspect "$TAG" --format '{{.Size}}')
log "built in ${built} s: $((size / 1000000)) MB"

passed=0 failed=0
check() { # name, command...: one case, counted
  local name=$1; shift
  if "$@" >"$WORK/case.log" 2>&1; then passed=$((passed + 1)); log "ok   $name"
  else failed=$((failed + 1)); log "FAIL $name: $(tail -3 "$WORK/case.log" | tr '\n' ' ')"; fi
}
echo "$KEY" > "$WORK/keys"
chmod 644 "$WORK/keys"
cleanup() { [[ -n $KEEP ]] || "${PODMAN[@]}" rm -f sbx-test sbx-unpriv >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
URL=http://127.0.0.1:$PORT
auth=(-H "Authorization: Bearer $KEY" -H 'content-type: application/json')
step() { curl -sf -m 120 "${auth[@]}" "$URL/rollout/step" -d "$1"; }
ok() { step "$1" | python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(0 if r["ok"] else print(r) or 1)'; }
ready() { for _ in $(seq 1 "$1"); do curl -sf -m 5 "$URL/readyz" >/dev/null && return 0; sleep 1; done; return 1; }

# ---- run as documented (docs/deploy.md): privileged, a keys file, the port
t0=$(date +%s)
"${PODMAN[@]}" run -d --name sbx-test --privileged "${LIMITS[@]}" -p "127.0.0.1:$PORT:8080" \
  -v "$WORK/keys:/etc/sandboxd/keys:ro" -e SANDBOXD_API_KEYS_FILE=/etc/sandboxd/keys \
  -e SANDBOXD_SHUTDOWN_GRACE_S=60 "$TAG" >/dev/null
patience=$([[ $ARCH == arm64 ]] && echo 1800 || echo 300)
check "ready (/readyz 200)" ready "$patience"
log "start to ready: $(($(date +%s) - t0)) s"
check "healthcheck kept (podman --format docker)" bash -c "[[ -n \$(${PODMAN[*]} image inspect $TAG --format '{{.Config.Healthcheck}}' | tr -d '<>nil') ]]"
check "doctor in the container" "${PODMAN[@]}" exec sbx-test sandboxd doctor
check "python: numpy" ok '{"runner": "python", "action": {"code": "import numpy; print(numpy.arange(4).sum())"}}'
check "code: C++" ok '{"runner": "code", "action": {"language": "cpp", "code": "#include <cstdio>\nint main(){puts(\"hi\");}"}}'
check "sql: TPC-H Q6" ok '{"runner": "sql", "action": {"tpch": 6}}'
if [[ -z $SMOKE ]]; then
  check "python: a session keeps its state" bash -c "
    sid=\$(curl -sf ${auth[*]@Q} $URL/sessions -d '{\"runner\": \"python\"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"session_id\"])')
    curl -sf ${auth[*]@Q} $URL/rollout/step -d '{\"runner\": \"python\", \"session_id\": \"'\$sid'\", \"action\": {\"code\": \"x = 41\"}}' >/dev/null
    curl -sf ${auth[*]@Q} $URL/rollout/step -d '{\"runner\": \"python\", \"session_id\": \"'\$sid'\", \"action\": {\"code\": \"print(x + 1)\"}}' | grep -q '\"stdout\": *\"42'"
  check "tools: a lookup" ok '{"runner": "tools", "action": {"tool": "get_product_details", "args": {"product_id": "P1001"}}}'
  check "textgame: a reset in a session" bash -c "
    sid=\$(curl -sf ${auth[*]@Q} $URL/sessions -d '{\"runner\": \"textgame\"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"session_id\"])')
    curl -sf ${auth[*]@Q} $URL/rollout/step -d '{\"runner\": \"textgame\", \"session_id\": \"'\$sid'\", \"action\": {\"op\": \"reset\", \"seed\": 1}}' | grep -q '\"ok\": *true'"
  check "browser: a page" ok '{"runner": "browser", "action": {"actions": [{"action": "goto", "path": "/"}, {"action": "text", "selector": "h1"}]}}'
  check "metrics" bash -c "curl -sf ${auth[*]@Q} $URL/metrics | grep -q sandboxd_step_latency_seconds"
  # A stop with steps in flight: both finish, answered 200, and the node exits 0 (tini forwards the stop to the
  # node alone; the node drains, then stops its workers).
  slow_browser='{"runner": "browser", "timeout_s": 60, "action": {"actions": [{"action": "goto", "path": "/"}, {"action": "wait_for", "ms": 3000}, {"action": "text", "selector": "h1"}]}}'
  (step "$slow_browser" > "$WORK/browser.out" 2>&1; echo $? > "$WORK/browser.rc") &
  (step '{"runner": "python", "timeout_s": 30, "action": {"code": "import time; time.sleep(3); print(1)"}}' > "$WORK/python.out" 2>&1; echo $? > "$WORK/python.rc") &
  sleep 1
  "${PODMAN[@]}" stop -t 60 sbx-test >/dev/null
  wait
  check "stop: the browser step in flight finished" bash -c "grep -q '\"ok\": *true' $WORK/browser.out"
  check "stop: the python step in flight finished" bash -c "grep -q '\"ok\": *true' $WORK/python.out"
  check "stop: the node exited 0" bash -c "[[ \$(${PODMAN[*]} inspect sbx-test --format '{{.State.ExitCode}}') == 0 ]]"
  "${PODMAN[@]}" rm -f sbx-test >/dev/null
  # Without privileges (a read-only cgroup tree, the runtime's default capabilities): up, unready, saying why.
  "${PODMAN[@]}" run -d --name sbx-unpriv "${LIMITS[@]}" -p "127.0.0.1:$PORT:8080" \
    -v "$WORK/keys:/etc/sandboxd/keys:ro" -e SANDBOXD_API_KEYS_FILE=/etc/sandboxd/keys "$TAG" >/dev/null
  sleep 30
  check "unprivileged: still running" bash -c "[[ \$(${PODMAN[*]} inspect sbx-unpriv --format '{{.State.Running}}') == true ]]"
  check "unprivileged: /readyz 503 naming what is missing" bash -c "
    code=\$(curl -s -o $WORK/readyz.json -w '%{http_code}' -m 5 $URL/readyz); [[ \$code == 503 ]] && grep -q 'missing privilege' $WORK/readyz.json"
  check "unprivileged: doctor names it" bash -c "! ${PODMAN[*]} exec sbx-unpriv sandboxd doctor > $WORK/doctor.out; grep -q FAIL $WORK/doctor.out && grep -qi 'writable\|capabilit' $WORK/doctor.out"
fi
echo "image-test: $DEBIAN $ARCH $passed passed, $failed failed (built in ${built} s, $((size / 1000000)) MB)"
((failed == 0))
