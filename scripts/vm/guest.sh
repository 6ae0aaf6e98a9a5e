#!/usr/bin/env bash
# Runs inside the guest (scripts/vm-test.sh copies it to the share; sandboxd-vm-test.service starts it): the
# node's set-up from a clone of the host's tree, the facts of this machine, smoke checks a test cannot make
# (python fork on this kernel, the cgroups a stopped node leaves), then pytest on the chosen tests. Every
# stage is timed into the share's log; the counts go to share/result for the host's last line.
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

stage facts
uname -r
echo "arch $(uname -m), $(nproc) CPUs, $(free -m | awk '/Mem/ {print $2}') MiB"
echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup); controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "this unit's cgroup: $(cat /proc/self/cgroup)"
python3 -V
[[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] || finish "0 passed, 1 failed, 0 skipped (not a cgroup v2 machine)"

stage "set-up: scripts/setup.sh --test (no HOME)"
rm -rf /srv/sandboxd && git clone -q "$SHARE/src.git" /srv/sandboxd && cd /srv/sandboxd || finish "0 passed, 1 failed, 0 skipped (no clone)"
git log --oneline -1
t=$SECONDS
bash scripts/setup.sh --test || finish "0 passed, 1 failed, 0 skipped (set-up failed after $((SECONDS - t))s)"
echo "set-up took $((SECONDS - t))s"

stage doctor
.venv/bin/sandboxd doctor

smoke_failed=0
stage "smoke: a node, python fork on kernel $(uname -r), clean shutdown"
SANDBOXD_RUNNERS='["python"]' SANDBOXD_PORT=8090 .venv/bin/sandboxd serve > "$SHARE/serve.log" 2>&1 &
node=$!
t=$SECONDS
until curl -sf -m 10 localhost:8090/readyz > /dev/null; do
  kill -0 $node 2> /dev/null || { echo "SMOKE FAILED: the node died"; tail -30 "$SHARE/serve.log"; break; }
  ((SECONDS - t < 900)) || { echo "SMOKE FAILED: not ready in 900s"; break; }
  sleep 2
done
echo "ready after $((SECONDS - t))s: $(curl -s -m 10 localhost:8090/readyz | head -c 300)"
curl -s -m 120 localhost:8090/rollout/step -H 'content-type: application/json' \
  -d '{"runner":"python","action":{"code":"import numpy; print(numpy.arange(4).sum())"}}'
echo
sid=$(curl -s -m 120 localhost:8090/sessions -H 'content-type: application/json' -d '{"runner":"python"}' |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["session_id"])')
fork=$(curl -s -m 300 -o /tmp/fork.json -w '%{http_code}' "localhost:8090/sessions/$sid/fork" \
  -H 'content-type: application/json' -d '{"n":2}')
echo "fork: HTTP $fork $(head -c 400 /tmp/fork.json)"
abi=$(python3 -c 'import ctypes; print(ctypes.CDLL(None, use_errno=True).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))')
echo "Landlock ABI: $abi"
if ((abi >= 6)); then
  [[ $fork == 201 ]] || { echo "SMOKE FAILED: fork refused on Landlock ABI $abi"; smoke_failed=1; }
else
  [[ $fork == 422 ]] && grep -q "Landlock ABI is $abi" /tmp/fork.json || { echo "SMOKE FAILED: fork on ABI $abi not refused with its reason"; smoke_failed=1; }
fi
kill -TERM $node
wait $node
left=$(find /sys/fs/cgroup -type d -name 'sandboxd*' | grep -v "$(cut -d: -f3 /proc/self/cgroup)$" || true)
echo "cgroups left after SIGTERM: ${left:-none}"
[[ -z $left ]] || { echo "SMOKE FAILED: cgroups left"; smoke_failed=1; }
tail -5 "$SHARE/serve.log"

stage "pytest ${TESTS[*]}"
t=$SECONDS
.venv/bin/python -m pytest -q -rfEs -p no:cacheprovider --junitxml="$SHARE/junit.xml" "${TESTS[@]}" 2>&1 | tail -150
echo "pytest took $((SECONDS - t))s"
counts=$(python3 - "$SHARE/junit.xml" "$smoke_failed" <<'EOF'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite[0]
total, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
skipped = int(suite.get("skipped", 0))
smoke = int(sys.argv[2])
print(f"{total - failed - skipped + (1 - smoke)} passed, {failed + smoke} failed, {skipped} skipped")
EOF
) || counts="0 passed, 1 failed, 0 skipped (no test report)"
finish "$counts"
