#!/usr/bin/env bash
# The README's main job on the shipped sample corpus (run_scripts/sample_data/corpus):
#   1. set-up (idempotent: apt openmpi, .venv, requirements)
#   2. train a WordPiece vocab on the sample corpus          (data_pipeline.train_tokenizer)
#   3. preprocess the corpus into Megatron-compatible shards  (data_pipeline.preprocess)
#   4. inspect the shards                                     (tools.inspect_dataset)
# Later issues append pretraining and export steps. Usage: bash run_scripts/quickstart.sh [OUT_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${1:-${QUICKSTART_OUT:-./out/quickstart}}"
WORKERS="${WORKERS:-2}"
SAMPLE=run_scripts/sample_data/corpus

echo "[quickstart] 1/4 set-up"
source run_scripts/setup_env.sh
cd "$ROOT"
PY=.venv/bin/python  # (set after sourcing: setup_env.sh uses $PY for the system python)
mkdir -p "$OUT"

echo "[quickstart] 2/4 train a WordPiece vocab on $SAMPLE -> $OUT/tokenizer/vocab.txt"
$PY -m data_pipeline.train_tokenizer --input "$SAMPLE" --output-dir "$OUT/tokenizer" \
    --model-type wordpiece --vocab-size 4000

echo "[quickstart] 3/4 preprocess $SAMPLE -> $OUT/data/sample_text_sentence.{bin,idx}"
rm -f "$OUT"/data/sample_text_sentence.{bin,idx}
$PY -m data_pipeline.preprocess --input "$SAMPLE" --output-prefix "$OUT/data/sample" \
    --tokenizer-type BertWordPieceLowerCase --vocab-file "$OUT/tokenizer/vocab.txt" \
    --split-sentences --workers "$WORKERS" --strict

echo "[quickstart] 4/4 inspect the shards"
$PY -m tools.inspect_dataset "$OUT/data/sample_text_sentence" --vocab-file "$OUT/tokenizer/vocab.txt" --num-docs 2

echo "[quickstart] done: shards in $OUT/data, vocab in $OUT/tokenizer"
