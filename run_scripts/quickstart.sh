#!/usr/bin/env bash
# The README's main job: the whole path on the shipped sample corpus (run_scripts/sample_data/corpus).
#   1. set-up (idempotent: apt openmpi/pdsh, .venv, requirements)
#   2. train a WordPiece vocab on the sample corpus            (data_pipeline.train_tokenizer)
#   3. preprocess it into Megatron-compatible shards            (data_pipeline.preprocess)
#   4. inspect the shards                                       (tools.inspect_dataset)
#   5. pretrain a tiny BlockBERT (n=2) with DeepSpeed on 2 ranks (pretrain/train.py; CPU ranks on gloo without GPU)
#   6. check that the loss fell and print the validation metrics (from the run's --log-json file)
#   7. convert the checkpoint to Hugging Face                   (tools.convert_checkpoint --to-hf)
#   8. load it with transformers and score held-out masked words against the unigram baseline
#                                                              (tools.quickstart_summary)
#   9. did pretraining help? probe tasks from the held-out documents (tools.evaluate.probe_data), fine-tuned from the
#      export and from its random-init twin, 3 seeds each; says whether pretrained wins by more than the spread
#                                                              (tools.probe_compare)
# Usage: bash run_scripts/quickstart.sh [OUT_DIR]          (default ./out/quickstart; re-running starts over)
# Knobs: NPROC (ranks, default 2), ITERS (default 600), WORKERS (preprocess workers, default 2).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${1:-${QUICKSTART_OUT:-./out/quickstart}}"
WORKERS="${WORKERS:-2}"
[ -n "${NPROC:-}" ] && NPROC_GIVEN=1
source run_scripts/ranks.sh
NPROC="$(ranks_for_node "${NPROC:-2}" 2)"
ITERS="${ITERS:-600}"
SAMPLE=run_scripts/sample_data/corpus
START=$SECONDS
step() { echo; echo "[quickstart] $1  (t=$((SECONDS - START))s)"; }

step "1/9 set-up (.venv, requirements; minutes the first time, seconds after)"
# setup_env.sh builds DeepSpeed's CPU communication op once into this checkout's .venv; the ranks look there too
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
bash run_scripts/setup_env.sh
PY=.venv/bin/python
mkdir -p "$OUT"
RUN="$OUT/run"
rm -rf "$RUN" "$OUT/hf" "$OUT/hf_random_init" "$OUT/probe"

step "2/9 train a WordPiece vocab on $SAMPLE -> $OUT/tokenizer/vocab.txt"
$PY -m data_pipeline.train_tokenizer --input "$SAMPLE" --output-dir "$OUT/tokenizer" \
    --model-type wordpiece --vocab-size 4000 --overwrite

step "3/9 preprocess $SAMPLE -> $OUT/data/sample_text_sentence.{bin,idx}"
rm -f "$OUT"/data/sample_text_sentence*
$PY -m data_pipeline.preprocess --input "$SAMPLE" --output-prefix "$OUT/data/sample" \
    --tokenizer-type BertWordPieceLowerCase --vocab-file "$OUT/tokenizer/vocab.txt" \
    --split-sentences --workers "$WORKERS" --strict

step "4/9 inspect the shards"
$PY -m tools.inspect_dataset "$OUT/data/sample_text_sentence" --vocab-file "$OUT/tokenizer/vocab.txt" --num-docs 1

step "5/9 pretrain a tiny BlockBERT (n=2, heads 3:1, N=128, block 16) with DeepSpeed on $NPROC ranks, $ITERS steps"
# hidden 128, 2 layers, 4 heads; micro batch 4 x 2 ranks = global batch 8; lr 2e-3, 10% warmup, linear decay. Twice
# the steps of batch 16 in ~1.25x the time (a step's fixed cost): validation perplexity ~19 instead of ~35, a model
# that step 9's fine-tunings start from reliably (docs/troubleshooting.md, "Step 9: what it measures").
# Without a GPU, `deepspeed --num_gpus K` starts K CPU ranks that talk over gloo.
.venv/bin/deepspeed --num_gpus "$NPROC" pretrain/train.py --deepspeed_config ds_configs/zero2_fp32.json \
    --data-path "$OUT/data/sample_text_sentence" --vocab-file "$OUT/tokenizer/vocab.txt" \
    --model-preset tiny --hidden-size 128 --num-attention-heads 4 --ffn-hidden-size 512 \
    --blockbert-blocks 2 --head-assignment 3:1 \
    --seq-length 128 --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size $((4 * NPROC)) \
    --train-iters "$ITERS" --lr 2e-3 --lr-warmup-fraction 0.1 --log-interval 10 \
    --eval-interval $((ITERS / 3)) --eval-iters 10 --num-workers 1 \
    --save "$RUN/ckpt" --load "$RUN/ckpt" --save-interval $((ITERS / 2)) --keep-last 2 \
    --tensorboard-dir "$RUN/tb" --log-json "$RUN/log.jsonl"

