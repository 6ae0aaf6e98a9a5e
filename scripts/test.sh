#!/usr/bin/env bash
# The test command: set up, the checks (ruff, ruff format, strict mypy, generated docs), then the
# whole suite against real nsjail, DuckDB and HTTP on loopback.
#
#   bash scripts/test.sh                 the whole suite (what .ci/run runs): in parallel, then the `alone` tests
#   bash scripts/test.sh [pytest args]   those tests, as asked, in one process
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
  rc=$?
elif (($#)); then
  .venv/bin/python -m pytest "$@"  # what was asked, as it was asked
  rc=$?
else
  # The whole suite in two parts (docs/development.md says where the time goes): every test that neither loads
  # the machine itself nor measures what another test's load would change, in parallel processes (a test
  # module each at a time: its node is started once); then the `alone` ones, with nothing beside them.
  workers=${SANDBOXD_TEST_PROCESSES:-2}
  .venv/bin/python -m pytest -n "$workers" --dist loadfile -m "not alone" -p no:cacheprovider
  rc=$?
  .venv/bin/python -m pytest -m alone -p no:cacheprovider
  rc2=$?
  ((rc == 0)) && rc=$rc2  # the first part's failure is the one to say
fi
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
