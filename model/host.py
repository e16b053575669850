"""CPU-only shortcuts that read a tensor's values on the host. Each returns its no-shortcut answer on any other
device without reading the tensor, so a GPU step never waits for the device here (tests/test_host_syncs.py counts
every other read), and under torch.compile, where reading a value would break the graph (tests/test_compile.py)."""

from __future__ import annotations

import torch


def cpu_all(t: torch.Tensor) -> bool:
    """``bool(t.all())`` for a CPU tensor in eager mode; False on any other device and while torch.compile traces,
    without reading it."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling() and bool(t.all())
