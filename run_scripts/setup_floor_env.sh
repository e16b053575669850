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
# The venv lives in a cache outside the checkout (a few GB: PyPI's torch brings its CUDA libraries), so fresh clones
# (CI's) reuse it; .venv-floor in the checkout is a link to it. SPARSE_BERT_CACHE moves the cache.
cache="${SPARSE_BERT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sparse-bert}"
venv="$cache/venv-floor-py$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
mkdir -p "$cache"
if [ -e .venv-floor ] && [ ! -L .venv-floor ]; then
  echo "[setup-floor] .venv-floor is a directory from an older set-up: moving it to $venv"
  [ -e "$venv" ] || mv .venv-floor "$venv"
  rm -rf .venv-floor
fi
[ -L .venv-floor ] && [ "$(readlink .venv-floor)" = "$venv" ] || ln -sfn "$venv" .venv-floor
floors="$("$PY" run_scripts/reqs.py floors)"
want="$(printf '%s\n' "$floors" | sha256sum | cut -d' ' -f1)"
stamp="$venv/.floors.sha256"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  echo "[setup-floor] pip install into $venv: $(printf '%s ' $floors)(first time: a few minutes)"
  printf '%s\n' "$floors" > "$venv/floors.txt"
  quiet "$venv/bin/python" -m pip install -q -r "$venv/floors.txt"
  cpu_extras="$("$venv/bin/python" run_scripts/reqs.py cpu-torch --floor)"   # triton beside a CPU torch only
  if [ -n "$cpu_extras" ]; then
    echo "[setup-floor] pip install $cpu_extras (CPU torch: tests/test_triton_block.py interprets our Triton kernel)"
    quiet "$venv/bin/python" -m pip install -q $cpu_extras
  fi
  echo "$want" > "$stamp"
fi
# a venv moved here (an older set-up's .venv-floor, a cache seeded from another checkout) keeps its old path in its
# console scripts' #! lines, and `deepspeed`/`torchrun` then fail with "No such file or directory": point them here
for f in "$venv"/bin/*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  first="$(head -n 1 "$f" 2>/dev/null | tr -d '\0' || true)"
  case "$first" in
    "#!$venv/bin/python"*) ;;
    '#!'/*/bin/python*) sed -i "1s|^#!.*/bin/\(python[0-9.]*\)\$|#!$venv/bin/\1|" "$f" ;;
  esac
done
# the DeepSpeed CPU op, built for this torch (its own extensions dir: another torch needs another build)
export TORCH_EXTENSIONS_DIR="$venv/torch_extensions"  # one build for every checkout
if [ ! -f "$TORCH_EXTENSIONS_DIR/.shm_op_built" ] && "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.cuda.is_available())'; then
  echo "[setup-floor] building DeepSpeed's CPU communication op for torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') once"
  "$venv/bin/python" -c 'from deepspeed.comm.torch import build_shm_op; build_shm_op()' 2>&1 | { grep -v "real_accelerator" || true; }
  mkdir -p "$TORCH_EXTENSIONS_DIR" && touch "$TORCH_EXTENSIONS_DIR/.shm_op_built"
fi
