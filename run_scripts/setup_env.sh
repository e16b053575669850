#!/usr/bin/env bash
# Idempotent set-up: system packages (OpenMPI for mpi4py, pdsh, Slurm + munge for the Slurm tests), a virtualenv in .venv, and requirements.txt.
# Every other script sources this first, so a fresh machine needs nothing installed by hand.
#
#   TORCH=auto (default)  system when the python running this (PYTHON, default python3) imports a CUDA/ROCm build of
#                         torch, else pinned; an existing .venv keeps the mode it was made with
#   TORCH=pinned          a plain venv with requirements.txt's pins, torch included (CI, CPU machines)
#   TORCH=system          a venv with --system-site-packages on the image's/module's torch: installs only what is
#                         missing or older than requirements.txt's floors, never torch, and says what it kept
#   WHEELHOUSE=DIR        install from DIR only (run_scripts/make_wheelhouse.sh made it): no pip index, no apt-get
#                         (what apt would add is reported as missing and the set-up goes on)
# See docs/troubleshooting.md, "Air-gapped clusters and preinstalled PyTorch".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
WHEELHOUSE="${WHEELHOUSE:-}"
pip_src=()
if [ -n "$WHEELHOUSE" ]; then
  [ -d "$WHEELHOUSE" ] || { echo "[setup] error: WHEELHOUSE=$WHEELHOUSE is not a directory (make it with run_scripts/make_wheelhouse.sh)" >&2; exit 2; }
  WHEELHOUSE="$(cd "$WHEELHOUSE" && pwd)"
  pip_src=(--no-index --find-links "$WHEELHOUSE")
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"   # also for anything pip runs underneath
fi

need_apt=()
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include ] || need_apt+=(libopenmpi-dev)
command -v pdsh >/dev/null 2>&1 || need_apt+=(pdsh)
if [ ${#need_apt[@]} -gt 0 ] && [ -n "$WHEELHOUSE" ]; then
  echo "[setup] offline (WHEELHOUSE): not installing ${need_apt[*]}; multi-node launchers (mpirun, pdsh) and the MPI tests need them"
elif [ ${#need_apt[@]} -gt 0 ]; then
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
  if [ -n "$WHEELHOUSE" ]; then
    echo "[setup] offline (WHEELHOUSE): ${need_slurm[*]} not installed (the Slurm tests will skip)"
  elif [ "$(id -u)" -ne 0 ]; then
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

# (pip's warnings about the machine's empty local indexes are filtered; real errors still fail the set-up)
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }

# Triton for the interpreter tests, only beside a CPU torch that brought none (a CUDA torch's own is never replaced)
cpu_torch_extras() {
  local extras
  extras="$(.venv/bin/python run_scripts/reqs.py cpu-torch ${WHEELHOUSE:+--wheelhouse "$WHEELHOUSE"})"
  if [ -n "$extras" ]; then
    echo "[setup] pip install $extras (CPU torch: tests/test_triton_block.py interprets our Triton kernel)"
    quiet .venv/bin/python -m pip install -q "${pip_src[@]}" $extras
  fi
}

# Which mode: an existing .venv keeps its own (pyvenv.cfg says whether it sees the system's packages).
mode="${TORCH:-auto}"
venv_mode=""
if [ -f .venv/pyvenv.cfg ]; then
  if grep -qiE '^include-system-site-packages\s*=\s*true' .venv/pyvenv.cfg; then venv_mode=system; else venv_mode=pinned; fi
fi
case "$mode" in
  auto)
    if [ -n "$venv_mode" ]; then
      mode="$venv_mode"
    elif "$PY" -c 'import sys, torch; sys.exit(0 if (torch.version.cuda or torch.version.hip) else 1)' >/dev/null 2>&1; then
      mode=system
      echo "[setup] TORCH=auto: $PY has torch $("$PY" -c 'import torch; print(torch.__version__)') built for GPUs: using it (TORCH=system; TORCH=pinned for a venv of its own)"
    else
      mode=pinned
    fi ;;
  system|pinned)
    if [ -n "$venv_mode" ] && [ "$venv_mode" != "$mode" ]; then
      echo "[setup] error: TORCH=$mode, but .venv was made for TORCH=$venv_mode: remove it (rm -rf .venv) to switch" >&2
      exit 2
    fi ;;
  *) echo "[setup] error: TORCH=$mode: choose auto, system or pinned" >&2; exit 2 ;;
esac

