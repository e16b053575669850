#!/usr/bin/env bash
# Dense RoBERTa-1seq baseline (MLM only, full sentences from one document up to N), Table 7 hyper-parameters.
#   bash run_scripts/pretrain_roberta_1seq.sh N        (N = 512 or 1024)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
N="${1:?usage: pretrain_roberta_1seq.sh N}"
RUN_NAME="${RUN_NAME:-roberta_1seq_N${N}}"
paper_hparams "$N"
launch --deepspeed_config "${DS_CONFIG:-ds_configs/zero1_fp16.json}" --model-preset bert-base \
  --attention-kernel dense "${PAPER_ARGS[@]}" "${@:2}"
