"""``triton_block``: our own block-sparse FlashAttention kernel in Triton (FlashAttention-2 structure over the tiles
the layout names; :mod:`.tl_kernels`), for CUDA GPUs, and on CPU only under Triton's interpreter
(``TRITON_INTERPRET=1``, set before Triton is imported; tests/test_triton_block.py).

It takes key padding, packed documents (``doc_ids_BN``), a fixed sliding window (a :class:`BandMask`: ModernBERT's
local layers), attention dropout (Philox, reproducible under ``torch.manual_seed``) and the score scale inside the
kernel. Another fixed token mask (a SparseBERT pattern) is not in this kernel: such a layer is routed once, when its
plan is made, to the kernel ``auto``'s rule picks for it (:class:`RoutedPlan`; its start-up line says which).
Per-call token masks and DIET score biases run ``block_gather``'s plan instead, said once by a warning (never
ignored silently). Sparsity is data: per head and query tile the key tiles to visit (CSR, :mod:`.tables`), built
once per plan."""

from __future__ import annotations

import importlib.util
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from model.attention.band import BandMask
from model.attention.kernels.auto import AutoKernel, AutoPlan
from model.attention.kernels.registry import Call, Kernel, register_kernel
from model.attention.kernels.triton_block.tables import TileTables, build_tables
from model.cpu_shortcuts import takes_cpu_path

__all__ = ["RoutedPlan", "TritonBlockKernel", "TritonBlockPlan", "TileConfig", "tile_config"]


@dataclass(frozen=True)
class TileConfig:
    """Launch parameters of one head size."""

    block_d: int
    """Head size rounded up to a power of two (at least 16: ``tl.dot``'s minimum)."""
    num_warps: int
    num_stages: int


def tile_config(head_size: int, dtype: torch.dtype = torch.bfloat16) -> TileConfig:
    """The fixed launch table (sm80/sm90): 64 x 64 tiles; 4 warps up to head size 64, 8 above; 2 pipeline stages in
    fp16/bf16 up to head size 64, else 1 (fp32's three-product dots already take ~100-165 KB of shared memory)."""
    block_d = max(16, 1 << (head_size - 1).bit_length())
    stages = 2 if block_d <= 64 and dtype != torch.float32 else 1
    return TileConfig(block_d, 4 if block_d <= 64 else 8, stages)


TILE = 64
"""Query and key tile size on the GPU (a multiple of the usual 64-token layout blocks; smaller blocks are grouped)."""


