"""TFLOP/s per GPU and model FLOPs utilisation (MFU): the GPUs' dense tensor-core peaks and the arithmetic the
trainer's log and the benchmarks share. FLOPs are counted by :mod:`model.flops`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("V100-PCIE", 112.0),
    ("V100S", 130.0),
    ("V100", 125.0),
)
"""Dense (no structured sparsity) fp16/bf16 tensor-core peak in TFLOP/s by a substring of the device name, first
match wins (NVIDIA's data sheets; "H100" alone is the SXM part). --peak-tflops overrides; a device not listed has no
MFU."""


def peak_tflops(name: str) -> float | None:
    """Dense fp16/bf16 tensor-core peak of a GPU by its name (None when unknown)."""
    for key, value in PEAK_TFLOPS:
        if key in name:
            return value
    return None


def device_peak_tflops(device: torch.device, precision: str, override: float | None) -> tuple[float | None, str]:
    """(peak TFLOP/s or None, where it comes from) for MFU on ``device`` training in ``precision``: the override,
    else the table's fp16/bf16 peak of a CUDA device (none for fp32 training: its peak is not the tensor cores')."""
    if override is not None:
        return override, "--peak-tflops"
    if device.type != "cuda":
        return None, f"no peak known for device {device.type!r} (give --peak-tflops)"
    name = torch.cuda.get_device_name(device)
    if precision not in ("fp16", "bf16"):
        return None, f"{precision} training: the table's peaks are fp16/bf16 tensor-core ones (give --peak-tflops)"
    peak = peak_tflops(name)
    return peak, (f"{name}'s dense {precision} peak" if peak else f"{name} is not in the peak table (--peak-tflops)")


@dataclass(frozen=True)
class Throughput:
    """Converts a window's real tokens per second (all ranks together) to TFLOP/s per GPU and MFU."""

    flops_per_token: float
    """Model FLOPs per real token (model.flops)."""
    world_size: int
    """GPUs (ranks) the tokens were trained on."""
    peak_tflops: float | None
    """Per-GPU peak; None leaves MFU out."""

    def tflops_per_gpu(self, tokens_per_s: float) -> float:
        return self.flops_per_token * tokens_per_s / self.world_size / 1e12

    def mfu(self, tokens_per_s: float) -> float | None:
        return None if not self.peak_tflops else self.tflops_per_gpu(tokens_per_s) / self.peak_tflops
