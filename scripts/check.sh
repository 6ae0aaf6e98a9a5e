#!/usr/bin/env bash
# The checks CI runs as they are: lint, format, strict types (pydantic plugin), generated docs current.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SANDBOXD_VENV:-.venv}
"$VENV/bin/ruff" check sandboxd tests
"$VENV/bin/ruff" format --check sandboxd tests
"$VENV/bin/mypy"
"$VENV/bin/sandboxd" config-docs --check docs/configuration.md
echo "check: ruff, ruff format, mypy --strict and docs/configuration.md all clean"
