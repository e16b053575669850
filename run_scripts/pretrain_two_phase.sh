#!/usr/bin/env bash
# Two-phase schedule: phase 1 at N=128 (90% of the steps), then phase 2 at N=512 from phase 1's weights
# (--finetune: position table extended 128 -> 512 by repeating the trained rows, fresh optimizer, LR re-warmup).
# Re-running resumes whichever phase was interrupted.
#   bash run_scripts/pretrain_two_phase.sh [EXTRA TRAIN ARGS...]
#   MODEL_ARGS="--blockbert-blocks 2 --head-assignment 10:2" for BlockBERT (default: dense RoBERTa-1seq)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BASE="${OUT:-runs/two_phase}"
read -r -a MODEL <<< "${MODEL_ARGS:---attention-kernel dense}"
DS="${DS_CONFIG:-ds_configs/zero1_fp16.json}"

paper_hparams 128
P1_ITERS="$(scaled "$TRAIN_ITERS" 0.9)"
OUT="$BASE/phase1" launch --deepspeed_config "$DS" --model-preset bert-base "${MODEL[@]}" "${PAPER_ARGS[@]}" \
  --train-iters "$P1_ITERS" "$@"

paper_hparams 512
P2_ITERS="$(scaled "$TRAIN_ITERS" 0.1)"
P2_WARMUP="$(scaled "$WARMUP_ITERS" 0.1)"
if [ -f "$BASE/phase2/ckpt/latest" ]; then   # phase 2 already started: plain resume
  OUT="$BASE/phase2" launch --deepspeed_config "$DS" --model-preset bert-base "${MODEL[@]}" "${PAPER_ARGS[@]}" \
    --train-iters "$P2_ITERS" --lr-warmup-iters "$P2_WARMUP" "$@"
else
  OUT="$BASE/phase2" LOAD="$BASE/phase1/ckpt" launch --deepspeed_config "$DS" --model-preset bert-base \
    "${MODEL[@]}" "${PAPER_ARGS[@]}" --train-iters "$P2_ITERS" --lr-warmup-iters "$P2_WARMUP" --finetune "$@"
fi
