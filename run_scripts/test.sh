#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the whole pytest suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash run_scripts/setup_env.sh
exec .venv/bin/python -m pytest "$@"
