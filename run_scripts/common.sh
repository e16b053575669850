#!/usr/bin/env bash
# Shared settings for the paper set-ups. Source it, set MODEL_ARGS/DATA_ARGS/..., then call `launch ARGS...`.
# Run it as a script (`bash run_scripts/common.sh TRAIN_ARGS...`) to launch a custom run the same way.
#
# Environment knobs (all optional):
#   LAUNCHER   deepspeed (default, one node) | hostfile (deepspeed --hostfile $HOSTFILE, pdsh) |
#              hostfile-openmpi (deepspeed --hostfile --launcher openmpi) | mpirun | torchrun |
#              srun (inside a Slurm allocation: `srun $SRUN_ARGS python -m pretrain.train`, one task per rank;
#              the allocation's tasks decide the world, NPROC is unused; see run_scripts/slurm/) | python (one
#              process). The command lines are common/launch.py's table: `.venv/bin/python -m common.launch
#              --launcher L --nproc N --print -- -m pretrain.train ARGS` shows one. hostfile, hostfile-openmpi
#              and mpirun get ssh keep-alives in PDSH_SSH_ARGS_APPEND / OMPI_MCA_plm_rsh_args (yours kept, missing
#              ones appended; common/keepalive.py): a lost host ends the command instead of leaving it waiting
#   MPI_ARGS   mpirun flags (LAUNCHER=mpirun, default --allow-run-as-root --oversubscribe; hostfile-openmpi's
#              --launcher_args, default --allow-run-as-root)     TORCHRUN_ARGS  extra torchrun flags
#   NPROC      ranks per node (default: GPUs found, else 2 CPU ranks)      HOSTFILE  (default run_scripts/hostfile)
#   MASTER_PORT LAUNCHER=deepspeed's rendezvous port (default: a free one, so concurrent runs on one machine do not
#              meet on DeepSpeed's default 29500 and hang)
#   DS_ARGS    extra flags for the deepspeed runner of the hostfile launchers (e.g. --force_multi --no_ssh_check
#              --master_addr HOST --master_port PORT)
#   SRUN_ARGS  srun flags for LAUNCHER=srun (default --kill-on-bad-exit=0: after the exit signal the ranks leave
#              with code 4 one after the other, and srun must not kill the last ones as they finish; a rank that
#              dies makes the others fail in their next collective, or after --distributed-timeout-minutes)
#   EXIT_SIGNAL e.g. SIGUSR1: adds --exit-signal-handler --exit-signal $EXIT_SIGNAL (on that signal every rank saves
#              and exits with code 4; the Slurm templates send it before the time limit and requeue)
#   SCALE      multiplies the paper's step counts (warmup and total); e.g. SCALE=0.001 for a smoke run
#   BATCH_SCALE multiplies the paper's global batch (tokens per batch B*N = 131,072 at BATCH_SCALE=1)
#   MICRO_BATCH per-rank micro batch; accumulation is derived, the global batch stays. Default: `auto` where GPUs are
#              found (the largest of 1, 2, 4, ..., 128 that divides the per-rank batch and fits the GPU's free memory
#              by a formula of the model; the trainer says what it chose and why: pretrain/micro_batch.py), else 8
#              (the paper's 32 V100s at N=512, and what `auto` takes on a CPU)
#   RECIPE     the run file (TOML, `--config`) holding the set-up's fixed hyper-parameters: paper (default,
#              recipes/paper.toml: Table 7, attention dropout 0.1) | fast (recipes/fast.toml: attention dropout 0, as
#              ModernBERT and MosaicBERT train; hidden dropout stays 0.1; its header has the measured cost) | a path
#              to your own .toml. The knobs here (N, SCALE, BATCH_SCALE, MICRO_BATCH, DATA_PATH, VOCAB, ...) are
#              flags, which win over the file; fast trains another model than the papers' (docs/training.md)
#   DATA_PATH  Megatron-style prefixes (default data/bert_books_wiki_text_sentence)
#   VOCAB      WordPiece vocab (default data/bert-base-uncased-vocab.txt)
#   OUT        output root (default runs/$RUN_NAME); checkpoints in $OUT/ckpt, TensorBoard in $OUT/tb
#   DS_CONFIG  overrides the set-up's ds_config
#   LOAD       directory to --load from (default: the run's own checkpoints, so re-running resumes)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv/bin/python}"
BIN="$(dirname "$PY")"

