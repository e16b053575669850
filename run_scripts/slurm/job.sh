#!/usr/bin/env bash
# Sourced by the sbatch templates of this folder (not a job itself): finds the checkout, sets per-rank threads,
# runs a paper set-up or a custom run, and requeues the job when the trainer stopped for the time-limit signal.
#
# Knobs (environment, passed into the job by sbatch):
#   SPARSEBERT_ROOT  the checkout (default: the directory sbatch was called from, $SLURM_SUBMIT_DIR)
#   MAX_RESTARTS     requeue at most this many times (default 50)
#   EXIT_SIGNAL      the signal the trainer turns into "save and exit 4" (default SIGUSR1, as in #SBATCH --signal)
# plus every knob of run_scripts/common.sh (SCALE, BATCH_SCALE, MICRO_BATCH, DATA_PATH, VOCAB, OUT, DS_CONFIG, ...).
set -uo pipefail
ROOT="${SPARSEBERT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}"
if [ ! -f "$ROOT/run_scripts/common.sh" ]; then
  echo "[slurm] $ROOT is not a sparse-bert checkout: submit from the repository root or set SPARSEBERT_ROOT" >&2
  exit 2
fi
cd "$ROOT"
export EXIT_SIGNAL="${EXIT_SIGNAL:-SIGUSR1}"
# srun (Slurm >= 22.05) no longer passes the job's --cpus-per-task on to its steps unless told
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
  export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK" OMP_NUM_THREADS="${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}"
fi
echo "[slurm] job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}:" \
  "${SLURM_JOB_NUM_NODES:-?} node(s), ${SLURM_NTASKS:-?} task(s); $(date -Is)"

# run_setup SETUP ARGS...: `args TRAIN_FLAGS...` (a custom run through common.sh) or a paper set-up
# (blockbert | roberta_1seq | sparsebert | diet | two_phase) with the arguments of run_scripts/pretrain_SETUP.sh
run_setup() {
  local setup="${1:?usage: sbatch TEMPLATE SETUP [ARGS...]  (SETUP = args, blockbert, roberta_1seq, sparsebert, diet, two_phase)}"
  shift
  if [ "$setup" = args ]; then
    bash run_scripts/common.sh "$@"
  elif [ -f "run_scripts/pretrain_${setup}.sh" ]; then
    bash "run_scripts/pretrain_${setup}.sh" "$@"
  else
    echo "[slurm] unknown set-up '$setup': args, blockbert, roberta_1seq, sparsebert, diet or two_phase" >&2
    return 2
  fi
}

# finish CODE: exit code 4 = the trainer saved a committed checkpoint on $EXIT_SIGNAL, 5 = the watchdog ended a rank
# whose peers stopped answering (pretrain/watchdog.py: a lost node, a cut link) -> requeue this job; the requeued job
# runs the same script, whose --load resumes from the newest committed checkpoint that verifies. Any other code ends
# the job with that code.
finish() {
  local code="$1" why
  if [ "$code" -eq 4 ] || [ "$code" -eq 5 ]; then
    why="the trainer saved and stopped on $EXIT_SIGNAL"
    [ "$code" -eq 5 ] && why="a rank's peers stopped answering (watchdog, exit 5)"
    if [ "${SLURM_RESTART_COUNT:-0}" -ge "${MAX_RESTARTS:-50}" ]; then
      echo "[slurm] $why, but MAX_RESTARTS=${MAX_RESTARTS:-50} reached: not requeued; resubmit to continue" >&2
      exit "$code"
    fi
    echo "[slurm] $why: requeueing job $SLURM_JOB_ID; $(date -Is)"
    if scontrol requeue "$SLURM_JOB_ID"; then
      sleep 60 & wait  # requeue ends this script; do not report an exit code of our own before it does
      exit 0
    fi
    echo "[slurm] scontrol requeue failed (job submitted with --no-requeue?): resubmit to continue" >&2
    exit "$code"
  fi
  echo "[slurm] done, exit code $code; $(date -Is)"
  exit "$code"
}
