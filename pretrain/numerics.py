"""Process-wide numeric settings, applied once before the model exists: TF32 and deterministic algorithms.

TF32: on Ampere and later GPUs, fp32 matmuls and convolutions may run on tensor cores with a 10-bit mantissa
(about 8x faster on A100/H100); torch leaves this off for matmuls. The `_fp32` ds_configs get it unless `--no-tf32`;
fp16/bf16 runs do their matmuls in half precision anyway.

Determinism (`--deterministic`): torch's deterministic algorithms (index_add_ in block_gather's backward, SDPA's
backward, scatter/gather choose their deterministic kernels; an op without one warns, naming itself), cuDNN
deterministic with autotuning off, and cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8, which must be set
before the first cuBLAS call). Without it, a resumed run on CUDA equals a straight run up to the order of floating
point reductions (bitwise on CPU, where these kernels are deterministic already).
"""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"


def configure_numerics(deterministic: bool, tf32: bool) -> list[str]:
    """Apply the settings; returns lines saying what was set (printed by rank 0)."""
    notes = []
    if deterministic:
        have = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        if have not in (None, CUBLAS_WORKSPACE, ":16:8"):
            notes.append(f"--deterministic: keeping CUBLAS_WORKSPACE_CONFIG={have} from the environment")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        notes.append(
            "--deterministic: torch deterministic algorithms on, cuDNN deterministic, "
            f"CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}"
        )
    # One API only, the one every reader understands: the CUDA switches `allow_tf32` (torch keeps its newer
    # per-backend `fp32_precision` in step, and `torch.get_float32_matmul_precision()`, which inductor calls, keeps
    # working; setting only the new per-backend value made that getter raise). CPU matmul precision stays untouched.
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if torch.cuda.is_available() and tf32 and torch.cuda.get_device_capability()[0] >= 8:
        notes.append("TF32 tensor cores on for fp32 matmuls and convolutions (--no-tf32 for IEEE fp32)")
    return notes
