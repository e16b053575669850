#!/usr/bin/env python3
"""Which PyTorch build this machine needs, from the GPUs `nvidia-smi` reports (run by setup_env.sh with the system
python, before the virtualenv exists; standard library only).

torch 2.11+ dropped Volta (compute capability 7.0) from its CUDA 12.8 and 13.x builds, and the default torch wheel
on PyPI is a CUDA 13 build: on a V100 its first CUDA op fails with "no kernel image is available". PyTorch's CUDA
12.6 ("legacy") builds, on its own wheel index, still carry sm_70. So:

    no GPU / no nvidia-smi        -> default   requirements.txt as it is (CPU machines: the CPU wheel)
    every GPU at 7.5 or newer      -> default   PyPI's CUDA build
    any GPU older than 7.5 (V100)  -> cu126     torch==<pinned version> from $TORCH_INDEX_URL
                                                (default https://download.pytorch.org/whl/cu126), then the rest

TORCH_VARIANT=default|cu126 forces a choice (e.g. to prepare an image on a machine without GPUs).

    python3 run_scripts/torch_variant.py                       # prints the variant
    python3 run_scripts/torch_variant.py --pip-args            # prints the pip arguments installing torch (if any)
    python3 run_scripts/torch_variant.py --explain             # the variant and why
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

VARIANTS = ("default", "cu126")
DEFAULT_INDEX = {"cu126": "https://download.pytorch.org/whl/cu126"}
LEGACY_BELOW = (7, 5)  # compute capabilities below this need the legacy CUDA 12.6 build


def compute_capabilities(nvidia_smi: str = "nvidia-smi") -> list[tuple[int, int]] | None:
    """Compute capability of every GPU, or None when nvidia-smi is missing or fails (no usable GPU)."""
    try:
        out = subprocess.run(
            [nvidia_smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    caps = []
    for line in out.stdout.split():
        m = re.fullmatch(r"(\d+)\.(\d+)", line.strip())
        if m:
            caps.append((int(m.group(1)), int(m.group(2))))
    return caps or None


def choose(caps: list[tuple[int, int]] | None, forced: str | None = None) -> tuple[str, str]:
    """(variant, reason)."""
    if forced:
        if forced not in VARIANTS:
            raise ValueError(f"TORCH_VARIANT={forced!r}: choose one of {', '.join(VARIANTS)}")
        return forced, f"TORCH_VARIANT={forced}"
    if not caps:
        return "default", "no NVIDIA GPU found (nvidia-smi missing or reports none)"
    old = sorted({c for c in caps if c < LEGACY_BELOW})
    if old:
        shown = ", ".join(f"{a}.{b}" for a, b in old)
        return "cu126", (
            f"GPU compute capability {shown} (Volta or older): only PyTorch's CUDA 12.6 builds "
            "still ship kernels for it"
        )
    shown = ", ".join(sorted({f"{a}.{b}" for a, b in caps}))
    return "default", f"GPU compute capability {shown}: PyPI's default CUDA build runs it"


def pinned_torch(requirements: Path) -> str:
    """The `torch==X` pin of requirements.txt (the legacy build must be the same version)."""
    for line in requirements.read_text().splitlines():
        m = re.match(r"\s*torch\s*==\s*([^\s;#]+)", line)
        if m:
            return m.group(1)
    raise ValueError(f"{requirements}: no `torch==VERSION` pin to install the legacy build at")


def pip_args(variant: str, torch_version: str, index_url: str | None = None) -> list[str]:
    """Arguments to `pip install` that put the variant's torch in place before requirements.txt ([] = none)."""
    if variant == "default":
        return []
    return [f"torch=={torch_version}", "--index-url", index_url or DEFAULT_INDEX[variant]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pip-args", action="store_true", help="print the pip arguments for torch (nothing if none)")
    p.add_argument("--explain", action="store_true", help="print the variant and the reason")
    p.add_argument("--requirements", default=str(Path(__file__).resolve().parents[1] / "requirements.txt"))
    ns = p.parse_args(argv)
    try:
        variant, why = choose(compute_capabilities(), os.environ.get("TORCH_VARIANT") or None)
        if ns.pip_args:
            print(
                " ".join(
                    pip_args(variant, pinned_torch(Path(ns.requirements)), os.environ.get("TORCH_INDEX_URL") or None)
                )
            )
        elif ns.explain:
            print(f"{variant}: {why}")
        else:
            print(variant)
    except ValueError as e:
        print(f"torch_variant: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