if [ "$mode" = system ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv on $PY's packages (--system-site-packages)"
    # Images without ensurepip (Debian's python3 without python3-venv): a venv without its own pip uses the image's
    "$PY" -m venv --system-site-packages .venv 2>/dev/null || { rm -rf .venv; "$PY" -m venv --system-site-packages --without-pip .venv; }
    # When $PY is itself a venv (e.g. /opt/torch/.venv), --system-site-packages reaches its base python, not its
    # packages: a .pth file puts that venv's site-packages after ours (ours shadow; torch is found there).
    site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$PY" -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")' \
      > "$site/_sparse_bert_base_env.pth"
  fi
  stamp=".venv/.requirements.sha256"
  want="$(sha256sum requirements.txt | cut -d' ' -f1) system $(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    torch_where="$(.venv/bin/python -c 'import torch, os; print(torch.__version__, "from", os.path.dirname(torch.__file__))' 2>/dev/null)" \
      || { echo "[setup] error: TORCH=system, but $PY's torch does not import in .venv (rm -rf .venv; check PYTHON)" >&2; exit 2; }
    echo "[setup] TORCH=system: torch $torch_where (never replaced); requirements.txt's floors decide the rest"
    .venv/bin/python run_scripts/reqs.py plan --out-dir .venv/.setup ${WHEELHOUSE:+--wheelhouse "$WHEELHOUSE"}   # prints kept/install, exits 2 if torch out of range
    if [ -s .venv/.setup/install.txt ]; then
      echo "[setup] pip install ${pip_src[*]} $(tr '\n' ' ' < .venv/.setup/install.txt)(torch and the kept ones pinned)"
      quiet .venv/bin/python -m pip install -q "${pip_src[@]}" -r .venv/.setup/install.txt -c .venv/.setup/constraints.txt
    fi
    cpu_torch_extras
    echo "$want" > "$stamp"
  fi
else
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
    [ -n "$WHEELHOUSE" ] || quiet .venv/bin/python -m pip install -q --upgrade pip wheel
    have_variant="default"; case "$have" in *" "*) have_variant="${have##* }";; esac
    reinstall=(); [ -n "$have" ] && [ "$have_variant" != "$variant" ] && reinstall=(--force-reinstall --no-deps)
    read -r -a torch_args <<< "$("$PY" run_scripts/torch_variant.py --pip-args)"
    if [ ${#torch_args[@]} -gt 0 ]; then
      quiet .venv/bin/python -m pip install -q "${reinstall[@]}" "${torch_args[@]}"   # the build the GPUs need first
    elif [ ${#reinstall[@]} -gt 0 ]; then
      quiet .venv/bin/python -m pip install -q "${pip_src[@]}" "${reinstall[@]}" "$(grep -E '^torch==' requirements.txt | sed 's/\s*#.*//')"
    fi
    mkdir -p .venv/.setup && "$PY" run_scripts/reqs.py pins > .venv/.setup/pins.txt   # all but `# cpu-torch` ones
    quiet .venv/bin/python -m pip install -q "${pip_src[@]}" -r .venv/.setup/pins.txt   # keeps that torch: same pinned version
    cpu_torch_extras
    echo "$want" > "$stamp"
  fi
fi

# DeepSpeed's CPU backend JIT-compiles a shared-memory collective op the first time a rank starts (1-3 minutes).
# Build it here, once and visibly, into this checkout's .venv (callers export the same TORCH_EXTENSIONS_DIR), so the
# first `deepspeed` launch of a test or of the quickstart does not spend its time limit compiling in silence.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
op_stamp="$TORCH_EXTENSIONS_DIR/.shm_op_built"
# torch keys this build on DeepSpeed's absolute include paths (under the venv's path as python was started), so every
# script and test starts python as .venv/bin/python: one path, one build.
venv_py=.venv/bin/python
# torch's build lock is a bare file (no pid in it): a build killed mid-way leaves it, and every later rank then waits
# on it until its own time limit. A build takes 1-3 minutes, so a lock older than 20 is a dead one's.
for lock in "$TORCH_EXTENSIONS_DIR"/*/lock; do
  if [ -f "$lock" ] && [ -n "$(find "$lock" -mmin +20 2>/dev/null)" ]; then
    echo "[setup] removing $lock: left by a DeepSpeed op build that was killed over 20 minutes ago"
    rm -f "$lock"
  fi
done
if [ ! -f "$op_stamp" ] && "$venv_py" -c 'import sys, torch; sys.exit(torch.cuda.is_available())'; then
  echo "[setup] building DeepSpeed's CPU communication op once (1-3 minutes the first time, cached after)"
  "$venv_py" -c 'from deepspeed.comm.torch import build_shm_op; build_shm_op()' 2>&1 \
    | { grep -v "real_accelerator" || true; }
  mkdir -p "$TORCH_EXTENSIONS_DIR" && touch "$op_stamp"
fi
