#!/usr/bin/env bash
# The test command: set up, the checks (ruff, ruff format, strict mypy, generated docs), then the
# whole suite against real nsjail, DuckDB and HTTP on loopback.
#
#   bash scripts/test.sh [pytest args]   the whole suite (what .ci/run runs)
#   bash scripts/test.sh --quick         the checks and the in-process tests (no node, no bench): a change's
#                                        first feedback in under a minute; set-up only if there is no venv yet
set -euo pipefail
cd "$(dirname "$0")/.."
quick=
if [[ ${1:-} == --quick ]]; then
  quick=1
  shift
fi
if [[ -z $quick || ! -x .venv/bin/python ]]; then
  bash scripts/setup.sh --test
fi
bash scripts/check.sh
set +e
# Every test runs on a machine of the kind CI uses: a skip there fails the run (tests/conftest.py).
export SANDBOXD_TEST_FORBID_SKIPS=${SANDBOXD_TEST_FORBID_SKIPS:-1}
if [[ -n $quick ]]; then
  .venv/bin/python -m pytest -m "not node and not bench" -q "$@"
else
  .venv/bin/python -m pytest "$@"
fi
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
