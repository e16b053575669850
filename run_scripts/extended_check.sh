#!/usr/bin/env bash
# The extended check: the second tier (tests/conftest.py), the tests marked `extended`: each takes longer than the
# default tier's 30 s alone on the 2-core dev box (the offline wheelhouse set-up, ~10 min; the rest of the resume,
# fault, signal, Slurm and compile matrices whose one canary stays in the default tier), each with why and its time
# beside its marker, or not yet seen passing three times in a row under load (the SIGTERM-to-launcher cases of
# deepspeed and torchrun). Run it before a stop, as run_scripts/repeat_check.sh.
#   bash run_scripts/extended_check.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
bash run_scripts/setup_env.sh
SPARSE_BERT_EXTENDED=1 exec .venv/bin/python -m pytest -m extended "$@"