step "6/9 did it learn? (first vs last training loss, validation metrics; from $RUN/log.jsonl)"
$PY - "$RUN/log.jsonl" "$OUT/tokenizer/vocab.txt" <<'PYEOF'
import json, math, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
train = [r for r in rows if "loss" in r]
valid = [r for r in rows if "valid" in r]
vocab = sum(1 for _ in open(sys.argv[2], encoding="utf-8"))
# single logged losses are noisy (one batch of 16): compare the means of the first and the last three logs
head, tail = train[:3], train[-3:]
first = sum(r["loss"] for r in head) / len(head)
last = sum(r["loss"] for r in tail) / len(tail)
print(f"training loss: {first:.3f} (mean of iterations {', '.join(str(r['iteration']) for r in head)}) -> {last:.3f} "
      f"(mean of iterations {', '.join(str(r['iteration']) for r in tail)}); a uniform guess over the vocabulary "
      f"would score ln({vocab}) = {math.log(vocab):.2f}")
for r in valid:
    v = r["valid"]
    print(f"validation at iteration {r['iteration']}: " + ", ".join(f"{k} {x:.4g}" for k, x in v.items()))
if not last < first - 1.0:
    sys.exit(f"the loss did not fall clearly ({first:.3f} -> {last:.3f}): see docs/troubleshooting.md")
print("OK: the loss fell clearly")
PYEOF

step "7/9 convert the DeepSpeed checkpoint to Hugging Face -> $OUT/hf"
$PY -m tools.convert_checkpoint --load "$RUN/ckpt" --to-hf "$OUT/hf"

step "8/9 load $OUT/hf with transformers (trust_remote_code=True: BlockBERT ships its own code): what did it learn?"
# Masks held-out tokens (the trainer's validation documents, --split's default 949,50,1) and scores the export's
# predictions against the unigram baseline (training-token frequencies only); shows two masked positions as examples.
$PY -m tools.quickstart_summary --model "$OUT/hf" --data-path "$OUT/data/sample_text_sentence" --seq-length 128

step "9/9 did pretraining help? fine-tune the export and its random-init twin on probe tasks from held-out documents"
# probe_pair: a held-out sentence and its inner-word shuffle, which one is the sentence as written (a minimal pair,
# MRPC's layout); probe_single: intact sentence or its inner words shuffled (SST-2's). Both from the validation
# documents (never trained on), train/dev documents disjoint; --data-path checks that they are the shard's. Same budget
# for both models (the `quickstart` protocol of tools/evaluate/protocols.py: its seeds, lr, batch, epochs), 12
# fine-tunings side by side in one single-threaded process per CPU (two here).
$PY -m tools.evaluate.probe_data --corpus "$SAMPLE" --output-dir "$OUT/probe" \
    --data-path "$OUT/data/sample_text_sentence" --overwrite
# Exit 1 = "pretraining did not beat random init beyond the seed spread on every task": reported, not fatal. At this
# budget a fine-tuning either learns a probe or stays near chance, depending on the seed: the pretrained model learns
# in 11 of 12 runs over seeds 1-6, random init in none (docs/troubleshooting.md), but one pretrained seed near chance
# widens the spread past the gap (another machine's bits can put one among the three). Other errors fail the script.
rc=0
$PY -m tools.probe_compare --model "$OUT/hf" --data-dir "$OUT/probe" --random-init "$OUT/hf_random_init" || rc=$?
if [ "$rc" = 1 ]; then
  echo "[quickstart] note: pretraining did not beat random init beyond the spread on every probe task this time (at" \
    "this budget some seeds stay at chance: docs/troubleshooting.md); the table above is what was measured"
elif [ "$rc" != 0 ]; then
  exit "$rc"
fi

echo
echo "[quickstart] done in $((SECONDS - START))s. Outputs:"
echo "  TensorBoard logs : $RUN/tb          (.venv/bin/tensorboard --logdir $RUN/tb)"
echo "  JSON log         : $RUN/log.jsonl"
echo "  checkpoint       : $RUN/ckpt/$(cat "$RUN/ckpt/latest")   (resume: same command with --load $RUN/ckpt)"
echo "  Hugging Face     : $OUT/hf          (AutoModelForMaskedLM.from_pretrained('$OUT/hf', trust_remote_code=True))"
echo "  shards, vocab    : $OUT/data/sample_text_sentence.{bin,idx}, $OUT/tokenizer/vocab.txt"
echo "  probe tasks      : $OUT/probe/{probe_pair,probe_single}/{train,dev}.tsv (GLUE's MRPC and SST-2 layouts)"
