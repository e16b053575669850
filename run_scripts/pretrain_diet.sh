#!/usr/bin/env bash
# DIET positional attention (no input position embeddings; per-head position terms in the attention logits) in the
# RoBERTa-1seq setting with Table 7's hyper-parameters.
#   bash run_scripts/pretrain_diet.sh N abs [RANK]     DIET-ABS: logits += (p_i U_Q)(p_j U_K)^T / sqrt(d_p), d_p=RANK (128)
#   bash run_scripts/pretrain_diet.sh N rel [K]        DIET-REL: logits += r_h[clip(j - i, -K, K)] (K=128)
# SHARING=none|layer|head shares the position parameters (default none). Knobs: see run_scripts/common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
N="${1:?usage: pretrain_diet.sh N abs|rel [RANK|K]}"
KIND="${2:?usage: pretrain_diet.sh N abs|rel [RANK|K]}"
case "$KIND" in
  abs|rel) ;;
  *) echo "KIND must be abs or rel" >&2; exit 2 ;;
esac
OUT="${OUT:-runs/diet_${KIND}_N${N}}"
paper_hparams "$N"
launch --deepspeed_config "${DS_CONFIG:-ds_configs/zero1_fp16.json}" --model-preset "diet-$KIND-base" \
  --diet-size "${3:-128}" --diet-sharing "${SHARING:-none}" "${PAPER_ARGS[@]}" "${@:4}"
