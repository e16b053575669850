#!/usr/bin/env bash
# Prove the GPU path: the CUDA tests (pytest -m gpu, the CUDA contracts, exact resume), a training smoke, a kernel
# table and training-step benchmarks. Writes OUT_DIR/report.md and report.json (default out/gpu_check), and the long
# outputs (setup.log, each step's log, the profile's trace) under OUT_DIR/logs/; see docs/gpu_check.md.
#
#   bash run_scripts/gpu_check.sh [--quick] [--budget-s S] [OUT_DIR] [other devtools.gpu_check options]
#
# --quick: <= 8 minutes on one GPU from a bare node, the set-up included (the budget counts from this script's
# start). The set-up is run_scripts/setup_env.sh with the caller's environment (TORCH=system, WHEELHOUSE=DIR).
# Exit: 0 all passed, 1 a step failed, 3 steps left out past the budget; without any GPU: a report saying so, 0.
set -euo pipefail
T0="$(date +%s)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

out="${GPU_CHECK_OUT:-out/gpu_check}"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --budget-s|--work-dir|--t0|--out-dir)
      [ $# -ge 2 ] || { echo "gpu_check.sh: $1 needs a value" >&2; exit 2; }
      if [ "$1" = "--out-dir" ]; then out="$2"; else args+=("$1" "$2"); fi
      shift 2 ;;
    --only)  # the step names up to the next option
      args+=("$1"); shift
      while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do args+=("$1"); shift; done ;;
    -h|--help|--list|--quick|--rehearse-on-cpu) args+=("$1"); shift ;;
    -*) echo "gpu_check.sh: unknown option $1 (see docs/gpu_check.md)" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done

export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.venv/torch_extensions}"
mkdir -p "$out/logs"
echo "[gpu_check] set-up: run_scripts/setup_env.sh (TORCH=${TORCH:-} WHEELHOUSE=${WHEELHOUSE:-}), log in $out/logs/setup.log"
set +e
bash run_scripts/setup_env.sh 2>&1 | tee "$out/logs/setup.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then  # no python to run the check with: say so where the report would be
  { echo "# GPU check report"; echo; echo "The set-up (run_scripts/setup_env.sh) failed with exit code $rc after"
    echo "$(( $(date +%s) - T0 )) s: no step ran. The end of its output (all of it in logs/setup.log):"; echo
    echo '```'; tail -n 40 "$out/logs/setup.log"; echo '```'; } > "$out/report.md"
  echo "[gpu_check] FAILED: the set-up failed (exit $rc); see $out/report.md" >&2
  exit 1
fi
echo "[gpu_check] set-up done in $(( $(date +%s) - T0 )) s"
exec .venv/bin/python -m devtools.gpu_check --out-dir "$out" --t0 "$T0" "${args[@]}"