LAUNCHER="${LAUNCHER:-deepspeed}"
if { [ -z "${NPROC:-}" ] && [ "$LAUNCHER" != srun ]; } || [ -z "${MICRO_BATCH:-}" ]; then
  GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
fi
if [ -z "${NPROC:-}" ] && [ "$LAUNCHER" != srun ]; then
  NPROC="$((GPUS > 0 ? GPUS : 2))"
fi
HOSTFILE="${HOSTFILE:-$ROOT/run_scripts/hostfile}"
SCALE="${SCALE:-1}"
BATCH_SCALE="${BATCH_SCALE:-1}"
if [ -z "${MICRO_BATCH:-}" ]; then
  if [ "$GPUS" -gt 0 ]; then MICRO_BATCH=auto; else MICRO_BATCH=8; fi
fi
RECIPE="${RECIPE:-paper}"
case "$RECIPE" in
  paper|fast) RECIPE_FILE="recipes/$RECIPE.toml" ;;  # Table 7; fast: its attention dropout 0
  *.toml) RECIPE_FILE="$RECIPE" ;;
  *) echo "RECIPE must be paper or fast (or a .toml run file), got '$RECIPE'" >&2; exit 2 ;;
esac
DATA_PATH="${DATA_PATH:-data/bert_books_wiki_text_sentence}"
VOCAB="${VOCAB:-data/bert-base-uncased-vocab.txt}"

# scaled integer: scaled N FACTOR -> max(1, round(N * FACTOR))
scaled() { "$PY" -c "import sys; print(max(1, round(float(sys.argv[1]) * float(sys.argv[2]))))" "$1" "$2"; }

# Table 7 of the blockwise-attention paper (BERT-base, RoBERTa-1seq setting): the recipe file's fixed settings, and
# as flags (which win over it) what depends on N, the scale knobs and the machine.
paper_hparams() {  # $1 = sequence length N
  local n="$1"
  local tokens=131072
  if [ ! -f "$RECIPE_FILE" ]; then echo "RECIPE=$RECIPE: no such run file $RECIPE_FILE" >&2; exit 2; fi
  GLOBAL_BATCH="$(scaled $((tokens / n)) "$BATCH_SCALE")"
  TRAIN_ITERS="$(scaled 2400000 "$SCALE")"    # "Max steps 2.4M"
  WARMUP_ITERS="$(scaled 10000 "$SCALE")"     # "Warmup steps 10K"
  PAPER_ARGS=(--config "$RECIPE_FILE" --seq-length "$n" --max-position-embeddings "$n"
    --global-batch-size "$GLOBAL_BATCH" --micro-batch-size "$MICRO_BATCH" --train-iters "$TRAIN_ITERS"
    --lr-warmup-iters "$WARMUP_ITERS" --vocab-file "$VOCAB" --data-path $DATA_PATH)
}

launch() {  # launch TRAIN_ARGS...
  local out="${OUT:-runs/${RUN_NAME:-run}}"
  mkdir -p "$out"
  # resume from our own checkpoints unless LOAD names another directory (phase 2 of a two-phase run)
  local common=(--save "$out/ckpt" --load "${LOAD:-$out/ckpt}" --tensorboard-dir "$out/tb" --log-json "$out/log.jsonl")
  if [ -n "${EXIT_SIGNAL:-}" ]; then
    common+=(--exit-signal-handler --exit-signal "$EXIT_SIGNAL")
  fi
  # the command line is common/launch.py's (its table has one entry per LAUNCHER); it replaces itself by the
  # launcher, so the launcher is our child and its exit code ours
  local flags=(--launcher "$LAUNCHER" --python "$PY" --hostfile "$HOSTFILE")
  if [ -n "${NPROC:-}" ]; then flags+=(--nproc "$NPROC"); fi
  "$PY" -m common.launch "${flags[@]}" -- -m pretrain.train "$@" "${common[@]}"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run as a script: launch the given trainer flags
  launch "$@"
fi
