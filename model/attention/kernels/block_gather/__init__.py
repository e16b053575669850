"""``block_gather``: pure PyTorch block-sparse attention that computes only the blocks a layout names.

Compute and score memory scale with the layout's density; autograd works on every device (index_select's backward
is index_add). The kernel only picks a plan, and each plan runs itself. Plans, most specific first:

- :mod:`.permutation`: every query tile attends exactly one aligned key tile (BlockBERT): views, no gathers;
- :mod:`.cpu_split` (a CPU optimisation, ``SPARSEBERT_CPU_SPLIT=0`` turns it off): key blocks shared by all rows and a
  diagonal window computed once each with torch's CPU flash kernel, merged by logsumexp, when its estimated cost is
  lower;
- :mod:`.gather`: any layout, gathered key tiles grouped by key count.
"""

from __future__ import annotations

import torch

from model.attention.kernels.block_gather.cpu_split import SplitPlan, cpu_split_enabled, make_split_plan
from model.attention.kernels.block_gather.gather import GatherGroup, GatherPlan, make_gather_plan
from model.attention.kernels.block_gather.permutation import PermutationPlan, make_permutation_plan
from model.attention.kernels.block_gather.tiles import query_tile_factor
from model.attention.kernels.dense import DensePlan
from model.attention.kernels.registry import Kernel, register_kernel
from model.cpu_shortcuts import takes_cpu_path

__all__ = [
    "BlockGatherKernel",
    "GatherGroup",
    "GatherPlan",
    "PermutationPlan",
    "SplitPlan",
    "make_gather_plan",
    "query_tile_factor",
]


@register_kernel("block_gather")
class BlockGatherKernel(Kernel):
    """Gathers only the key/value blocks each query tile attends; see the package docstring for its plans."""

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None, family=None):
        if layout_HMM is None:
            if token_mask is None:  # full attention: nothing to skip
                return DensePlan(None)
            layout_HMM = torch.ones(token_mask.shape[0], 1, 1, dtype=torch.bool)
            block = seq_len
        lay = layout_HMM.cpu().bool()
        fast = make_permutation_plan(lay, query_tile_factor(lay), block, seq_len, device, token_mask)
        if fast is not None:  # one key tile per query tile (BlockBERT): views instead of gathers
            return fast
        if takes_cpu_path(device) and cpu_split_enabled():
            split = make_split_plan(lay, block, seq_len, device, token_mask)
            if split is not None:
                return split
        return make_gather_plan(lay, block, seq_len, device, token_mask)
