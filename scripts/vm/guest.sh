#!/usr/bin/env bash
# Runs inside the guest (scripts/vm-test.sh copies it to the share; sandboxd-vm-test.service starts it): the
# node's set-up from a clone of the host's tree, the facts of this machine, smoke checks a test cannot make
# (python fork on this kernel, the cgroups a stopped node leaves, one step of every kind), then pytest on the
# chosen tests ("smoke": none, and the set-up without the tests' extras). Every stage is timed into the
# share's log; the counts (smoke checks and tests) go to share/result for the host's last line.
set -uo pipefail
SHARE=/mnt/share
LOG=$SHARE/guest.log
exec > >(tee -a "$LOG") 2>&1
stage() { echo; echo "=== [$(date +%T), up $(cut -d' ' -f1 /proc/uptime)s] $*"; }
finish() { echo "$1" > "$SHARE/result"; stage "done: $1"; exit 0; }
read -r -a TESTS < "$SHARE/tests"
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
# The host's trust store: HTTPS to the package registries may pass a TLS-intercepting proxy.
export PIP_CERT=$SHARE/ca.crt SSL_CERT_FILE=$SHARE/ca.crt REQUESTS_CA_BUNDLE=$SHARE/ca.crt NODE_EXTRA_CA_CERTS=$SHARE/ca.crt
unset HOME  # a unit has none (setup.sh must not need it)
# The host's download cache (vm-test.sh keeps it between runs), when it is shared.
if mkdir -p /mnt/downloads && mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 downloads /mnt/downloads; then
  export PIP_CACHE_DIR=/mnt/downloads/pip npm_config_cache=/mnt/downloads/npm
fi

