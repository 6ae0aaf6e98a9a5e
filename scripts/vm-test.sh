#!/usr/bin/env bash
# The node where users deploy it: a Debian guest with a pure cgroup v2 tree (as EKS, GKE and AKS nodes have),
# on kernel 6.12 (Debian trixie's) or 6.1 (bookworm's, Amazon Linux 2023's line), amd64 or arm64, under QEMU.
# It builds the guest's image once (cached under $SANDBOXD_VM_CACHE by a hash of its inputs), boots it, and
# inside, as a systemd unit with a delegated cgroup (Delegate=yes, as a container runtime places a pod), runs
# the node's set-up (scripts/setup.sh --test, from a clone of this tree's last commit), smoke checks, and the
# chosen tests (scripts/vm/guest.sh). The last line is the verdict:
#
#   vm-test: amd64 kernel 6.12.57+deb13-amd64 cgroup2: 41 passed, 0 failed, 0 skipped
#
#   bash scripts/vm-test.sh [--arch amd64|arm64] [--kernel 6.12|6.1] [--tests "pytest args" | smoke] [--plan]
#
# The guest userland is trixie (Python 3.13) for both kernels; 6.1 is bookworm's kernel in it. The Debian
# packages setup.sh would install are baked into the image (apt at the host's speed); the rest of the set-up
# runs in the guest every time, from nothing but the image (its disk is a snapshot: each run starts clean).
# The smoke checks (doctor, a step of every kind, python fork or its refusal, a clean stop) always run and
# count; `--tests smoke` runs them alone, after the set-up without the tests' extras (for a slow guest).
# Only software emulation works on machines without hardware virtualisation: an amd64 guest runs ~6-10x
# slower than the host, an arm64 one ~16-30x. --plan prints what would be done and stops.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ARCH=amd64 KERNEL=6.12 TESTS=default PLAN=
while (($#)); do
  case $1 in
    --arch) ARCH=$2; shift 2 ;;
    --kernel) KERNEL=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --plan) PLAN=1; shift ;;
    *) sed -n 11p "$0" >&2; exit 2 ;;
  esac
done
case $ARCH in amd64 | arm64) ;; *) echo "vm-test: --arch amd64 or arm64, not $ARCH" >&2; exit 2 ;; esac
case $KERNEL in 6.12 | 6.1) ;; *) echo "vm-test: --kernel 6.12 or 6.1, not $KERNEL" >&2; exit 2 ;; esac

