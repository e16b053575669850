#!/usr/bin/env bash
# ModernBERT's architecture (arXiv 2412.13663; preset modernbert-base: pre-LN without biases, GeGLU, rotary positions
# with theta 160k global / 10k local, an exact 128-token sliding window in two of every three layers, global
# attention where layer % 3 == 0) on our data pipeline and kernels, with the AdamW settings of ModernBERT's
# yamls/modernbert/modernbert-base-pretrain.yaml (lr 8e-4, betas 0.9/0.98, eps 1e-6, weight decay 1e-5, no dropout)
# and Table 7's step counts and batch size (knobs SCALE, BATCH_SCALE, ... of run_scripts/common.sh).
#   bash run_scripts/pretrain_modernbert.sh [N] [TRAIN_FLAGS...]      N = sequence length (default 1024)
# Layer knobs: WINDOW (local window, default 128), GLOBAL_EVERY (default 3), GLOBAL=dense (ModernBERT) | blockbert
# (BlockBERT n=2, heads 10:2, on the global layers; the export then carries our code). Recipe knobs: MASK_PROB
# (default 0.3, ModernBERT's masking rate) and WSD_DECAY_FRACTION (default 0.1: warmup, then the peak LR held, then a
# 1-sqrt anneal over the last 10% of the steps; the fraction is our choice, the paper gives the anneal's shape only)
# and SAMPLE_MODE (default packed-docs: whole documents packed by best fit, attention kept inside each document, as
# ModernBERT packs; doc-sentences gives the BlockBERT/DIET samples).
# Batch ramp and StableAdamW are not implemented yet; other trainer flags can be appended.
# Convert a checkpoint with `python -m tools.convert_checkpoint --load $OUT/ckpt --to-hf DIR`: with GLOBAL=dense it
# becomes a stock transformers ModernBertForMaskedLM directory.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
N="${1:-1024}"
WINDOW="${WINDOW:-128}"
GLOBAL_EVERY="${GLOBAL_EVERY:-3}"
GLOBAL="${GLOBAL:-dense}"
case "$GLOBAL" in
  dense) GLOBAL_SPARSITY=null ;;
  blockbert) GLOBAL_SPARSITY='{"mode": "blockbert", "num_blocks": 2, "head_assignment": "10:2", "block": 16}' ;;
  *) echo "GLOBAL must be dense or blockbert" >&2; exit 2 ;;
esac
RUN_NAME="${RUN_NAME:-modernbert_${GLOBAL}_w${WINDOW}_every${GLOBAL_EVERY}_N${N}}"
OUT="${OUT:-runs/$RUN_NAME}"
mkdir -p "$OUT"
"$PY" - "$OUT/model.json" "$N" "$WINDOW" "$GLOBAL_EVERY" "$GLOBAL_SPARSITY" <<'PYEOF'
import json, sys
from model.config import ModelConfig
path, n, window, every, sparsity = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
d = ModelConfig.preset("modernbert-base").to_dict()
d["max_position_embeddings"] = n
d["attention"].update(
    sparsity=json.loads(sparsity),
    global_every=every,
    local={"sparsity": None, "token_mask": {"pattern": "sliding_window", "window": window}},
)
with open(path, "w") as f:
    json.dump(ModelConfig.from_dict(d).to_dict(), f, indent=1)
PYEOF
paper_hparams "$N"
launch --deepspeed_config "${DS_CONFIG:-ds_configs/zero1_bf16.json}" --model-config "$OUT/model.json" \
  "${PAPER_ARGS[@]}" --lr 8e-4 --adam-beta1 0.9 --adam-beta2 0.98 --adam-eps 1e-6 --weight-decay 1e-5 \
  --hidden-dropout 0.0 --attention-dropout 0.0 --mask-prob "${MASK_PROB:-0.3}" \
  --sample-mode "${SAMPLE_MODE:-packed-docs}" \
  --lr-decay-style WSD --lr-wsd-decay-style minus_sqrt \
  --lr-wsd-decay-iters "$("$PY" -c "import sys; print(max(1, int(float(sys.argv[1]) * int(sys.argv[2]))))" \
    "${WSD_DECAY_FRACTION:-0.1}" "$TRAIN_ITERS")" "${@:2}"
