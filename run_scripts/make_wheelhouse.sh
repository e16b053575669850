#!/usr/bin/env bash
# A folder of wheels from which `WHEELHOUSE=DIR bash run_scripts/setup_env.sh` installs with no network (an
# air-gapped node). Run it on a machine with internet; copy OUT next to the checkout on the node.
#
#   bash run_scripts/make_wheelhouse.sh [--python 3.12] [--platform manylinux_2_28_x86_64] [--skip-present FREEZE]
#                                       [--no-dev] [OUT]
#
# Every requirement of requirements.txt and their dependencies, one version each, as wheels for that Python and
# platform (default: this machine's), except torch and its CUDA libraries (nvidia-*, cuda-*, triton): the node's
# torch is used (setup_env.sh TORCH=system). DeepSpeed has no wheel on PyPI: it is built here with DS_BUILD_OPS=0
# (pure Python; its ops are JIT-compiled on the node when used). With --skip-present FREEZE (a `pip list
# --format=freeze` of the node; bare names count as present at any version), what the node has in our supported
# range is left out and the rest is resolved against the node's versions: that keeps it small (the shipped
# run_scripts/images/torch2.11-cuda13-py3.12.freeze.txt, this project's GPU test image: 58 MiB, 48 MiB with --no-dev,
# most of it blingfire's 42 MB wheel). --no-dev leaves out what only tests and lint need (`# dev` in
# requirements.txt: ruff, pytest); setup_env.sh then skips those, saying so.
# OUT defaults to wheelhouse/ (git-ignored). Prints the size and a MANIFEST.txt of what is in it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
pyver="" platform="" present="" out="" nodev=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) pyver="$2"; shift 2 ;;
    --platform) platform="$2"; shift 2 ;;
    --no-dev) nodev="--no-dev"; shift ;;
    --skip-present) present="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | grep '^#'; exit 0 ;;
    -*) echo "make_wheelhouse.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done
[ -z "$present" ] || [ -f "$present" ] || { echo "make_wheelhouse.sh: --skip-present $present: no such file" >&2; exit 2; }
out="${out:-$ROOT/wheelhouse}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
pyver_of() { "$1" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null; }
pyver="${pyver:-$(pyver_of "$PY")}"
# pip checks some Requires-Python against the interpreter it runs under (numpy 2.5 needs 3.12), so resolve with a
# python of the target version when there is one (PYTHON=... to choose it)
if [ "$(pyver_of "$PY")" != "$pyver" ]; then
  for cand in "python$pyver" "$(PYENV_VERSION="$(pyenv versions --bare 2>/dev/null | grep -E "^$pyver(\.|$)" | tail -1)" \
      pyenv which "python$pyver" 2>/dev/null || true)"; do
    if [ -n "$cand" ] && [ "$(pyver_of "$cand")" = "$pyver" ]; then PY="$cand"; break; fi
  done
  [ "$(pyver_of "$PY")" = "$pyver" ] || echo "[wheelhouse] warning: no python$pyver here; resolving with $PY" \
    "($(pyver_of "$PY")): pip may refuse a package for that python's version (set PYTHON=/path/to/python$pyver)"
fi
target=(--python-version "$pyver" --implementation cp --only-binary=:all:)
# pip takes --platform literally: manylinux_2_28 must list the older glibc tags it also runs (ruff ships 2_17)
if [[ "$platform" =~ ^manylinux_2_([0-9]+)_(.+)$ ]]; then
  for ((m = BASH_REMATCH[1]; m >= 5; m--)); do target+=(--platform "manylinux_2_${m}_${BASH_REMATCH[2]}"); done
  target+=(--platform "manylinux2014_${BASH_REMATCH[2]}" --platform "manylinux2010_${BASH_REMATCH[2]}" \
    --platform "manylinux1_${BASH_REMATCH[2]}")
elif [ -n "$platform" ]; then
  target+=(--platform "$platform")
