#!/usr/bin/env python3
"""Which PyTorch build this machine needs, from the GPUs and the driver `nvidia-smi` reports (run by setup_env.sh
with the system python, before the virtualenv exists; standard library only).

Two facts decide it:
- architecture: torch 2.11+ dropped Volta (compute capability 7.0) from its CUDA 12.8 and 13.x builds, and the
  default torch wheel on PyPI is a CUDA 13 build: on a V100 its first CUDA op fails with "no kernel image is
  available". PyTorch's CUDA 12.6 ("legacy") builds, on its own wheel index, still carry sm_70.
- driver: a CUDA build runs on a driver of at least its major version's minimum (NVIDIA's CUDA compatibility
  guide, "Minor Version Compatibility", table 1): CUDA 13.x needs >= 580, CUDA 12.x >= 525.60.13 (the driver
  CUDA 12.6 shipped with is 560.28.03; from 525.60.13 up, minor-version compatibility runs 12.6 programs, which is
  what PyTorch's wheels rely on). On an older driver torch.cuda.is_available() is False: every GPU test skips.

So:

    no GPU / no nvidia-smi                         -> default  requirements.txt as it is (CPU machines: the CPU wheel)
    GPUs at 7.5 or newer, driver >= 580            -> default  PyPI's CUDA 13 build
    any GPU older than 7.5 (V100), driver >= 525.60.13 -> cu126 torch==<pinned version> from $TORCH_INDEX_URL
    every GPU at 7.5+, 525.60.13 <= driver < 580   -> cu126    (default https://download.pytorch.org/whl/cu126)
    driver < 525.60.13                             -> error: no build runs; update the driver (exit 2)

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
VARIANT_CUDA_MAJOR = {"default": 13, "cu126": 12}
"""The CUDA major version of each build (PyPI's torch 2.11+ wheels are CUDA 13 builds)."""
CUDA_DRIVER_MIN = {13: (580,), 12: (525, 60, 13), 11: (450, 80, 2)}
"""Oldest Linux driver that runs a CUDA major version's programs (NVIDIA's minor-version compatibility table)."""


def driver_tuple(version: str) -> tuple[int, ...] | None:
    """'580.159.04' -> (580, 159, 4); None when it is not a driver version."""
    if not re.fullmatch(r"\d+(\.\d+)*", version.strip()):
        return None
    return tuple(int(x) for x in version.strip().split("."))


def driver_runs_cuda(driver: str, cuda_major: int) -> bool:
    """Whether a driver of this version runs programs built with CUDA ``cuda_major``.x."""
    have = driver_tuple(driver)
    need = CUDA_DRIVER_MIN.get(cuda_major)
    return bool(have and need and have >= need)


def _smi(nvidia_smi: str, field: str) -> list[str] | None:
    try:
        out = subprocess.run(
            [nvidia_smi, f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def compute_capabilities(nvidia_smi: str = "nvidia-smi") -> list[tuple[int, int]] | None:
    """Compute capability of every GPU, or None when nvidia-smi is missing or fails (no usable GPU)."""
    caps = []
    for line in _smi(nvidia_smi, "compute_cap") or []:
        m = re.fullmatch(r"(\d+)\.(\d+)", line)
        if m:
            caps.append((int(m.group(1)), int(m.group(2))))
    return caps or None


def driver_version(nvidia_smi: str = "nvidia-smi") -> str | None:
    """The driver version nvidia-smi reports (None without nvidia-smi or GPUs). Queried on its own: drivers older
    than 510 do not know the compute_cap field, and that must not hide the driver."""
    lines = _smi(nvidia_smi, "driver_version")
    return lines[0] if lines and driver_tuple(lines[0]) else None


def _fmt(v: tuple[int, ...]) -> str:
    return ".".join(str(x) if i == 0 else f"{x:02d}" for i, x in enumerate(v))


def choose(caps: list[tuple[int, int]] | None, forced: str | None = None, driver: str | None = None) -> tuple[str, str]:
    """(variant, reason). Raises ValueError when no build runs on this driver (or TORCH_VARIANT is unknown)."""
    if forced:
        if forced not in VARIANTS:
            raise ValueError(f"TORCH_VARIANT={forced!r}: choose one of {', '.join(VARIANTS)}")
        return forced, f"TORCH_VARIANT={forced}"
    if not caps and not driver:
        return "default", "no NVIDIA GPU found (nvidia-smi missing or reports none)"
    cu13, cu12 = _fmt(CUDA_DRIVER_MIN[13]), _fmt(CUDA_DRIVER_MIN[12])
    if driver and not driver_runs_cuda(driver, 12):
        raise ValueError(
            f"NVIDIA driver {driver} is too old for every PyTorch build we install: the CUDA 13 build needs a driver "
            f">= {cu13}, the CUDA 12.6 build >= {cu12} (NVIDIA's CUDA compatibility table). Update the driver, or "
            "set TORCH_VARIANT=default|cu126 to install one anyway (its GPU tests will then skip)"
        )
    old = sorted({c for c in caps or [] if c < LEGACY_BELOW})
    if old:
        shown = ", ".join(f"{a}.{b}" for a, b in old)
        return "cu126", (
            f"GPU compute capability {shown} (Volta or older): only PyTorch's CUDA 12.6 builds "
            "still ship kernels for it"
        )
    shown = ", ".join(sorted({f"{a}.{b}" for a, b in caps or []})) or "unknown"
    if driver and not driver_runs_cuda(driver, VARIANT_CUDA_MAJOR["default"]):
        return "cu126", (
            f"driver {driver} is older than {cu13}, which PyPI's CUDA 13 build needs; PyTorch's CUDA 12.6 build "
            f"runs on >= {cu12} (GPU compute capability {shown})"
        )
    where = f"driver {driver}" if driver else "driver version unknown"
    return "default", f"GPU compute capability {shown}, {where}: PyPI's default CUDA 13 build runs it"


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
        variant, why = choose(compute_capabilities(), os.environ.get("TORCH_VARIANT") or None, driver_version())
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
