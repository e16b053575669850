#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the whole pytest suite. Without arguments (CI: .ci/run)
# it then runs the floor pass: the model, kernel, one-rank trainer, conversion/export and CUDA-contract tests again
# in .venv-floor (every requirement at its floor: torch 2.11.0, transformers 5.17.0; run_scripts/setup_floor_env.sh,
# cached). FLOOR=0 skips it, FLOOR=only runs just it (pytest arguments, e.g. -x, then go to that pass). With pytest
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
if [ "$FLOOR" != only ]; then
  bash run_scripts/setup_env.sh
  .venv/bin/python -m pytest "$@"
fi
[ "$FLOOR" != 0 ] || exit 0
FLOOR_TESTS=(tests/test_model.py tests/test_attention.py tests/test_block_sparse_ops.py tests/test_flex_mask.py
  tests/test_doc_mask.py tests/test_cuda_kernels.py tests/test_layouts.py tests/test_sparsebert.py tests/test_diet.py
  tests/test_modernbert.py tests/test_rotary.py tests/test_head_size.py tests/test_compile.py tests/test_train_unit.py
  tests/test_train_packed.py tests/test_convert_checkpoint.py tests/test_hf_export.py tests/test_hf_adapter.py
  tests/test_cuda_contracts.py)
present=(); for t in "${FLOOR_TESTS[@]}"; do [ ! -f "$t" ] || present+=("$t"); done
bash run_scripts/setup_floor_env.sh
echo "[test] floor pass in .venv-floor: $(.venv-floor/bin/python -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"
floor_args=(); [ "$FLOOR" != only ] || floor_args=("$@")
# Known at the floor: under torch 2.11 Dynamo cannot compare DeepSpeed's ZeroStageEnum inside engine.compile()'s
# wrapper ("<enum 'ZeroStageEnum'> does not support the < operator"), so that DeepSpeed function runs eager: a graph
# break this test refuses, though the losses still match. Our model itself compiles without a break at 2.11
# (test_compile.py's other tests run here).
floor_args+=(--deselect tests/test_compile.py::test_trainer_with_compile_logs_the_eager_losses)
TORCH_EXTENSIONS_DIR="$ROOT/.venv-floor/torch_extensions" exec .venv-floor/bin/python -m pytest -m "not multirank" \
  "${present[@]}" "${floor_args[@]}"