def triton_available() -> str | None:
    """None when Triton can run here, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (a CUDA torch brings its own; CPU tests need `triton` from requirements.txt)"
    return None


def interpreting() -> bool:
    """Whether the Triton programs run in Triton's interpreter (on CPU tensors): decided when they are first imported,
    by ``TRITON_INTERPRET=1`` in the environment then (tests/conftest.py sets it on a machine without a GPU)."""
    from model.attention.kernels.triton_block.function import programs

    return programs().INTERPRETED


@dataclass
class TritonBlockPlan:
    """The layout as device data (CSR tile tables, the block layout for partial tiles) plus the fallback for calls
    with per-call token masks or score biases."""

    tables: TileTables
    layout_u8: torch.Tensor
    """uint8 ``[Hl, M, M]``: the block layout on the device (partial tiles look their elements' blocks up here)."""
    block: int
    m_blocks: int
    head_stride: int
    """1: one layout per head; 0: one layout shared by every head."""
    seq_len: int
    tile_m: int
    tile_n: int
    no_seed: torch.Tensor
    fallback_args: tuple
    """``make_plan`` arguments for ``block_gather`` (token masks, score biases)."""
    band_radius: int = -1
    """A fixed sliding window ``|i - j| <= band_radius`` (ModernBERT's local layers), checked in partial tiles; -1:
    none."""
    band_len: int = 0
    """The window's length: tokens from here on attend nothing (the plan's N may be padded past it)."""
    _fallback: Any = field(default=None, repr=False)
    _warned: bool = field(default=False, repr=False)

    @property
    def tq(self) -> int:
        return -(-self.seq_len // self.tile_m)

    @property
    def tk(self) -> int:
        return -(-self.seq_len // self.tile_n)

    launch: tuple[int, int] | None = None
    """(num_warps, num_stages) instead of :func:`tile_config`'s (`benchmarks.attention --measure tiles` sweeps them)."""

    def config(self, head_size: int, dtype: torch.dtype) -> TileConfig:
        cfg = tile_config(head_size, dtype)
        return cfg if self.launch is None else TileConfig(cfg.block_d, *self.launch)

    def fallback(self, why: str):
        if not self._warned:
            warnings.warn(
                f"--attention-kernel triton_block has no {why}: these calls run block_gather's plan "
                "(block_gather and dense take token masks and score biases)",
                stacklevel=3,
            )
            self._warned = True
        if self._fallback is None:
            from model.attention.kernels.registry import KERNELS

            self._fallback = KERNELS["block_gather"].make_plan(*self.fallback_args)
        return self._fallback

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        kpm, token_mask, score_bias, dropout_p, scale = call
        if token_mask is not None or score_bias is not None:
            why = "score bias (DIET)" if score_bias is not None else "token mask (SparseBERT pattern)"
            return self.fallback(why).run(q_BHND, k_BHND, v_BHND, call)
        if q_BHND.shape[2] != self.seq_len:
            raise ValueError(f"triton_block plan was made for N={self.seq_len}, called with N={q_BHND.shape[2]}")
        if takes_cpu_path(q_BHND) and not interpreting():
            raise RuntimeError(
                "--attention-kernel triton_block runs on CUDA GPUs; on CPU only under Triton's interpreter "
                "(TRITON_INTERPRET=1 before Triton is imported, for tests). Use block_gather or dense on CPU."
            )
        from model.attention.kernels.triton_block.function import TritonBlockAttention

        scale = q_BHND.shape[-1] ** -0.5 if scale is None else scale
        return TritonBlockAttention.apply(
            q_BHND, k_BHND, v_BHND, kpm, call.doc_ids_BN, self, float(dropout_p), float(scale)
        )


@dataclass
class RoutedPlan:
    """A layer with a fixed token mask (ModernBERT's sliding window, a SparseBERT pattern): the kernel has no element
    mask but the layout's, so the layer runs the kernel ``auto``'s rule picks for the mask (flex on CUDA sm80+ without
    attention dropout, else block_gather), chosen once per dtype (at ``build_plan``, else on the first call) and kept:
    no per-call fallback, no warning per call; :meth:`describe` is the start-up line that says so."""

    auto: AutoPlan

    def prepare(self, device: torch.device, dtype: torch.dtype, configured_dropout_p: float):
        plan = self.auto.prepare(device, dtype, configured_dropout_p)
        if self.auto.chosen[dtype] == "triton_block":  # family None: no table entry; the rule never picks it
            raise RuntimeError("triton_block's fixed-token-mask route chose triton_block itself (auto's rule changed?)")
        return plan

    @property
    def chosen(self) -> dict:
        """dtype -> the kernel this layer runs."""
        return self.auto.chosen

    def describe(self, dtype: torch.dtype) -> str | None:
        if dtype not in self.auto.chosen:
            return None
        return (
            f"attention kernel triton_block -> {self.auto.chosen[dtype]} for this layer's fixed token mask (not in "
            f"triton_block's kernel) at N={self.auto.seq_len}: {self.auto.reasons[dtype]}"
        )

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        return self.auto.run(q_BHND, k_BHND, v_BHND, call)


@register_kernel("triton_block")
class TritonBlockKernel(Kernel):
    """Block-sparse FlashAttention in Triton: visits only the layout's tiles, stores no scores (CUDA; on CPU only
    under ``TRITON_INTERPRET=1``)."""

    runs_on_cpu = False
    """Only under Triton's interpreter, which is slow: the generic CPU parity suites leave it out,
    tests/test_triton_block.py runs it interpreted and the CUDA suites on the GPU."""
    trains_on_cpu = False
    tile: int = TILE
    """Tile size of new plans (tests shrink it to exercise several tiles at N <= 128)."""
    tile_n: int | None = None
    """Key tile of new plans when it differs from ``tile`` (the query tile); `benchmarks.attention --measure tiles`."""
    launch: tuple[int, int] | None = None
    """(num_warps, num_stages) of new plans instead of :func:`tile_config`'s; `benchmarks.attention --measure tiles`."""

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None, family=None):
        device = torch.device(device)
        if token_mask is not None and not isinstance(token_mask, BandMask):  # routed once here (RoutedPlan)
            return RoutedPlan(AutoKernel().make_plan(layout_HMM, block, seq_len, device, token_mask, family=None))
        reason = triton_available()
        if reason is not None:
            raise RuntimeError(f"--attention-kernel triton_block: {reason}")
        fallback_args = (layout_HMM, block, seq_len, device, token_mask, family)
        if layout_HMM is None:  # full attention: one block covering everything, shared by all heads
            layout_HMM = torch.ones(1, 1, 1, dtype=torch.bool)
            block = seq_len
        lay = layout_HMM.detach().cpu().bool()
        m = math.ceil(seq_len / block)
        lay = lay[:, :m, :m]
        tile_n = self.tile_n or self.tile
        band = None
        if isinstance(token_mask, BandMask):
            band_mask = token_mask.resized(seq_len)
            band = (band_mask.radius, band_mask.length)
        tables = build_tables(lay, block, seq_len, self.tile, tile_n, band=band)
        tables = TileTables(
            *(getattr(tables, f).to(device) for f in ("fwd_offsets_HT", "fwd_index", "fwd_partial")),
            *(getattr(tables, f).to(device) for f in ("bwd_offsets_HT", "bwd_index", "bwd_partial")),
            tables.max_visits,
            tables.visited,
        )
        return TritonBlockPlan(
            tables=tables,
            layout_u8=lay.to(torch.uint8).contiguous().to(device),
            block=block,
            m_blocks=m,
            head_stride=1 if lay.shape[0] > 1 else 0,
            seq_len=seq_len,
            tile_m=self.tile,
            tile_n=tile_n,
            no_seed=torch.zeros(1, dtype=torch.int64, device=device),
            fallback_args=fallback_args,
            band_radius=-1 if band is None else band[0],
            band_len=0 if band is None else band[1],
            launch=self.launch,
        )
