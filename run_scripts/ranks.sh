# Sourced by run scripts: how many ranks one node can run. On GPU nodes NCCL runs one rank per GPU (two ranks on one
# GPU fail with "Duplicate GPU detected"), so a default larger than the GPU count shrinks to it, with a message, and
# an explicit one is refused; without GPUs any count runs as CPU ranks.
#   ranks_for_node WANT DEFAULT   -> prints the rank count to use (exit 2 with a message when WANT cannot run)
ranks_for_node() {
  local want="$1" default="$2" gpus=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  fi
  if [ "$gpus" -gt 0 ] && [ "$want" -gt "$gpus" ]; then
    if [ "$want" = "$default" ] && [ -z "${NPROC_GIVEN:-}" ]; then
      echo "[ranks] $gpus GPU(s) here: running $gpus rank(s) instead of the default $default (one rank per GPU)" >&2
      echo "$gpus"
      return 0
    fi
    echo "[ranks] NPROC=$want but this node has $gpus GPU(s); NCCL runs one rank per GPU: set NPROC<=$gpus" >&2
    return 2
  fi
  echo "$want"
}
