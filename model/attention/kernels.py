"""Attention kernels, registered by name, all with one signature.

``kernel(q_BHND, k_BHND, v_BHND, *, plan, key_padding_mask_BN, token_mask, score_bias, dropout_p, scale, training)``

- ``plan`` comes from ``kernel.make_plan(layout_HMM, block, seq_len, device, token_mask=None)`` and is cached by
  the caller per (layout, N, device); ``layout_HMM`` None means full attention. A fixed ``token_mask`` (bool
  ``[H|1, N, N]``, e.g. a SparseBERT pattern) given here is folded into the plan once (dense: the expanded mask;
  block_gather: each tile's element mask; flex: the BlockMask) instead of being re-applied every call.
- ``key_padding_mask_BN``: bool, True = key may be attended. ``token_mask``: bool broadcastable to ``[H, N, N]``,
  True = allowed, combined (AND) with the block layout. ``score_bias``: a :class:`~model.attention.bias.ScoreBias`.
- Rows with nothing to attend to return zeros (and zero gradients), never NaN.

``dense`` (SDPA with a mask) is the reference that every other kernel is tested against.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from model.attention.bias import ScoreBias
from model.attention.flex_mask import SPARSE_BLOCK, layout_block_mask, sparse_block_size
from model.attention.split_global import SplitPlan, make_split_plan, split_attention
from model.attention.tile_masks import tile_allow
from model.attention.tile_permutation import PermutationPlan, make_permutation_plan, permutation_attention

KERNELS: dict[str, "Kernel"] = {}


def register_kernel(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        KERNELS[name] = cls()
        cls.name = name
        return cls

    return deco


def get_kernel(name: str) -> "Kernel":
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; registered kernels: {sorted(KERNELS)}")
    return KERNELS[name]


class Kernel:
    name = "base"

    def make_plan(self, layout_HMM: torch.Tensor | None, block: int, seq_len: int, device: torch.device,
                  token_mask: torch.Tensor | None = None) -> Any:
        raise NotImplementedError

    def __call__(
        self,
        q_BHND: torch.Tensor,
        k_BHND: torch.Tensor,
        v_BHND: torch.Tensor,
        *,
        plan: Any,
        key_padding_mask_BN: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
        score_bias: ScoreBias | None = None,
        dropout_p: float = 0.0,
        scale: float | None = None,
        training: bool = False,
    ) -> torch.Tensor:
        raise NotImplementedError


def _sdpa_with_allow(q, k, v, allow, bias, dropout_p, scale):
    """SDPA where ``allow`` (bool, broadcastable to the scores; None = all) and ``bias`` (additive) are combined.

    Rows with no allowed key are computed against all keys and then zeroed, so no NaN reaches values or grads.
    """
    if allow is None:
        mask = None if bias is None else bias.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    row_any = allow.any(-1, keepdim=True)
    # on CPU, skip the fix-up (a full-size multiply) when every row has a key; on GPU avoid the host sync
    fix = allow.device.type != "cpu" or not bool(row_any.all())
    if fix:
        allow = allow | ~row_any
    mask = allow if bias is None else bias.to(q.dtype).masked_fill(~allow, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return out * row_any.to(out.dtype) if fix else out


def _fold_heads(x: torch.Tensor | None, B: int, G: int) -> torch.Tensor | None:
    """``[B|1, G|1, ...]`` -> ``[B*G, 1, ...]`` (a view for inputs; masks/biases broadcast over B are expanded)."""
    if x is None:
        return None
    if B == 1:
        return x.transpose(0, 1)
    return x.expand(B, G, *x.shape[2:]).reshape(B * G, 1, *x.shape[2:])


def _sdpa_tiles(q, k, v, allow, bias, dropout_p, scale):
    """:func:`_sdpa_with_allow` for ``[B, G, T, D]`` tiles, with the tiles moved to SDPA's batch axis.

    Why: torch's CPU flash backward runs measurably faster (~10-20% on the 2-core box) on ``[B*G, 1, T, D]`` than on
    ``[B, G, T, D]`` (same data, same FLOPs). For B == 1 the fold is a free view; for B > 1 it is used only when the
    inputs are contiguous (so q/k/v fold as views) and no bias is shared across the batch (which would be copied
    B times).
    """
    B, G = q.shape[:2]
    if q.device.type != "cpu" or (B > 1 and not (all(t.is_contiguous() for t in (q, k, v))
                                                 and (bias is None or bias.shape[0] == B))):
        return _sdpa_with_allow(q, k, v, allow, bias, dropout_p, scale)
    out = _sdpa_with_allow(*(_fold_heads(t, B, G) for t in (q, k, v, allow, bias)), dropout_p, scale)
    return out.transpose(0, 1) if B == 1 else out.view(B, G, *out.shape[2:])


@register_kernel("dense")
class DenseKernel(Kernel):
    """SDPA over all N x N scores with the layout expanded to a token mask: the reference; O(N^2)."""

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None):
        tm = None if token_mask is None else token_mask.to(device=device, dtype=torch.bool)
        if layout_HMM is None:
            return tm
        lay = layout_HMM.to(device=device, dtype=torch.bool).repeat_interleave(block, 1).repeat_interleave(block, 2)
        return lay if tm is None else lay & tm

    def __call__(self, q_BHND, k_BHND, v_BHND, *, plan, key_padding_mask_BN=None, token_mask=None, score_bias=None,
                 dropout_p=0.0, scale=None, training=False):
        N = q_BHND.shape[2]
        allow = plan  # [H, N, N] or None
        if token_mask is not None:
            allow = token_mask if allow is None else allow & token_mask
        if key_padding_mask_BN is not None:
            kp = key_padding_mask_BN[:, None, None, :]
            allow = kp if allow is None else allow.unsqueeze(0) & kp
        bias = None if score_bias is None else score_bias.dense(N)
        return _sdpa_with_allow(q_BHND, k_BHND, v_BHND, allow, bias, dropout_p if training else 0.0, scale)


def query_tile_factor(layout_HMM: torch.Tensor) -> int:
    """Largest r dividing M such that the r query blocks of every tile have identical layout rows on every head.

    Merging them into one query tile loses nothing (same key set) and gives the fused attention kernel taller
    tiles: BlockBERT at block 64, N=4096, n=2 becomes 2 query tiles of 2048 rows per head; Fixed with 4-block
    local windows gets tiles of 4 blocks.
    """
    H, M, _ = layout_HMM.shape
    for r in sorted((d for d in range(2, M + 1) if M % d == 0), reverse=True):
        t = layout_HMM.view(H, M // r, r, M)
        if bool((t == t[:, :, :1]).all()):
            return r
    return 1


@dataclass
class GatherGroup:
    """Query tiles whose rows attend to the same number of key tokens K: one fused SDPA call."""

    start: int  # first position of this group's tiles in the permuted tile order
    head_G: torch.Tensor  # [G] head of each tile
    q_index_GQ: torch.Tensor  # [G, Q] query token ids
    k_index_GK: torch.Tensor  # [G, K] key token ids gathered for each tile (K may be 0)
    k_offset: int  # where this group's G*K gathered keys start in the one gathered K/V tensor
    token_mask_GQK: torch.Tensor | None = None  # the plan's fixed element mask inside these tiles (None = all on)


@dataclass
class GatherPlan:
    """How block_gather computes one layout at one padded length (see BlockGatherKernel)."""

    tile: int  # query rows per tile
    num_tiles: int  # H * Mq
    groups: list[GatherGroup]
    perm: torch.Tensor | None  # tile order grouped by key count; None if already in order
    inverse: torch.Tensor | None  # undoes perm
    flat_index: torch.Tensor  # all groups' key rows into k.reshape(B, H*N, D), concatenated
    density: float


@register_kernel("block_gather")
class BlockGatherKernel(Kernel):
    """Pure PyTorch: each query tile gathers only the key/value blocks its layout row names; tiles with the same
    number of key blocks go through one fused SDPA call (no filler blocks, no mask unless padding asks for one).

    Compute and score memory scale with the layout's density; gathered K/V cost (key blocks per row) x the size of
    K/V. One gather for K, one for V, one permutation of Q and of the output, whatever the number of groups (each
    large temporary costs page faults on CPU). Autograd works on every device (index_select's backward is
    index_add). Plans, most specific first: BlockBERT-like layouts get the permutation fast path
    (tile_permutation.py); on CPU, layouts with key blocks shared by all rows or a diagonal window get the split path
    (split_global.py) when its estimated cost is lower; everything else the general gather plan.
    """

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None):
        if layout_HMM is None:
            if token_mask is None:
                return None
            layout_HMM = torch.ones(token_mask.shape[0], 1, 1, dtype=torch.bool)
            block = seq_len
        lay = layout_HMM.cpu().bool()
        fast = make_permutation_plan(lay, query_tile_factor(lay), block, seq_len, device, token_mask)
        if fast is not None:  # one key tile per query tile (BlockBERT): views instead of gathers
            return fast
        if torch.device(device).type == "cpu":  # key blocks shared by every row: computed once (CPU flash + lse)
            split = make_split_plan(lay, block, seq_len, device, token_mask, self.make_gather_plan,
                                    query_tile_factor)
            if split is not None:
                return split
        return self.make_gather_plan(lay, block, seq_len, device, token_mask)

    def make_gather_plan(self, layout_HMM, block, seq_len, device, token_mask=None) -> GatherPlan:
        """The general plan (any layout): gathered key tiles grouped by key count."""
        lay = layout_HMM.cpu().bool()
        H, M, _ = lay.shape
        r = query_tile_factor(lay)
        tile = r * block
        lay_q = lay[:, ::r].reshape(-1, M)  # [H*Mq, M]
        Mq = M // r
        counts = lay_q.sum(-1)
        ar = torch.arange(block)
        groups, order, flats = [], [], []
        start = offset = 0
        for c in sorted(set(counts.tolist())):
            rows = (counts == c).nonzero().squeeze(1)
            head = rows // Mq
            kblocks = lay_q[rows].nonzero()[:, 1].view(len(rows), c)  # increasing key order
            k_index = (kblocks[..., None] * block + ar).reshape(len(rows), c * block)
            q_index = (rows % Mq)[:, None] * tile + torch.arange(tile)
            tm = None
            if token_mask is not None:
                tm = token_mask.cpu().bool().expand(H, seq_len, seq_len)[head[:, None, None], q_index[:, :, None],
                                                                          k_index[:, None, :]].to(device)
            groups.append(GatherGroup(start, head.to(device), q_index.to(device), k_index.to(device), offset, tm))
            flats.append((head[:, None] * seq_len + k_index).reshape(-1))
            order.append(rows)
            start += len(rows)
            offset += k_index.numel()
        perm = torch.cat(order)
        in_order = torch.equal(perm, torch.arange(H * Mq))
        return GatherPlan(
            tile=tile,
            num_tiles=H * Mq,
            groups=groups,
            perm=None if in_order else perm.to(device),
            inverse=None if in_order else torch.argsort(perm).to(device),
            flat_index=torch.cat(flats).to(device),
            density=float(lay.float().mean()),
        )

    def __call__(self, q_BHND, k_BHND, v_BHND, *, plan, key_padding_mask_BN=None, token_mask=None, score_bias=None,
                 dropout_p=0.0, scale=None, training=False):
        if plan is None:  # full attention: nothing to skip
            return KERNELS["dense"](q_BHND, k_BHND, v_BHND, plan=None, key_padding_mask_BN=key_padding_mask_BN,
                                    token_mask=token_mask, score_bias=score_bias, dropout_p=dropout_p, scale=scale,
                                    training=training)
        drop = dropout_p if training else 0.0
        if isinstance(plan, PermutationPlan):
            return permutation_attention(q_BHND, k_BHND, v_BHND, plan, key_padding_mask_BN, token_mask, score_bias,
                                         drop, scale, _sdpa_tiles)
        if isinstance(plan, SplitPlan):
            if drop == 0.0 and score_bias is None and q_BHND.device.type == "cpu":
                return split_attention(q_BHND, k_BHND, v_BHND, plan, key_padding_mask_BN, token_mask, scale)
            plan = plan.fallback
        B, H, N, D = q_BHND.shape
        Dv = v_BHND.shape[-1]
        T = plan.tile
        q_tiles = q_BHND.reshape(B, plan.num_tiles, T, D)
        if plan.perm is not None:
            q_tiles = q_tiles.index_select(1, plan.perm)
        k_all = k_BHND.reshape(B, H * N, D).index_select(1, plan.flat_index)
        v_all = v_BHND.reshape(B, H * N, Dv).index_select(1, plan.flat_index)
        # split (not narrow): its backward is one cat, not a zero-filled full-size tensor per group
        q_parts = q_tiles.split([g.k_index_GK.shape[0] for g in plan.groups], 1)
        k_parts = k_all.split([g.k_index_GK.numel() for g in plan.groups], 1)
        v_parts = v_all.split([g.k_index_GK.numel() for g in plan.groups], 1)
        outs = []
        for g, q, k, v in zip(plan.groups, q_parts, k_parts, v_parts):
            G, K = g.k_index_GK.shape
            if K == 0:  # tiles with no key block at all: zeros
                outs.append(q_BHND.new_zeros(B, G, T, Dv))
                continue
            k = k.view(B, G, K, D)
            v = v.view(B, G, K, Dv)
            allow = None
            if key_padding_mask_BN is not None:
                allow = key_padding_mask_BN[:, g.k_index_GK].view(B, G, 1, K)
            allow = tile_allow(allow, token_mask, g.token_mask_GQK, g.head_G, g.q_index_GQ, g.k_index_GK, H, N)
            bias = None if score_bias is None else score_bias.gather(g.head_G, g.q_index_GQ, g.k_index_GK)
            outs.append(_sdpa_tiles(q, k, v, allow, bias, drop, scale))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
        if plan.inverse is not None:
            out = out.index_select(1, plan.inverse)
        return out.view(B, H, N, Dv)


_compiled_flex: dict[str, Callable] = {}


def _flex_fn(device_type: str) -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    if device_type == "cpu":  # eager (reference) path: CPU inference only
        return flex_attention
    if device_type not in _compiled_flex:
        _compiled_flex[device_type] = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex[device_type]


@dataclass
class FlexPlan:
    layout_HMM: torch.Tensor  # on device, bool
    block: int
    seq_len: int
    block_mask: Any  # layout (+ fixed token mask) BlockMask (B=None), reused when no per-batch mask is given
    token_mask: torch.Tensor | None = None  # the plan's fixed element mask, [H|1, N, N] on device
    key: tuple = ()  # what makes two plans' BlockMasks interchangeable (layout content, block, N, token mask)


class _PaddingMaskCache:
    """The BlockMask of the last key-padding mask, per plan key: the layers of one forward share one padding mask
    tensor and (usually) one layout, so the mask is built once per forward, not once per layer. An entry is valid
    only for the same tensor object at the same version (a new batch, or an in-place change, rebuilds)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Any, int, Any]] = {}

    def get(self, key: tuple, kpm: torch.Tensor, build: Callable[[], Any]) -> Any:
        import weakref

        hit = self._entries.get(key)
        if hit is not None and hit[0]() is kpm and hit[1] == kpm._version:
            return hit[2]
        bm = build()
        self._entries[key] = (weakref.ref(kpm), kpm._version, bm)
        if len(self._entries) > 64:  # many distinct layouts: keep the newest
            self._entries.pop(next(iter(self._entries)))
        return bm


