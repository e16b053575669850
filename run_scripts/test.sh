#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the default tier of the suite (tests marked `extended` are
# run_scripts/extended_check.sh's). Without arguments (CI: .ci/run) it then runs the floor pass, a canary of the
# model, kernels, one-rank trainer and export again in .venv-floor (every requirement at its floor: torch 2.11.0,
# transformers 5.17.0; run_scripts/setup_floor_env.sh, cached). FLOOR=0 skips it, FLOOR=only runs just it (pytest arguments, e.g. -x, then go to that pass). With pytest
# arguments and no FLOOR, only those run, in .venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# the DeepSpeed CPU op that setup_env.sh builds lives here; the ranks the tests launch must look in the same place
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
if [ -z "${FLOOR:-}" ]; then
  FLOOR=1
  [ $# -eq 0 ] || FLOOR=0
fi
# Two pytest-xdist workers (TEST_WORKERS=N, 0 for one process): much of the suite is single-threaded (imports, the
# one-rank launches, Python-bound tests), so two processes finish sooner on 2 cores. A test file runs whole in one
# worker (--dist loadfile: its module fixtures are built once); each worker gets its share of the cores
# (tests/conftest.py). A worker count given after it (pytest arguments, e.g. -n 0) wins.
workers() {  # $1: the venv's python
  local n="${TEST_WORKERS:-2}"
  if [ "$n" != 0 ] && "$1" -c 'import xdist' 2>/dev/null; then echo "-n $n --dist loadfile"; fi
}
if [ "$FLOOR" != only ]; then
  bash run_scripts/setup_env.sh
  # shellcheck disable=SC2046
  .venv/bin/python -m pytest $(workers .venv/bin/python) "$@"
fi
[ "$FLOOR" != 0 ] || exit 0
# the floor pass, a canary of what the GPU image's torch 2.11 and the oldest transformers must run: every kernel trains
# (test_model), flex's block masks, DIET, ModernBERT, the one-rank trainer's units, the HF export's remote code and one
# conversion both ways, the default tier's one-process tests (not multi-rank, not extended). The kernel and CUDA-contract suites
# run at the GPU image's torch in devtools.gpu_check (kernel_tests, contract_tests); the rest of the suite does not
# depend on the torch/transformers version.
FLOOR_TESTS=(tests/test_model.py tests/test_flex_mask.py tests/test_diet.py tests/test_modernbert.py
  tests/test_train_unit.py tests/test_hf_export.py "tests/test_convert_checkpoint.py::test_issue5_models_from_the_trainer_convert_both_ways")
present=(); for t in "${FLOOR_TESTS[@]}"; do [ ! -f "${t%%::*}" ] || present+=("$t"); done
bash run_scripts/setup_floor_env.sh
echo "[test] floor pass in .venv-floor: $(.venv-floor/bin/python -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"
floor_args=(); [ "$FLOOR" != only ] || floor_args=("$@")
# Known at the floor, and why test_compile.py is not in this pass: under torch 2.11 Dynamo cannot compare DeepSpeed's
# ZeroStageEnum inside engine.compile()'s wrapper ("<enum 'ZeroStageEnum'> does not support the < operator"), so
# that DeepSpeed function runs eager (the losses still match; docs/troubleshooting.md).
floor="$(cd .venv-floor && pwd -P)"   # its real path, as setup_floor_env.sh built DeepSpeed's CPU op
# shellcheck disable=SC2046
TORCH_EXTENSIONS_DIR="$floor/torch_extensions" exec "$floor/bin/python" -m pytest $(workers "$floor/bin/python") \
  -m "not multirank and not extended" \
  "${present[@]}" "${floor_args[@]}"