stage facts
uname -r
echo "arch $(uname -m), $(nproc) CPUs, $(free -m | awk '/Mem/ {print $2}') MiB"
echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup); controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "this unit's cgroup: $(cat /proc/self/cgroup)"
python3 -V
[[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] || finish "0 passed, 1 failed, 0 skipped (not a cgroup v2 machine)"

# "smoke" in place of tests: the node's set-up without the tests' extras, and the smoke checks alone.
setup_args=(--test)
[[ ${TESTS[*]} == smoke ]] && TESTS=() setup_args=()
stage "set-up: scripts/setup.sh ${setup_args[*]} (no HOME)"
rm -rf /srv/sandboxd && git clone -q "$SHARE/src.git" /srv/sandboxd && cd /srv/sandboxd || finish "0 passed, 1 failed, 0 skipped (no clone)"
git log --oneline -1
t=$SECONDS
bash scripts/setup.sh "${setup_args[@]}" || finish "0 passed, 1 failed, 0 skipped (set-up failed after $((SECONDS - t))s)"
echo "set-up took $((SECONDS - t))s"

# Smoke checks, each counted: what a test cannot check from inside (the kernel's Landlock ABI decides fork,
# the cgroups a stopped node leaves) and one real step of every kind.
smoke_passed=0 smoke_failed=0
check() {  # check STATUS NAME
  if (($1 == 0)); then
    smoke_passed=$((smoke_passed + 1)); echo "SMOKE ok: $2"
  else
    smoke_failed=$((smoke_failed + 1)); echo "SMOKE FAILED: $2"
  fi
}
stage doctor
.venv/bin/sandboxd doctor
check $? "doctor"

stage "smoke: a node of every default kind, one step each, python fork on kernel $(uname -r), clean shutdown"
# Under emulation a worker's warm start (its jails, numpy's templates) takes minutes, and a step ten times its
# host time: an arm64 guest runs 16-30x slower than the host, an amd64 one 6-10x.
slow=(--timeout-s 30)
[[ $(uname -m) == aarch64 ]] && slow=(--timeout-s 120)
# The same longer limits for every node the tests start (tests/conftest.py reads them): a compile of C++'s
# iostream and a browser's page load take seconds here, past the host's 20 s and 500 ms defaults.
slow_env=(SANDBOXD_WORKER_START_TIMEOUT_S=1800 SANDBOXD_PYTHON__JAIL_START_TIMEOUT_S=600
  SANDBOXD_CODE__JAIL_START_TIMEOUT_S=600 SANDBOXD_CODE__COMPILE_TIMEOUT_S=60 SANDBOXD_BROWSER__ACTION_TIMEOUT_MS=10000
  SANDBOXD_SQL__ENGINE_START_TIMEOUT_S=600 SANDBOXD_BROWSER__LAUNCH_TIMEOUT_S=900)
export SANDBOXD_TEST_NODE_SETTINGS="${slow_env[*]}" SANDBOXD_TEST_NODE_START_S=1800
env SANDBOXD_PORT=8090 "${slow_env[@]}" .venv/bin/sandboxd serve > "$SHARE/serve.log" 2>&1 &
node=$!
t=$SECONDS ready=1
until curl -sf -m 10 localhost:8090/readyz > /dev/null; do
  # The node's end is its last lines; why a worker died is further up (its ERROR and the traceback after it).
  kill -0 $node 2> /dev/null || {
    echo "the node died"; grep -m3 -A40 ' ERROR ' "$SHARE/serve.log"; tail -8 "$SHARE/serve.log"; ready=0; break
  }
  ((SECONDS - t < 2400)) || { echo "not ready in 2400s"; ready=0; break; }
  sleep 2
done
check $((1 - ready)) "the node ready after $((SECONDS - t))s: $(curl -s -m 10 localhost:8090/readyz | head -c 300)"
t=$SECONDS
.venv/bin/sandboxd smoke --target http://localhost:8090 --load-s 5 --concurrency 4 "${slow[@]}"
check $? "python one-shots (numpy), a session, and one step of each other kind, in $((SECONDS - t))s"
sid=$(curl -s -m 300 localhost:8090/sessions -H 'content-type: application/json' -d '{"runner":"python"}' |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["session_id"])')
t=$SECONDS
fork=$(curl -s -m 600 -o /tmp/fork.json -w '%{http_code}' "localhost:8090/sessions/$sid/fork" \
  -H 'content-type: application/json' -d '{"n":2}')
echo "fork: HTTP $fork in $((SECONDS - t))s: $(head -c 400 /tmp/fork.json)"
abi=$(python3 -c 'import ctypes; print(ctypes.CDLL(None, use_errno=True).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))')
if ((abi >= 6)); then
  [[ $fork == 201 ]]
  check $? "python fork on Landlock ABI $abi"
else
  [[ $fork == 422 ]] && grep -q "Landlock ABI is $abi" /tmp/fork.json
  check $? "python fork refused with its reason on Landlock ABI $abi"
fi
kill -TERM $node
wait $node
rc=$?
# The node's groups are its workers' (<node id>-<pid>-w<k>[-kind]); the node id is the host name. (Its leaf
# move put this unit's processes, this shell among them, into <unit>/node: that one stays, and is not its.)
left=$(find /sys/fs/cgroup -mindepth 1 -type d -name "$(hostname)-*-w*" -print -prune || true)
[[ $rc == 0 && -z $left ]]
check $? "SIGTERM: the node exited $rc, cgroups left: ${left:-none}"
tail -5 "$SHARE/serve.log"

if ((${#TESTS[@]} == 0)); then
  finish "$smoke_passed passed, $smoke_failed failed, 0 skipped"
fi
stage "pytest ${TESTS[*]}"
t=$SECONDS
.venv/bin/python -m pytest -q -rfEs -p no:cacheprovider --junitxml="$SHARE/junit.xml" "${TESTS[@]}" 2>&1 | tail -150
echo "pytest took $((SECONDS - t))s"
counts=$(python3 - "$SHARE/junit.xml" "$smoke_passed" "$smoke_failed" <<'EOF'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite[0]
total, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
skipped = int(suite.get("skipped", 0))
smoke_passed, smoke_failed = int(sys.argv[2]), int(sys.argv[3])
print(f"{total - failed - skipped + smoke_passed} passed, {failed + smoke_failed} failed, {skipped} skipped")
EOF
) || counts="$smoke_passed passed, $((smoke_failed + 1)) failed, 0 skipped (no test report)"
finish "$counts"