_PADDING_MASKS = _PaddingMaskCache()


@register_kernel("flex")
class FlexKernel(Kernel):
    """torch FlexAttention with a BlockMask built from the layout (Triton on CUDA; eager inference on CPU)."""

    @staticmethod
    def _mask_mod(layout, block, kpm=None, token_mask=None):
        per_head = layout.shape[0] > 1  # a one-head layout (full attention) serves every head

        def mask_mod(b, h, qi, ki):
            m = layout[h if per_head else 0, qi // block, ki // block]
            if kpm is not None:
                m = m & kpm[b, ki]
            if token_mask is not None:
                m = m & token_mask[h if token_mask.shape[0] > 1 else 0, qi, ki]
            return m

        return mask_mod

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None):
        if layout_HMM is None:  # full attention: an all-on layout at the sparse block size
            block = SPARSE_BLOCK
            m = -(-seq_len // block)
            layout_HMM = torch.ones(1, m, m, dtype=torch.bool)
        lay = layout_HMM.to(device=device, dtype=torch.bool)
        tm = None if token_mask is None else token_mask.to(device=device, dtype=torch.bool)
        H = max(lay.shape[0], 1 if tm is None else tm.shape[0])
        if lay.shape[0] == 1 and H > 1:
            lay = lay.expand(H, -1, -1)
        plan = FlexPlan(layout_HMM=lay, block=block, seq_len=seq_len, block_mask=None, token_mask=tm)
        plan.block_mask = self._block_mask(plan, lay, None, tm)
        tm_key = None if tm is None else (tuple(tm.shape), hash(tm.cpu().numpy().tobytes()))
        plan.key = (block, seq_len, tuple(lay.shape), hash(lay.cpu().numpy().tobytes()), tm_key, str(device))
        return plan

    def _block_mask(self, plan: "FlexPlan", lay: torch.Tensor, kpm: torch.Tensor | None,
                    tm: torch.Tensor | None) -> Any:
        """From the block layout when it aligns with 128-token sparse blocks (no N x N pass); else torch's
        ``create_block_mask`` over the same mask_mod."""
        from torch.nn.attention.flex_attention import create_block_mask

        mask_mod = self._mask_mod(lay, plan.block, kpm, tm)
        if sparse_block_size(plan.block) is not None:
            return layout_block_mask(lay, plan.block, plan.seq_len, mask_mod, kpm, tm)
        B = None if kpm is None else kpm.shape[0]
        return create_block_mask(mask_mod, B, lay.shape[0], plan.seq_len, plan.seq_len, device=lay.device)

    def __call__(self, q_BHND, k_BHND, v_BHND, *, plan, key_padding_mask_BN=None, token_mask=None, score_bias=None,
                 dropout_p=0.0, scale=None, training=False):
        dev = q_BHND.device
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q_BHND, k_BHND, v_BHND))
        if dev.type == "cpu" and needs_grad:
            raise RuntimeError(
                "attention kernel 'flex' has no backward on CPU (FlexAttention limitation): use kernel "
                "'block_gather' or 'auto' for CPU training, or run under torch.no_grad() for inference"
            )
        if dev.type == "cpu":  # grad is off here; FlexAttention rejects CPU inputs that merely require grad
            q_BHND, k_BHND, v_BHND = q_BHND.detach(), k_BHND.detach(), v_BHND.detach()
        if training and dropout_p > 0:
            raise ValueError(
                f"attention kernel 'flex' does not support attention dropout (got {dropout_p}); set attention "
                "dropout to 0 or use kernel 'block_gather'/'dense'"
            )
        B, H, N, _ = q_BHND.shape
        bm = plan.block_mask
        lay = plan.layout_HMM
        if lay.shape[0] == 1 and H > 1:
            lay = lay.expand(H, -1, -1)
        if token_mask is not None:  # a per-call element mask: its own BlockMask
            tm = token_mask.to(dev)
            if plan.token_mask is not None:
                tm = plan.token_mask & tm
            bm = self._block_mask(plan, lay, key_padding_mask_BN, tm)
        elif key_padding_mask_BN is not None:  # padding only: one BlockMask per forward, shared by the layers
            kpm = key_padding_mask_BN
            bm = _PADDING_MASKS.get(plan.key, kpm, lambda: self._block_mask(plan, lay, kpm, plan.token_mask))
        score_mod = None if score_bias is None else score_bias.score_mod()
        fn = _flex_fn(dev.type)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the eager-CPU performance warning; documented in docs/model.md
            out = fn(q_BHND, k_BHND, v_BHND, score_mod=score_mod, block_mask=bm, scale=scale)
        return out  # FlexAttention returns 0 for rows with no allowed key (tested against dense)


