#!/usr/bin/env bash
# Does every pinned package have a wheel for another machine? The node's tree (constraints.txt) and the jail's
# default environment, for an architecture and the Python versions a node may run (Debian bookworm's
# backports and trixie give 3.12 and 3.13). A package without one would be built from source on that
# machine, or fail to install: an arm64 fleet would learn it at its first image build.
#
#   bash scripts/check-wheels.sh [--arch aarch64|x86_64] [--python "3.12 3.13"]
#
# It also resolves an unpinned install (`pip install 'sandboxd[server]'` on that machine, without
# constraints.txt): it must resolve in wheels, and it lists where it lands away from the pins the tests ran.
#
# It downloads from the package index (about 1 GB per Python version): a script to run before a release or
# after a constraints change, not a test (the tests talk to loopback only). The last line says it all:
#   check-wheels: aarch64 python 3.12 3.13: 452 of 452 pinned packages have wheels; unpinned installs resolve
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ARCH=aarch64 PYTHONS="3.12 3.13"
while (($#)); do
  case $1 in
    --arch) ARCH=$2; shift 2 ;;
    --python) PYTHONS=$2; shift 2 ;;
    *) echo "usage: $0 [--arch aarch64|x86_64] [--python \"3.12 3.13\"]" >&2; exit 2 ;;
  esac
done
PIP=("$ROOT/.venv/bin/python" -m pip)
[[ -x $ROOT/.venv/bin/python ]] || PIP=(python3 -m pip)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
platforms=()
for tag in manylinux_2_28 manylinux_2_17 manylinux2014 linux; do platforms+=(--platform "${tag}_$ARCH"); done
platforms+=(--platform any)

# one requirement file each: the two trees pin some packages differently, as they may (two environments)
total=0 missing=()
for python in $PYTHONS; do
  for list in constraints.txt sandboxd/runners/python/environments/default.txt; do
    grep -E '^[A-Za-z0-9_.-]+==' "$ROOT/$list" > "$WORK/req.txt"
    n=$(wc -l < "$WORK/req.txt")
    total=$((total + n))
    get() {
      "${PIP[@]}" download -q --no-deps --only-binary=:all: "${platforms[@]}" --python-version "$python" \
        --implementation cp -d "$WORK/dl" "$@" > /dev/null 2>&1
    }
    get -r "$WORK/req.txt" && continue
    while read -r spec; do  # which ones: one at a time
      get "$spec" || missing+=("$spec (python $python, $list)")
    done < "$WORK/req.txt"
  done
done

# An unpinned install: what a user gets from the index today, in wheels only. The packages used beyond their
# API are bounded to the line the tests ran (tests/test_dependency_contracts.py); the others may move, listed.
unresolved=()
for python in $PYTHONS; do
  if "${PIP[@]}" install -q --dry-run --ignore-installed --only-binary=:all: "${platforms[@]}" \
    --python-version "$python" --implementation cp --target "$WORK/t" --report "$WORK/report.json" \
    "$ROOT[server]" > "$WORK/resolve.log" 2>&1; then
    python3 - "$WORK/report.json" "$ROOT/constraints.txt" "$python" <<'EOF'
import json
import re
import sys


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


pins = {}
for line in open(sys.argv[2]):
    name, sep, version = line.split("#")[0].strip().partition("==")
    if sep:
        pins[norm(name)] = version
got = {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
moved = sorted(f"{n} {pins[n]} -> {v}" for n, v in got.items() if n in pins and pins[n] != v)
loose = sorted(f"{n} {v}" for n, v in got.items() if n not in pins and n != "sandboxd")
print(f"unpinned install, python {sys.argv[3]}: {len(got)} packages, {len(moved)} away from the pins"
      + (": " + ", ".join(moved) if moved else "") + ("; not pinned: " + ", ".join(loose) if loose else ""))
EOF
  else
    unresolved+=("python $python: $(grep -m1 -E '^ERROR' "$WORK/resolve.log" || tail -1 "$WORK/resolve.log")")
  fi
done
for m in "${missing[@]}"; do echo "no $ARCH wheel: $m"; done
for m in "${unresolved[@]}"; do echo "unpinned install does not resolve: $m"; done
resolved="unpinned installs resolve"
((${#unresolved[@]} == 0)) || resolved="unpinned installs do NOT resolve"
echo "check-wheels: $ARCH python $PYTHONS: $((total - ${#missing[@]})) of $total pinned packages have wheels; $resolved"
((${#missing[@]} == 0 && ${#unresolved[@]} == 0))