fi
# (pip's warnings about this machine's empty local indexes are filtered; real errors still fail)
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; return "${PIPESTATUS[0]}"; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "[wheelhouse] python $pyver${nodev:+ (no dev requirements)} (pip of $PY), platform ${platform:-this machine}, into $out"
rm -f "$out"/*.whl "$out/MANIFEST.txt"
# 1. what to fetch: every requirement but torch, or (--skip-present) what the node lacks or has too old
if [ -n "$present" ]; then
  "$PY" "$ROOT/run_scripts/reqs.py" plan $nodev --present "$present" --out-dir "$tmp/plan" | sed 's/^\[setup\]/[wheelhouse] node:/'
  cp "$tmp/plan/install.txt" "$tmp/want.txt"
  cp "$tmp/plan/constraints.txt" "$tmp/constraints.txt"   # the node's versions of everything it has
else
  "$PY" "$ROOT/run_scripts/reqs.py" pins $nodev | grep -v -E '^torch==' > "$tmp/want.txt"
  "$PY" "$ROOT/run_scripts/reqs.py" pins | grep -E '^torch==' > "$tmp/constraints.txt"   # resolve against our torch
fi

# 2. DeepSpeed as a wheel (PyPI has only its sdist); pure Python with no op prebuilt
mkdir -p "$tmp/built"
ds="$(grep -E '^deepspeed==' "$tmp/want.txt" || true)"
if [ -n "$ds" ]; then
  echo "[wheelhouse] building $ds as a wheel (DS_BUILD_OPS=0)"
  DS_BUILD_OPS=0 quiet "$PY" -m pip wheel -q --no-deps "$ds" -w "$tmp/built"
fi

# 3. resolve the whole set for the target (nothing installed), then drop torch's family and what the node has
quiet "$PY" -m pip install -q --dry-run --ignore-installed --target "$tmp/t" "${target[@]}" --find-links "$tmp/built" \
  --report "$tmp/report.json" -r "$tmp/want.txt" -c "$tmp/constraints.txt"
"$PY" - "$tmp/report.json" "${present:-}" > "$tmp/fetch.txt" <<'EOF'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
family = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|pytorch-triton.*)$")
present = {}
if len(sys.argv) > 2 and sys.argv[2]:
    for line in open(sys.argv[2]):
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            present[norm(name)] = ver or None
for item in json.load(open(sys.argv[1]))["install"]:
    name, ver = item["metadata"]["name"], item["metadata"]["version"]
    n = norm(name)
    if family.match(n) or (n in present and present[n] in (None, ver)):
        continue
    print(f"{name}=={ver}")
EOF
sort -f -o "$tmp/fetch.txt" "$tmp/fetch.txt"
echo "[wheelhouse] $(wc -l < "$tmp/fetch.txt") packages to fetch"

# 4. fetch exactly those (one version each), DeepSpeed from the wheel built above
quiet "$PY" -m pip download -q --no-deps "${target[@]}" --find-links "$tmp/built" -d "$out" -r "$tmp/fetch.txt"
{
  echo "# wheelhouse for python $pyver, platform ${platform:-$(uname -m) (this machine)}; made $(date -u +%FT%TZ) from $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# skip-present: ${present:-none}; ${nodev:-with dev requirements}; excluded always: torch, triton, nvidia-*, cuda-*"
  cat "$tmp/fetch.txt"
} > "$out/MANIFEST.txt"
n_whl="$(find "$out" -maxdepth 1 -name '*.whl' | wc -l)"
n_want="$(wc -l < "$tmp/fetch.txt")"
[ "$n_whl" -eq "$n_want" ] || { echo "[wheelhouse] error: $n_whl wheels in $out for $n_want packages" >&2; exit 1; }
echo "[wheelhouse] $n_whl wheels, $(du -sh "$out" | cut -f1) ($(du -sb "$out" | cut -f1) bytes) in $out"
