#!/usr/bin/env bash
# sbatch one of this folder's templates with resources from environment knobs, so the same command serves a GPU
# cluster and a CPU-only test cluster (no GPU directive unless GPUS > 0):
#   bash run_scripts/slurm/submit.sh TEMPLATE [ARGS...]     TEMPLATE = pretrain_srun | pretrain_deepspeed | preprocess
# Knobs: NODES (1), GPUS per node (0 = CPU ranks), TASKS_PER_NODE (GPUS, or 2 without GPUs; 1 for preprocess),
#        CPUS per task, PARTITION, TIME (e.g. 2-00:00:00), ACCOUNT, SIGNAL_AT (seconds before the limit, 120),
#        SBATCH_ARGS (anything else, e.g. "--exclusive --qos=high"). Prints sbatch's "Submitted batch job ID".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
name="${1:?usage: submit.sh pretrain_srun|pretrain_deepspeed|preprocess [ARGS...]}"
shift
template="$ROOT/run_scripts/slurm/${name%.sbatch}.sbatch"
[ -f "$template" ] || { echo "submit.sh: no template $template" >&2; exit 2; }
GPUS="${GPUS:-0}"
if [ "${name%.sbatch}" = preprocess ]; then default_tasks=1; else default_tasks=$(( GPUS > 0 ? GPUS : 2 )); fi
opts=(--nodes "${NODES:-1}" --ntasks-per-node "${TASKS_PER_NODE:-$default_tasks}")
[ -n "${CPUS:-}" ] && opts+=(--cpus-per-task "$CPUS")
[ -n "${PARTITION:-}" ] && opts+=(--partition "$PARTITION")
[ -n "${TIME:-}" ] && opts+=(--time "$TIME")
[ -n "${ACCOUNT:-}" ] && opts+=(--account "$ACCOUNT")
if [ "$GPUS" -gt 0 ]; then
  case "${name%.sbatch}" in
    # every task sees all GPUs of its node (CUDA IPC / NVLink between the ranks of a node keep working; per-task
    # binding with --gpus-per-task=1 also runs but can cut NCCL off P2P, see docs/troubleshooting.md)
    *) opts+=(--gpus-per-node "$GPUS") ;;
  esac
fi
if [ -n "${SIGNAL_AT:-}" ]; then
  case "${name%.sbatch}" in
    pretrain_srun) opts+=(--signal "USR1@$SIGNAL_AT") ;;
    pretrain_deepspeed) opts+=(--signal "B:USR1@$SIGNAL_AT") ;;
  esac
fi
read -r -a more <<< "${SBATCH_ARGS:-}"
cd "$ROOT"
exec sbatch "${opts[@]}" "${more[@]}" "$template" "$@"
