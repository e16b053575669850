#!/usr/bin/env bash
# ModernBERT's architecture (arXiv 2412.13663; preset modernbert-base: pre-LN without biases, GeGLU, rotary positions
# with theta 160k global / 10k local, an exact 128-token sliding window in two of every three layers, global
# attention where layer % 3 == 0) and its training recipe (yamls/modernbert/modernbert-base-pretrain.yaml) on our data
# pipeline and kernels, with Table 7's step counts and batch size (knobs SCALE, BATCH_SCALE, ... of
# run_scripts/common.sh) so that runs compare with the BlockBERT set-ups.
#   bash run_scripts/pretrain_modernbert.sh [N] [TRAIN_FLAGS...]      N = sequence length (default 1024)
# Layer knobs: GLOBAL=dense (preset modernbert-base) | blockbert (preset modernbert-blockbert-base: BlockBERT n=2,
# heads 10:2, on the global layers; the export then carries our code), PRESET (another preset of model/presets.py,
# e.g. modernbert-tiny for smoke runs), WINDOW (local window, default 128), GLOBAL_EVERY (default 3).
# Recipe knobs:
#   OPTIMIZER      stableadamw (default, ModernBERT's; torch-optimi, ZeRO stage 0: default DS_CONFIG
#                  ds_configs/zero0_bf16_autocast.json, bf16 autocast as ModernBERT's amp_bf16) | adamw (default
#                  DS_CONFIG ds_configs/zero1_bf16.json). lr 8e-4, betas 0.9/0.98, eps 1e-6, no dropout; weight decay
#                  1e-5 with --fully-decoupled-weight-decay (ModernBERT's decoupled_stableadamw, torch-optimi's
#                  decouple_lr: weights shrink by 1e-5 x lr_t / 8e-4 per step, 1e-5 at the peak LR).
#   MASK_PROB      default 0.3, ModernBERT's masking rate.
#   RAMP_FRACTION  batch-size warm-up (--rampup-batch-size, Megatron's semantics) over this fraction of the training
#                  samples (default 0.029: ModernBERT's 50B of 1.719T tokens); 0 turns it off. It starts at
#                  1/6 of the global batch (ModernBERT: 768 of 4608), rounded down to RAMP_UNIT, and grows by
#                  RAMP_UNIT = micro batch x all ranks (default MICRO_BATCH x NPROC, one node: set it for several;
#                  with MICRO_BATCH=auto, the GPU default, 32 x NPROC: auto then chooses a micro batch dividing the
#                  ramp's start and increment, at most 32 per rank).
#                  With the ramp the run's length is --train-samples (Table 7's steps x the full batch), so it takes
#                  more, smaller steps at the start, and the LR schedule counts samples as ModernBERT (tokens) and
#                  Megatron do: --lr-warmup-samples (Table 7's warmup steps x the full batch) and
#                  --lr-wsd-decay-samples, so the warmup covers the same data as without the ramp. Without the ramp
#                  (RAMP_FRACTION=0) the run is --train-iters and the schedule counts steps (--lr-*-iters).
#   WSD_DECAY_FRACTION default 0.1: warmup, then the peak LR held, then a 1-sqrt anneal over this fraction of the
#                  run (the fraction is our choice; the paper gives the anneal's shape only).
#   SAMPLE_MODE    default packed-docs: whole documents packed by best fit, attention kept inside each document, as
#                  ModernBERT packs; doc-sentences gives the BlockBERT/DIET samples.
# Other trainer flags can be appended. Convert a checkpoint with `python -m tools.convert_checkpoint --load
# $OUT/ckpt --to-hf DIR`: with GLOBAL=dense it becomes a stock transformers ModernBertForMaskedLM directory.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
N="${1:-1024}"
WINDOW="${WINDOW:-128}"
GLOBAL_EVERY="${GLOBAL_EVERY:-3}"
GLOBAL="${GLOBAL:-dense}"
case "$GLOBAL" in  # the recipes of model/presets.py; PRESET picks another one
  dense) MODEL_PRESET="${PRESET:-modernbert-base}" ;;
  blockbert) MODEL_PRESET="${PRESET:-modernbert-blockbert-base}" ;;
  *) echo "GLOBAL must be dense or blockbert" >&2; exit 2 ;;
esac
RUN_NAME="${RUN_NAME:-modernbert_${GLOBAL}_w${WINDOW}_every${GLOBAL_EVERY}_N${N}}"
OUT="${OUT:-runs/$RUN_NAME}"
paper_hparams "$N"
OPTIMIZER="${OPTIMIZER:-stableadamw}"
case "$OPTIMIZER" in
  stableadamw) DEFAULT_DS_CONFIG=ds_configs/zero0_bf16_autocast.json ;;
  adamw) DEFAULT_DS_CONFIG=ds_configs/zero1_bf16.json ;;
  *) echo "OPTIMIZER must be stableadamw or adamw" >&2; exit 2 ;;
esac
RAMP_MICRO="$MICRO_BATCH"
if [ "$MICRO_BATCH" = auto ]; then RAMP_MICRO=32; fi
# the run's length and the ramp: Table 7's steps at the full batch, or as many samples with a growing batch (the
# LR schedule then counts samples: warmup and anneal given in samples, as Megatron requires with a ramp)
read -r -a LENGTH < <("$PY" - "$TRAIN_ITERS" "$GLOBAL_BATCH" "${RAMP_FRACTION:-0.029}" \
  "${RAMP_UNIT:-$(( ${RAMP_MICRO} * ${NPROC:-1} ))}" "${WSD_DECAY_FRACTION:-0.1}" "$WARMUP_ITERS" <<'PYEOF'
import sys
iters, batch, fraction, unit = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
wsd, warmup = float(sys.argv[5]), int(sys.argv[6])
start = max(unit, batch // 6 // unit * unit)
if fraction > 0 and start < batch:
    out = ["--train-samples", str(iters * batch), "--rampup-batch-size", str(start), str(unit),
           str(max(1, round(fraction * iters * batch))), "--lr-warmup-samples", str(warmup * batch),
           "--lr-wsd-decay-samples", str(max(1, int(wsd * iters * batch)))]
else:
    out = ["--train-iters", str(iters), "--lr-warmup-iters", str(warmup),
           "--lr-wsd-decay-iters", str(max(1, int(wsd * iters)))]
print(" ".join(out))
PYEOF
)
ARGS=()
skip=0
for a in "${PAPER_ARGS[@]}"; do  # Table 7's --train-iters and --lr-warmup-iters give way to LENGTH's
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  if [ "$a" = --train-iters ] || [ "$a" = --lr-warmup-iters ]; then skip=1; continue; fi
  ARGS+=("$a")
done
launch --deepspeed_config "${DS_CONFIG:-$DEFAULT_DS_CONFIG}" --model-preset "$MODEL_PRESET" \
  --sliding-window "$WINDOW" --global-every "$GLOBAL_EVERY" "${ARGS[@]}" "${LENGTH[@]}" --optimizer "$OPTIMIZER" \
  --lr 8e-4 --adam-beta1 0.9 --adam-beta2 0.98 --adam-eps 1e-6 --weight-decay 1e-5 --fully-decoupled-weight-decay --hidden-dropout 0.0 --attention-dropout 0.0 \
  --mask-prob "${MASK_PROB:-0.3}" --sample-mode "${SAMPLE_MODE:-packed-docs}" \
  --lr-decay-style WSD --lr-wsd-decay-style minus_sqrt "${@:2}"
