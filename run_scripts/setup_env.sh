#!/usr/bin/env bash
# Idempotent set-up: system packages (OpenMPI for mpi4py, pdsh, Slurm + munge for the Slurm tests), a virtualenv in .venv, and requirements.txt.
# Every other script sources this first, so a fresh machine needs nothing installed by hand.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

need_apt=()
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include ] || need_apt+=(libopenmpi-dev)
command -v pdsh >/dev/null 2>&1 || need_apt+=(pdsh)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "[setup] apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Slurm, munge and openssh-server, optional: tests/test_slurm.py starts a one-node cluster from them, and
# tests/test_multinode.py starts test hosts (network namespaces) with an sshd each (its own slurm.conf, munge key
# and daemons in a temp dir; the packages' own services are neither configured nor started here). Installed only as
# root, since the test cluster's daemons run as root anyway; where apt-get is missing or fails, the set-up goes on
# and the Slurm tests skip, naming what is missing.
need_slurm=()
[ -x /usr/sbin/slurmctld ] || need_slurm+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need_slurm+=(slurmd)
command -v srun >/dev/null 2>&1 || need_slurm+=(slurm-client)
[ -x /usr/sbin/munged ] || need_slurm+=(munge)
[ -x /usr/sbin/sshd ] || need_slurm+=(openssh-server)   # tests/test_multinode.py: an sshd per test host
if [ ${#need_slurm[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "[setup] not root: ${need_slurm[*]} not installed (the Slurm tests will skip)"
  elif ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup] no apt-get: ${need_slurm[*]} not installed (the Slurm tests will skip)"
  else
    echo "[setup] apt-get install ${need_slurm[*]}"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_slurm[@]}" >/dev/null; }; then
      echo "[setup] apt-get install ${need_slurm[*]} failed: going on without them (the Slurm tests will skip)"
    fi
  fi
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
# Which torch build the GPUs here need (run_scripts/torch_variant.py: V100s need PyTorch's CUDA 12.6 build; override
# with TORCH_VARIANT=default|cu126, TORCH_INDEX_URL=...). The stamp records it, so a changed choice reinstalls.
variant="$("$PY" run_scripts/torch_variant.py)"
stamp=".venv/.requirements.sha256"
want="$(sha256sum requirements.txt | cut -d' ' -f1)"
[ "$variant" = "default" ] || want="$want $variant"
have="$(cat "$stamp" 2>/dev/null || true)"
if [ "$have" != "$want" ]; then
  echo "[setup] pip install -r requirements.txt (first time takes a few minutes); torch build: $("$PY" run_scripts/torch_variant.py --explain)"
  # (pip's warnings about the machine's empty local indexes are filtered; real errors still fail the set-up)
  quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }
  quiet .venv/bin/python -m pip install -q --upgrade pip wheel
  have_variant="default"; case "$have" in *" "*) have_variant="${have##* }";; esac
  reinstall=(); [ -n "$have" ] && [ "$have_variant" != "$variant" ] && reinstall=(--force-reinstall --no-deps)
  read -r -a torch_args <<< "$("$PY" run_scripts/torch_variant.py --pip-args)"
  if [ ${#torch_args[@]} -gt 0 ]; then
    quiet .venv/bin/python -m pip install -q "${reinstall[@]}" "${torch_args[@]}"   # the build the GPUs need first
  elif [ ${#reinstall[@]} -gt 0 ]; then
    quiet .venv/bin/python -m pip install -q "${reinstall[@]}" "$(grep -E '^torch==' requirements.txt)"
  fi
  quiet .venv/bin/python -m pip install -q -r requirements.txt   # keeps that torch: same pinned version
  echo "$want" > "$stamp"
fi

# DeepSpeed's CPU backend JIT-compiles a shared-memory collective op the first time a rank starts (1-3 minutes).
# Build it here, once and visibly, into this checkout's .venv (callers export the same TORCH_EXTENSIONS_DIR), so the
# first `deepspeed` launch of a test or of the quickstart does not spend its time limit compiling in silence.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
op_stamp="$TORCH_EXTENSIONS_DIR/.shm_op_built"
if [ ! -f "$op_stamp" ] && .venv/bin/python -c 'import sys, torch; sys.exit(torch.cuda.is_available())'; then
  echo "[setup] building DeepSpeed's CPU communication op once (1-3 minutes the first time, cached after)"
  .venv/bin/python -c 'from deepspeed.comm.torch import build_shm_op; build_shm_op()' 2>&1 \
    | { grep -v "real_accelerator" || true; }
  mkdir -p "$TORCH_EXTENSIONS_DIR" && touch "$op_stamp"
fi
