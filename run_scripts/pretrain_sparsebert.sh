#!/usr/bin/env bash
# SparseBERT (importance-analysis paper) masks in the RoBERTa-1seq setting with Table 7's hyper-parameters.
#   bash run_scripts/pretrain_sparsebert.sh N no-diag          no-diagonal attention (M_ii = 0)
#   bash run_scripts/pretrain_sparsebert.sh N fixed PATTERN    a fixed mask: strided|fixed|longformer|logsparse|bigbird|star
#   bash run_scripts/pretrain_sparsebert.sh N dam              DAM search (lambda*L1 added to the loss), then
#                                                              fixed-mask training on the exported learned mask
# Masks are built for seq_len N (Table 3 of the paper used n = 128). Knobs: see run_scripts/common.sh.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
N="${1:?usage: pretrain_sparsebert.sh N no-diag|fixed PATTERN|dam}"
KIND="${2:?usage: pretrain_sparsebert.sh N no-diag|fixed PATTERN|dam}"
BASE="${OUT:-runs/sparsebert_${KIND}${3:+_$3}_N${N}}"
DS="${DS_CONFIG:-ds_configs/zero1_fp16.json}"
paper_hparams "$N"
train() {  # train OUTDIR TRAINER_FLAGS...: the mask is built for --seq-length N (model.presets.sparsebert)
  local out="$1"; shift
  OUT="$out" launch --deepspeed_config "$DS" --model-preset bert-base "${PAPER_ARGS[@]}" "$@"
}
case "$KIND" in
  no-diag) train "$BASE" --token-mask no_diagonal "${@:3}" ;;
  fixed)   train "$BASE" --token-mask "${3:?give the pattern}" "${@:4}" ;;
  dam)
    # stage 1: search (DAM gates the full n x n attention; dense compute, as in the paper)
    train "$BASE/search" --token-mask dam --attention-kernel dense "${@:3}"
    # stage 2: train with the binarized learned mask as a fixed mask
    train "$BASE/fixed" --token-mask file --token-mask-path "$BASE/search/ckpt/learned_masks.pt" "${@:3}" ;;
  *) echo "KIND must be no-diag, fixed or dam" >&2; exit 2 ;;
esac
