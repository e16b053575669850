#!/usr/bin/env bash
# Prove the GPU path on a machine with CUDA GPUs in <= 25 minutes: kernels, multi-rank training, benchmarks against
# the targets, a pretraining smoke run with a deterministic resume. Writes OUT_DIR/report.md and report.json
# (default out/gpu_check); exits 1 when a step failed. Without a GPU it says so and exits 0. See docs/gpu_check.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
bash run_scripts/setup_env.sh
exec .venv/bin/python -m tools.gpu_check --out-dir "${1:-${GPU_CHECK_OUT:-out/gpu_check}}" "${@:2}"
