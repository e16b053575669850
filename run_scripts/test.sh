#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the whole pytest suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# the DeepSpeed CPU op that setup_env.sh builds lives here; the ranks the tests launch must look in the same place
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
bash run_scripts/setup_env.sh
exec .venv/bin/python -m pytest "$@"