@dataclass
class AutoPlan:
    layout_HMM: torch.Tensor | None
    block: int
    seq_len: int
    device: torch.device
    density: float
    plans: dict
    token_mask: torch.Tensor | None = None
    chosen: dict = field(default_factory=dict)  # dtype -> kernel name, decided once


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """CUDA compute capability of ``device`` (None off CUDA)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


@register_kernel("auto")
class AutoKernel(Kernel):
    """Picks a kernel once per plan (device, compute capability, dtype, N, density, configured attention dropout)
    with :func:`choose_kernel` and keeps it: training and evaluation run the same kernel (evaluation switching to
    flex would compile it on every rank mid-run)."""

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None):
        density = 1.0 if layout_HMM is None else float(layout_HMM.float().mean())
        return AutoPlan(layout_HMM, block, seq_len, torch.device(device), density, {}, token_mask)

    def __call__(self, q_BHND, k_BHND, v_BHND, *, plan, **kw):
        name = plan.chosen.get(q_BHND.dtype)
        if name is None:  # the configured dropout counts, not whether this call trains: one kernel for both
            name = choose_kernel(q_BHND.device.type, q_BHND.dtype, plan.seq_len, plan.density,
                                 dropout=kw.get("dropout_p", 0.0) > 0, capability=device_capability(q_BHND.device))
            plan.chosen[q_BHND.dtype] = name
        if name not in plan.plans:
            plan.plans[name] = KERNELS[name].make_plan(plan.layout_HMM, plan.block, plan.seq_len, plan.device,
                                                       token_mask=plan.token_mask)
        return KERNELS[name](q_BHND, k_BHND, v_BHND, plan=plan.plans[name], **kw)


def choose_kernel(device_type: str, dtype: torch.dtype, seq_len: int, density: float, needs_grad: bool = True,
                  dropout: bool = False, capability: tuple[int, int] | None = None) -> str:
    """The ``auto`` rule, a pure function so every entry is testable without the device (docs/model.md has the
    table and says which entries were measured).

    - a full layout (density 1) -> ``dense`` (fused SDPA, nothing to skip);
    - ``flex`` only on CUDA, without attention dropout (FlexAttention has none), at N >= 512 (its 128-token
      blocks leave little to skip below that), density < 0.9, and where Triton runs it well: compute capability
      8.0+ (Ampere, Hopper) in any dtype; 7.5 (Turing) in fp16/fp32 only (bf16 is emulated there); never 7.0
      (Volta: Triton no longer uses its tensor cores, flex runs ~10x slower than SDPA);
    - otherwise density <= 0.75 -> ``block_gather`` (skips blocks; any device; trains), else ``dense``.

    ``needs_grad`` is accepted for compatibility and does not change the choice (the same kernel trains and
    evaluates).
    """
    if density >= 1.0:
        return "dense"
    if device_type == "cuda" and not dropout and density < 0.9 and seq_len >= 512:
        cap = capability or (8, 0)
        if cap >= (8, 0) or (cap >= (7, 5) and dtype != torch.bfloat16):
            return "flex"
    return "block_gather" if density <= 0.75 else "dense"
