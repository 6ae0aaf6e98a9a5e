#!/usr/bin/env bash
# Does every pinned package have a wheel for another machine? The node's tree (constraints.txt) and the jail's
# default environment, for an architecture and the Python versions a node may run (Debian bookworm's
# backports and trixie give 3.12 and 3.13). A package without one would be built from source on that
# machine, or fail to install: an arm64 fleet would learn it at its first image build.
#
#   bash scripts/check-wheels.sh [--arch aarch64|x86_64] [--python "3.12 3.13"]
#
# It downloads from the package index (about 1 GB per Python version): a script to run before a release or
# after a constraints change, not a test (the tests talk to loopback only). The last line says it all:
#   check-wheels: aarch64 python 3.12 3.13: 226 of 226 pinned packages have wheels
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
for m in "${missing[@]}"; do echo "no $ARCH wheel: $m"; done
echo "check-wheels: $ARCH python $PYTHONS: $((total - ${#missing[@]})) of $total pinned packages have wheels"
((${#missing[@]} == 0))
