#!/usr/bin/env bash
# .venv-floor: a second venv with the oldest versions we support, every requirement at its floor (requirements.txt's
# `# floor:` comments, read by run_scripts/reqs.py: torch 2.11.0, transformers 5.17.0, tokenizers 0.23.2, ...).
# run_scripts/test.sh runs the model, kernel, trainer (one rank), conversion/export and CUDA-contract tests a second
# time in it. Cached: nothing is installed while its stamp matches the floors. PyPI's torch wheels run on CPU too
# (their CUDA libraries come along: a few GB, once).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }
floors="$("$PY" run_scripts/reqs.py floors)"
want="$(printf '%s\n' "$floors" | sha256sum | cut -d' ' -f1)"
stamp=".venv-floor/.floors.sha256"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  [ -x .venv-floor/bin/python ] || "$PY" -m venv .venv-floor
  echo "[setup-floor] pip install into .venv-floor: $(printf '%s ' $floors)(first time: a few minutes)"
  printf '%s\n' "$floors" > .venv-floor/floors.txt
  quiet .venv-floor/bin/python -m pip install -q -r .venv-floor/floors.txt
  echo "$want" > "$stamp"
fi
# the DeepSpeed CPU op, built for this torch (its own extensions dir: another torch needs another build)
export TORCH_EXTENSIONS_DIR="$ROOT/.venv-floor/torch_extensions"
if [ ! -f "$TORCH_EXTENSIONS_DIR/.shm_op_built" ] && .venv-floor/bin/python -c 'import sys, torch; sys.exit(torch.cuda.is_available())'; then
  echo "[setup-floor] building DeepSpeed's CPU communication op for torch $(.venv-floor/bin/python -c 'import torch; print(torch.__version__)') once"
  .venv-floor/bin/python -c 'from deepspeed.comm.torch import build_shm_op; build_shm_op()' 2>&1 | { grep -v "real_accelerator" || true; }
  mkdir -p "$TORCH_EXTENSIONS_DIR" && touch "$TORCH_EXTENSIONS_DIR/.shm_op_built"
fi
