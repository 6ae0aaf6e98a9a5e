#!/usr/bin/env bash
# The main job: set up, start sandboxd on loopback (embedded default: no Redis,
# no Kubernetes), run real programs and a short load against it, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/sandboxd demo "$@"
