"""Test parametrisations derived from the registries: a new kernel is compared with ``dense`` by every parity test,
and a new layout family needs one entry in :data:`LAYOUT_EXAMPLES` (a test fails until it has one)."""

from __future__ import annotations

from typing import Callable

import torch

from model import attention as A
from model.attention.kernels import KERNELS
from model.attention.layouts import BLOCK_LAYOUTS, SparsityConfig

REFERENCE = "dense"
"""The kernel every other kernel is tested against."""
ALL_KERNELS = sorted(k for k in KERNELS if KERNELS[k].runs_on_cpu)
"""Every registered kernel that runs on CPU, the reference included (the CPU parity tests' list)."""
OTHER_KERNELS = sorted(k for k in ALL_KERNELS if k != REFERENCE)
"""Every CPU kernel tested against the reference on CPU."""
CUDA_KERNELS = sorted(k for k in KERNELS if k != REFERENCE)
"""Every kernel tested against the reference on a CUDA GPU (GPU-only kernels included)."""
CPU_TRAINING_KERNELS = sorted(k for k in OTHER_KERNELS if KERNELS[k].trains_on_cpu)
"""Kernels with a CPU backward: output and q/k/v-gradient parity on CPU; the others get inference parity."""


def cpu_trains(kernel: str) -> bool:
    return KERNELS[kernel].trains_on_cpu


LAYOUT_EXAMPLES: dict[str, Callable[[int], SparsityConfig]] = {
    "dense": lambda H: A.DenseSparsityConfig(H, block=16),
    "fixed": lambda H: A.FixedSparsityConfig(
        H,
        block=16,
        different_layout_per_head=True,
        num_local_blocks=2,
        num_global_blocks=1,
        num_different_global_patterns=2,
    ),
    "fixed_uni_horizontal": lambda H: A.FixedSparsityConfig(
        H, block=16, num_local_blocks=4, attention="unidirectional"
    ),
    "variable_random": lambda H: A.VariableSparsityConfig(
        H,
        block=16,
        different_layout_per_head=True,
        num_random_blocks=1,
        local_window_blocks=[1, 2],
        global_block_indices=[3],
        seed=5,
    ),
    "bigbird": lambda H: A.BigBirdSparsityConfig(H, block=16, different_layout_per_head=True, seed=1),
    "bslongformer": lambda H: A.BSLongformerSparsityConfig(H, block=16, global_block_indices=[2]),
    "local_uni": lambda H: A.LocalSlidingWindowSparsityConfig(H, block=16),
    "local_bi": lambda H: A.LocalSlidingWindowSparsityConfig(
        H, block=16, num_sliding_window_blocks=3, attention="bidirectional"
    ),
    "dilated_local": lambda H: A.DilatedSlidingWindowSparsityConfig(
        H, block=16, num_sliding_window_blocks=3, dilation=2
    ),
    "blockbert_n2": lambda H: A.BlockBERTSparsityConfig(H, num_blocks=2, head_assignment="3:1", block=16),
    "blockbert_n3": lambda H: A.BlockBERTSparsityConfig(H, num_blocks=3, head_assignment="2:1:1", block=16),
}
"""Layouts the kernel parity tests run (4-head examples at block 16, N <= 256): at least one per registered mode."""


def missing_layout_examples(num_heads: int = 4) -> list[str]:
    """Registered modes without an entry in :data:`LAYOUT_EXAMPLES`."""
    covered = {make(num_heads).mode for make in LAYOUT_EXAMPLES.values()}
    return sorted(set(BLOCK_LAYOUTS) - covered)


def upstream_grad(out: torch.Tensor, seed: int = 9) -> torch.Tensor:
    """The gradient fed into ``out``'s backward: drawn in fp32 on a CPU generator, then moved to ``out``'s device and
    dtype, so a kernel in fp16/bf16 on CUDA gets the same draws as its fp32 reference. (``randn_like`` with a
    generator needs one on ``out``'s device, and CUDA's draws differ between dtypes: the first GPU run found both,
    docs/gpu_results.md.)"""
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
