#!/usr/bin/env bash
# The speed questions of one short GPU window (docs/gpu_check.md, "A speed window"): gpu_check.sh --quick's kernel
# tests (pytest -m gpu, triton_block's CUDA tests included), training step and profile (the shipped configs side by
# side); the batch-8 kernel table (triton_block, block_gather, flex, dense with the layout as a mask) at N=4096/8192;
# triton_block's tiles; training-step rows with triton_block at N=1024/4096/8192 and ModernBERT-BlockBERT at 8192;
# the step's peak memory by category.
# Self-bounded to BUDGET seconds (default 580) from a bare node; everything lands in OUT/all.tgz (+ OUT/report.md).
#
#   bash run_scripts/gpu_window.sh [OUT]        (air-gapped: WHEELHOUSE=wheelhouse TORCH=system GPU_CHECK_COMMIT=<sha>)
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-${1:-out/gpu_window}}"; mkdir -p "$OUT"
T0=$(date +%s)
B=${BUDGET:-580}
left() { echo $(( B - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1  # WHEELHOUSE and TORCH: as the caller set them (run_scripts/setup_env.sh)
export GPU_CHECK_COMMIT="${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/gpu_window_ext}"
W="$OUT/w"; mkdir -p "$W"
finish() { cp "$W/gc/report.md" "$OUT/report.md" 2>/dev/null; rm -f "$W/k8/attention.png"; tar czf "$OUT/all.tgz" -C "$OUT" w && rm -rf "$W"; ls -la "$OUT"; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
GC=${GC_S:-250}
timeout -k 15 $GC bash run_scripts/gpu_check.sh --quick --budget-s $(( GC - 15 )) "$W/gc" \
  --work-dir "${WORK_DIR:-/tmp/gpu_window_work}" --only ${GC_STEPS:-kernel_tests train_step profile} > "$W/gc.console.log" 2>&1
echo "[win] gpu_check exit $? at $(( $(date +%s) - T0 )) s"; tail -25 "$W/gc.console.log"
PY=.venv/bin/python
# each part: at most its own cap, and never into the reserve of the parts after it
run_part() { local name=$1 cap=$2 reserve=$3; shift 3; local t=$(( $(left) - reserve )); [ $t -gt $cap ] && t=$cap
  if [ $t -gt 15 ]; then timeout -k 5 $t "$@"; echo "[win] $name exit $? at $(( $(date +%s) - T0 )) s"
  else echo "[win] $name left out: $t s left"; fi; }
run_part "kernel table" 110 120 bash -c "$PY -m benchmarks.attention --measure time --device cuda --dtype bf16 --batch 8 --seq-lens 4096 \
  8192 --layouts blockbert_n2 blockbert_n3 local_bi_b64 fixed_b64 --kernels triton_block block_gather flex dense \
  --max-dense-masked-n 8192 --repeats 3 --target-factor 1.15 --out-dir '$W/k8' --no-plot 2>&1 | tail -40"
run_part "triton_block tiles" 60 110 bash -c "$PY -m benchmarks.attention --measure tiles --json '$W/tiles.json' 2>&1 | tail -40"
run_part "train steps" 70 45 bash -c "$PY -m benchmarks.step --measure time --model-preset bert-base --kernel ${TS_KERNEL:-triton_block} \
  --cases blockbert-n2@4096 dense@4096 blockbert-n3@4096 blockbert-n2@8192 dense@8192 blockbert-n3@8192 \
  blockbert-n2@1024 dense@1024 blockbert-n3@1024 modernbert-blockbert@8192 --warmup 3 --steps 6 --precisions bf16 \
  --json '$W/ts.json' 2>&1 | grep -v Warning | tail -20"
run_part "step memory" 60 0 bash -c "$PY -m benchmarks.step --measure memory --model-preset bert-base --cases dense@4096 \
  blockbert-n2@4096 --kernel ${MEM_KERNEL:-block_gather} --json '$W/mem.json' 2>&1 | tail -32"
