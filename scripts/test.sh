#!/usr/bin/env bash
# The test command: set up, the checks (ruff, ruff format, strict mypy, generated docs), then the
# whole suite against real nsjail, DuckDB and HTTP on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
bash scripts/check.sh
set +e
# Every test runs on a machine of the kind CI uses: a skip there fails the run (tests/conftest.py).
export SANDBOXD_TEST_FORBID_SKIPS=${SANDBOXD_TEST_FORBID_SKIPS:-1}
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
