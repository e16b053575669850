"""CPU-only shortcuts that read a tensor's values on the host. Each returns its no-shortcut answer on any other
device without reading the tensor, so a GPU step never waits for the device here (tests/test_host_syncs.py counts
every other read)."""

from __future__ import annotations

import torch


def cpu_all(t: torch.Tensor) -> bool:
    """``bool(t.all())`` for a CPU tensor; False on any other device, without reading it."""
    return t.device.type == "cpu" and bool(t.all())