# What the default run covers, the tests marked `vm` (pyproject.toml): the cgroup v2 paths (the leaf move,
# memory.events, pids.events.local, cpu.max, cpu.weight) through python one-shots and sessions, pressure and
# blame, python fork, one compiled language, SQL and a browser page, and draining to a clean stop. Kernel 6.1
# leaves out python fork, which needs 6.12 (its refusal there is a smoke check).
DEFAULT_TESTS=(-m vm tests/)
[[ $KERNEL == 6.1 ]] && DEFAULT_TESTS+=(--ignore=tests/test_python_fork.py)
if [[ $TESTS == default ]]; then tests=("${DEFAULT_TESTS[@]}"); else read -r -a tests <<< "$TESTS"; fi
((${#tests[@]})) || { echo "vm-test: --tests names no test (\"smoke\" for the smoke checks alone)" >&2; exit 2; }

CACHE=${SANDBOXD_VM_CACHE:-/var/tmp/sandboxd-vm}
case $ARCH in amd64) QEMU=qemu-system-x86_64 QPKG=qemu-system-x86 ;; arm64) QEMU=qemu-system-aarch64 QPKG=qemu-system-arm ;; esac
# The image's inputs: its recipe, the guest's unit, and the Debian packages setup.sh installs on trixie (what
# the image bakes); the tree itself is not one (it is cloned at every run), nor is this script.
KEY=$(cat "$ROOT/scripts/vm/image.sh" "$ROOT/scripts/vm/sandboxd-vm-test.service" \
  <(SANDBOXD_DEBIAN=trixie bash "$ROOT/scripts/setup.sh" --test --print-packages) \
  <(echo "$ARCH $KERNEL ${SANDBOXD_VM_MIRROR:-}") | sha256sum | cut -c1-16)
IMAGE=$CACHE/$ARCH-$KERNEL-$KEY
if [[ -n $PLAN ]]; then
  echo "image: $IMAGE ($([[ -f $IMAGE/root.img ]] && echo cached || echo "to build"): $(bash "$ROOT/scripts/vm/image.sh" "$ARCH" "$KERNEL" --describe))"
  echo "boot: $QEMU, cgroup v2 only (systemd.unified_cgroup_hierarchy=1)"
  echo "tree: $(git -C "$ROOT" log --oneline -1)"
  echo "tests: ${tests[*]}"
  exit 0
fi
[[ $EUID == 0 ]] || { echo "vm-test: needs root (apt, mmdebstrap, mounts)" >&2; exit 1; }
log() { printf '[vm-test %s] %s\n' "$(date +%T)" "$*"; }

# 1. The host's tools (Debian's packages).
host=("$QPKG" qemu-utils mmdebstrap e2fsprogs)
[[ $ARCH == arm64 && $(uname -m) != aarch64 ]] && host+=(qemu-user-static binfmt-support arch-test)
need=()
for pkg in "${host[@]}"; do dpkg -s "$pkg" > /dev/null 2>&1 || need+=("$pkg"); done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" > /dev/null
fi
if [[ $ARCH == arm64 && $(uname -m) != aarch64 ]]; then  # the image's arm64 packages configure under qemu-user
  [[ -e /proc/sys/fs/binfmt_misc/status ]] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || update-binfmts --enable qemu-aarch64
fi

# 2. The image, once per set of inputs.
if [[ ! -f $IMAGE/root.img ]]; then
  log "building the $ARCH image (kernel $KERNEL) in $IMAGE"
  rm -rf "${CACHE:?}/$ARCH-$KERNEL-"*  # an image of other inputs is stale
  t=$SECONDS
  bash "$ROOT/scripts/vm/image.sh" "$ARCH" "$KERNEL" "$IMAGE"
  log "image built in $((SECONDS - t))s ($(du -h "$IMAGE/root.img" | cut -f1) used)"
fi

# 3. The run: the tree's last commit, the tests, the host's trust store, in a share of the run's own.
SHARE=$(mktemp -d /var/tmp/sandboxd-vm-run.XXXXXX)
# What the guest downloads (pip's and npm's caches) outlives the run: the guest's TLS and unpacking run under
# emulation, and a second run of the same set-up need not fetch it again.
DOWNLOADS=$CACHE/downloads-$ARCH
mkdir -p "$DOWNLOADS"
# The run's logs outlive its share: the guest's (stages, smoke checks, pytest), the smoke node's, the console.
KEEP=$CACHE/last-$ARCH-$KERNEL
keep() { rm -rf "$KEEP"; mkdir -p "$KEEP"; cp "$SHARE"/{guest.log,serve.log,console.log,junit.xml,result} "$KEEP"/ 2> /dev/null; rm -rf "$SHARE"; }
trap keep EXIT
git clone -q --bare "$ROOT" "$SHARE/src.git"
cp "$ROOT/scripts/vm/guest.sh" "$SHARE/guest.sh"
cp "${SANDBOXD_VM_CA:-/etc/ssl/certs/ca-certificates.crt}" "$SHARE/ca.crt"
printf '%s ' "${tests[@]}" > "$SHARE/tests"
if [[ -e /sys/module/kvm_intel || -e /sys/module/kvm_amd ]] && [[ $ARCH == amd64 && $(uname -m) == x86_64 ]]; then
  accel=(-enable-kvm -cpu host)
# Software emulation: one host thread per guest CPU (thread=multi) unless SANDBOXD_VM_TCG=single. A guest
# kernel once died here of an int3 oops mid text-patching (a static key flipped by cpu.max) while two guests
# and a test run shared the host's two cores: multi-threaded TCG on a busy host; a guest alone did not.
elif [[ $ARCH == amd64 ]]; then
  accel=(-accel "tcg,thread=${SANDBOXD_VM_TCG:-multi}" -cpu max)
else
  accel=(-M virt -accel "tcg,thread=${SANDBOXD_VM_TCG:-multi}" -cpu neoverse-n1)  # Graviton2's core
fi
console=ttyS0
[[ $ARCH == arm64 ]] && console=ttyAMA0
log "booting $ARCH kernel $KERNEL (${accel[*]}); tests: ${tests[*]}"
t=$SECONDS
timeout "${SANDBOXD_VM_TIMEOUT:-10800}" "$QEMU" "${accel[@]}" -m "${SANDBOXD_VM_MEMORY:-6144}" -smp "${SANDBOXD_VM_CPUS:-2}" \
  -kernel "$IMAGE/vmlinuz" -initrd "$IMAGE/initrd.img" \
  -append "console=$console root=/dev/vda rw systemd.unified_cgroup_hierarchy=1 panic=1 quiet" \
  -drive "file=$IMAGE/root.img,format=raw,if=virtio,snapshot=on" \
  -nic user,model=virtio-net-pci \
  -virtfs "local,path=$SHARE,mount_tag=share,security_model=none,id=share" \
  -virtfs "local,path=$DOWNLOADS,mount_tag=downloads,security_model=none,id=downloads" \
  -display none -serial "file:$SHARE/console.log" -no-reboot < /dev/null || log "qemu ended with rc=$?"
log "the guest ran $((SECONDS - t))s"
[[ -f $SHARE/guest.log ]] && cat "$SHARE/guest.log" || tail -60 "$SHARE/console.log"
log "the run's logs are kept in $KEEP"
if grep -q "Kernel panic" "$SHARE/console.log" 2> /dev/null; then  # panic=1: the guest reboots, QEMU ends
  echo "the guest's kernel panicked:"
  grep -m1 -B2 -A12 "Oops\|BUG:" "$SHARE/console.log"
fi
result=$(cat "$SHARE/result" 2> /dev/null || echo "0 passed, 1 failed, 0 skipped (no result: see the console above)")
release=$(grep -m1 -E '^[0-9]+\.[0-9]+' "$SHARE/guest.log" 2> /dev/null || echo "$KERNEL")
echo "vm-test: $ARCH kernel $release cgroup2: $result"
[[ $result == *" 0 failed,"* ]]
