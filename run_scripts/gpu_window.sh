#!/usr/bin/env bash
# The one prepared script of a GPU window (docs/gpu_check.md, "A speed window"): the questions of issues #47 (dense
# training: micro-batch, compile, attention dropout, padded vs packed rows, kernel shares) and #48 (sparse attention:
# the kernel table under training's dropout for auto's table, the step table with its ideal column, N=16384/32768,
# memory vs dense), after gpu_check.sh --quick's set-up and CUDA kernel tests. Parts run in priority order; each has
# a cap and a least useful time, and is skipped with a note when the budget has less left (the window: 15 min of
# device time, one command <= 600 s; BUDGET default 480 s from a bare node). Everything lands in OUT/all.tgz (+
# OUT/report.md, the quick check's report).
#
#   bash run_scripts/gpu_window.sh [OUT]        (air-gapped: WHEELHOUSE=wheelhouse TORCH=system GPU_CHECK_COMMIT=<sha>)
#
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-${1:-out/gpu_window}}"; mkdir -p "$OUT"
T0=$(date +%s)
B=${BUDGET:-480}
left() { echo $(( B - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1  # WHEELHOUSE and TORCH: as the caller set them (run_scripts/setup_env.sh)
export GPU_CHECK_COMMIT="${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/gpu_window_ext}"
W="$OUT/w"; mkdir -p "$W"
WORK="${WORK_DIR:-/tmp/gpu_window_work}"
finish() { cp "$W/gc/report.md" "$OUT/report.md" 2>/dev/null; rm -f "$W"/*/attention.png; tar czf "$OUT/all.tgz" -C "$OUT" w && rm -rf "$W"; ls -la "$OUT"; }

# part NAME CAP MIN CMD...: run CMD for at most CAP s (never past the budget, less a 10 s margin to pack up), only when
# at least MIN s are left; its console goes to $W/NAME.log (the end of it to this console). The profile measure stops
# starting variants at the part's end by itself ($GPU_CHECK_STEP_DEADLINE, as under gpu_check)
part() { local name=$1 cap=$2 min=$3; shift 3; local t=$(( $(left) - 10 )); [ $t -gt $cap ] && t=$cap
  if [ $t -lt $min ]; then echo "[win] $name skipped: $t s left of the budget, it needs $min"; return; fi
  echo "[win] $name (cap $t s) at $(( $(date +%s) - T0 )) s"
  GPU_CHECK_STEP_DEADLINE=$(( $(date +%s) + t )) timeout -k 5 $t "$@" > "$W/$name.log" 2>&1; local rc=$?
  grep -v -e Warning -e '^\[rank' "$W/$name.log" | tail -${TAIL:-25}; echo "[win] $name exit $rc at $(( $(date +%s) - T0 )) s"; }
if [ -n "${DRY_RUN:-}" ]; then  # DRY_RUN=1: print each part's command line, run nothing (tests/test_gpu_check.py)
  part() { shift 3; printf '%q ' "$@"; echo; }; finish() { rm -rf "$W"; }
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
trap finish EXIT

# 0. set-up (run_scripts/setup_env.sh), the CUDA kernel tests (pytest -m gpu) and the sample shards for the data rows
GC=${GC_S:-150}
part gc $GC 60 bash run_scripts/gpu_check.sh --quick --budget-s $(( GC - 10 )) "$W/gc" --work-dir "$WORK" \
  --only ${GC_STEPS:-kernel_tests data}
PY=.venv/bin/python
DATA=(--data-path "$WORK/data/sample_text_sentence" --vocab-file "$WORK/data/vocab.txt") PACKED="packed packed_dropout0"
[ -f "$WORK/data/vocab.txt" ] || [ -n "${DRY_RUN:-}" ] || { DATA=(); PACKED=; }  # no shards: synthetic rows, no packed
STEP="$PY -m benchmarks.step"

# 1. #47: the dense step, profiled (MFU, busy, top kernels): N=512 b=32/128/64 on the trainer's padded rows, attention
#    dropout 0 vs 0.1, eager vs compiled, packed rows (varlen, no mask) vs padded (variants in that priority: the
#    profile leaves out, and names, those past the part's end); then unpadded (synthetic) rows at b=128: eager,
#    compiled (no all-ones mask kept: bf3efde's compiled b=128 took 117.2 ms with one), dropout 0, both, and the fused
#    residual + dropout + LayerNorm (--residual-norm triton). The MLM head's padded vocabulary needs no flag: the
#    align2 GEMM should be gone from every row's top kernels. --micro-batch-size auto is checked offline: its memory
#    model (pretrain/micro_batch.py) against these rows' measured peaks at b=32/64/128.
part dense_padded 80 40 $STEP --measure profile --model-preset bert-base --seq-len 512 --batch 32 --precision bf16 \
  --variants eager batch_x4 dropout0 compiled $PACKED batch_x2 --sample-mode full-sentences ${DATA[@]+"${DATA[@]}"} \
  --warmup 3 --steps 2 --compile-estimate-s 40 --json "$W/dense_padded.json"
part dense_unpadded 70 30 $STEP --measure profile --model-preset bert-base --seq-len 512 --batch 128 --precision bf16 \
  --variants eager compiled dropout0 compiled_dropout0 fused_norm --warmup 2 --steps 2 --compile-estimate-s 35 \
  --json "$W/dense_unpadded.json"

# 2. #48: the batch-8 kernel table at N=4096/8192 under training's attention dropout 0.1 (both sides; flex, which has
#    none, left out): auto's table (python -m devtools.auto_table on the committed attention.json) and the kernel goals
part kernels_p01 90 40 $PY -m benchmarks.attention --measure time --device cuda --dtype bf16 --batch 8 \
  --cases blockbert_n2,blockbert_n3,local_bi_b64,fixed_b64@4096,8192 --kernels triton_block block_gather dense \
  --max-dense-masked-n 8192 --dropout 0.1 --repeats 3 --out-dir "$W/kernels_p01" --no-plot

# 3. #48: the training step with its ideal O + A x density (the dense row's own profile) and peak memory vs dense, at
#    N=4096 (b=4) with auto's choices; then the long rows N=16384 (b=2) and 32768 (b=1), where attention dominates
part steps_4096 60 30 $STEP --measure time --model-preset bert-base --kernel auto \
  --cases dense,blockbert-n2,blockbert-n3,window-b64@4096 --warmup 3 --steps 6 --precisions bf16 \
  --json "$W/steps_4096.json"
part steps_long 100 40 $STEP --measure time --model-preset bert-base --kernel auto --tokens 32768 --cases long \
  --warmup 2 --steps 3 --precisions bf16 --json "$W/steps_long.json"
part kernels_long 50 25 $PY -m benchmarks.attention --measure time --device cuda --dtype bf16 --batch 2 \
  --cases blockbert_n2,blockbert_n3,local_bi_b64@16384,32768 --kernels triton_block block_gather --dropout 0.1 \
  --repeats 2 --out-dir "$W/kernels_long" --no-plot

# 4. what the step's peak holds, dense against the sparse variants (by category and op)
part memory 45 25 $STEP --measure memory --model-preset bert-base --kernel auto \
  --cases dense,blockbert-n2,blockbert-n3@4096 --json "$W/memory.json"

# 5. when time is left: the kernel table without dropout (flex in), auto's dropout-0 entries after the kernel changes
part kernels_p0 80 40 $PY -m benchmarks.attention --measure time --device cuda --dtype bf16 --batch 8 \
  --cases blockbert_n2,blockbert_n3,local_bi_b64,fixed_b64@4096,8192 --kernels triton_block block_gather flex \
  --repeats 3 --out-dir "$W/kernels_p0" --no-plot
echo "[win] done at $(( $(date +%s) - T0 )) s of $B"
