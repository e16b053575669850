"""Device and mixed-precision choice for the tools that run a model outside DeepSpeed (fine-tuning, fill-mask).

``--device`` defaults to the GPU when there is one; ``--precision auto`` picks bf16 autocast on GPUs with bf16
hardware (compute capability 8.0+), fp16 autocast with a gradient scaler on older GPUs, fp32 on CPU. Impossible
combinations are refused with the flag named.
"""

from __future__ import annotations

import torch

from common.errors import UserError

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class DeviceError(UserError, ValueError):
    """A --device / --precision that cannot run here; the message names the flag."""


def resolve_device(device: str | None) -> torch.device:
    """``None`` -> cuda if available else cpu; 'cuda' without a GPU is refused."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise DeviceError(f"--device {device}: not a device name ({e}); use cpu or cuda[:N]") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {device}: no CUDA GPU is available here; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type != "cpu":
        raise DeviceError(f"--device {device}: use cpu or cuda[:N]")
    return dev


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None: plain fp32) for ``precision`` on ``device``."""
    if precision not in PRECISIONS:
        raise DeviceError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if device.type != "cuda":
        if precision == "auto":
            return None
        return _DTYPES[precision]  # CPU autocast runs bf16 and fp16 (slowly without hardware support)
    major, minor = torch.cuda.get_device_capability(device)
    if precision == "auto":
        return torch.bfloat16 if major >= 8 else torch.float16
    if precision == "bf16" and major < 8:
        raise DeviceError(
            f"--precision bf16: {torch.cuda.get_device_name(device)} (compute capability "
            f"{major}.{minor}) has no bf16 hardware; use fp16 or fp32"
        )
    return _DTYPES[precision]


def precision_name(dtype: torch.dtype | None) -> str:
    return {None: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
