#!/usr/bin/env bash
# The launch paths on a tiny smoke run (2 CPU ranks on gloo where no GPU exists, NCCL on GPUs).
#   bash run_scripts/launch_examples.sh deepspeed|hostfile|hostfile-openmpi|mpirun|torchrun|srun|python
# Needs the sample data (run_scripts/quickstart.sh prepares it) or DATA_PATH/VOCAB pointing at yours.
# What each path runs (common/launch.py's table; `.venv/bin/python -m common.launch --launcher L --nproc N --print
# -- -m pretrain.train ARGS` prints it):
#   deepspeed --num_gpus $NPROC pretrain/train.py ARGS
#   deepspeed --hostfile run_scripts/hostfile pretrain/train.py ARGS                     (pdsh + ssh)
#   deepspeed --hostfile run_scripts/hostfile --launcher openmpi pretrain/train.py ARGS   (mpirun)
#   mpirun -np $NPROC -x PYTHONPATH=$PWD python -m pretrain.train ARGS                    (mpi4py discovery)
#   torchrun --nproc_per_node $NPROC pretrain/train.py ARGS
export LAUNCHER="${1:-deepspeed}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RUN_NAME="${RUN_NAME:-launch_${LAUNCHER}}"
launch --deepspeed_config "${DS_CONFIG:-ds_configs/zero2_fp32.json}" --model-preset tiny --seq-length 128 \
  --max-position-embeddings 128 --micro-batch-size 4 --global-batch-size 16 --train-iters 20 --lr 1e-3 \
  --lr-warmup-fraction 0.1 --data-path $DATA_PATH --vocab-file "$VOCAB" --log-interval 5 --eval-interval 10 \
  --eval-iters 2 "${@:2}"
