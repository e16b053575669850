"""CPU-only shortcuts that read a tensor's values on the host. Each returns its no-shortcut answer on any other
device without reading the tensor, so a GPU step never waits for the device here (tests/test_host_syncs.py counts
every other read), and under torch.compile, where reading a value would break the graph (tests/test_compile.py).

:func:`takes_cpu_path` is the one question every CPU-only branch of the kernels asks (the fold of tiles into SDPA's
batch, the split plan, the host reads here), so benchmarks/support/cuda_emulation.py can send CPU tensors down the
branches a CUDA device takes by replacing this one function (in every module that imported it)."""

from __future__ import annotations

import torch


def takes_cpu_path(where: torch.Tensor | torch.device | str) -> bool:
    """Whether a tensor (or a device) takes the CPU-only branches; False on CUDA and every other device."""
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    return device.type == "cpu"


def cpu_all(t: torch.Tensor) -> bool:
    """``bool(t.all())`` for a CPU tensor in eager mode; False on any other device and while torch.compile traces,
    without reading it."""
    return takes_cpu_path(t) and not torch.compiler.is_compiling() and bool(t.all())
