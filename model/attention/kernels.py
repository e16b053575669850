"""Attention kernels, registered by name, all with one signature.

``kernel(q_BHND, k_BHND, v_BHND, *, plan, key_padding_mask_BN, token_mask, score_bias, dropout_p, scale, training)``

- ``plan`` comes from ``kernel.make_plan(layout_HMM, block, seq_len, device)`` and is cached by the caller per
  (layout, N, device); ``layout_HMM`` None means full attention.
- ``key_padding_mask_BN``: bool, True = key may be attended. ``token_mask``: bool broadcastable to ``[H, N, N]``,
  True = allowed, combined (AND) with the block layout. ``score_bias``: a :class:`~model.attention.bias.ScoreBias`.
- Rows with nothing to attend to return zeros (and zero gradients), never NaN.

``dense`` (SDPA with a mask) is the reference that every other kernel is tested against.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from model.attention.bias import ScoreBias

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

    def make_plan(self, layout_HMM: torch.Tensor | None, block: int, seq_len: int, device: torch.device) -> Any:
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
    allow = allow | ~row_any
    mask = allow if bias is None else bias.to(q.dtype).masked_fill(~allow, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return out * row_any.to(out.dtype)


@register_kernel("dense")
class DenseKernel(Kernel):
    """SDPA over all N x N scores with the layout expanded to a token mask: the reference; O(N^2)."""

    def make_plan(self, layout_HMM, block, seq_len, device):
        if layout_HMM is None:
            return None
        return layout_HMM.to(device=device, dtype=torch.bool).repeat_interleave(block, 1).repeat_interleave(block, 2)

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


def coarsen_layout(layout_HMM: torch.Tensor, block: int) -> tuple[torch.Tensor, int]:
    """The coarsest equivalent layout: merge c x c tiles while every merged tile is uniform on every head.

    BlockBERT at block 64 and N=4096 becomes an n x n layout with one key block per query block, so block_gather
    runs one big tile per query chunk instead of many small ones.
    """
    H, M, _ = layout_HMM.shape
    for c in sorted((d for d in range(2, M + 1) if M % d == 0), reverse=True):
        t = layout_HMM.view(H, M // c, c, M // c, c)
        if torch.equal(t.amin(dim=(2, 4)), t.amax(dim=(2, 4))):
            return t[:, :, 0, :, 0].contiguous(), block * c
    return layout_HMM, block


@dataclass
class GatherPlan:
    """Which key tokens each query block of each head gathers (see BlockGatherKernel)."""

    block: int  # query/key tile size after coarsening
    num_heads: int
    q_index_1MQ: torch.Tensor  # [1, M, block] query token ids per query block
    k_index_HMK: torch.Tensor  # [H, M, K] gathered key token ids, K = max key blocks per row x block
    flat_index: torch.Tensor  # [H*M*K] row ids into k.reshape(B, H*N, D)
    k_valid_HMK: torch.Tensor | None  # [H, M, K] False where a row had fewer blocks than K (filler); None = all real
    density: float


@register_kernel("block_gather")
class BlockGatherKernel(Kernel):
    """Pure PyTorch: each query block gathers only the key/value blocks its layout row names, then one batched SDPA.

    Compute and score memory scale with the layout's density; gathered K/V take (key blocks per row) x the size of
    K/V. Autograd works on every device (index_select backward is index_add).
    """

    def make_plan(self, layout_HMM, block, seq_len, device):
        if layout_HMM is None:
            return None
        density = float(layout_HMM.float().mean())
        lay, blk = coarsen_layout(layout_HMM.cpu(), block)
        H, M, _ = lay.shape
        counts = lay.sum(-1)  # [H, M]
        S = max(int(counts.max()), 1)
        # stable sort puts the on-blocks first, in increasing key order
        order = torch.sort(lay, dim=-1, descending=True, stable=True).indices[..., :S]  # [H, M, S]
        valid = torch.arange(S)[None, None, :] < counts[..., None]
        order = torch.where(valid, order, torch.zeros_like(order))
        ar = torch.arange(blk)
        k_index = (order[..., None] * blk + ar).reshape(H, M, S * blk)
        k_valid = valid[..., None].expand(H, M, S, blk).reshape(H, M, S * blk)
        flat = (torch.arange(H)[:, None, None] * seq_len + k_index).reshape(-1)
        q_index = (torch.arange(M)[:, None] * blk + ar).unsqueeze(0)
        return GatherPlan(
            block=blk,
            num_heads=H,
            q_index_1MQ=q_index.to(device),
            k_index_HMK=k_index.to(device),
            flat_index=flat.to(device),
            k_valid_HMK=None if bool(k_valid.all()) else k_valid.to(device),
            density=density,
        )

    def __call__(self, q_BHND, k_BHND, v_BHND, *, plan, key_padding_mask_BN=None, token_mask=None, score_bias=None,
                 dropout_p=0.0, scale=None, training=False):
        if plan is None:  # full attention: nothing to skip
            return KERNELS["dense"](q_BHND, k_BHND, v_BHND, plan=None, key_padding_mask_BN=key_padding_mask_BN,
                                    token_mask=token_mask, score_bias=score_bias, dropout_p=dropout_p, scale=scale,
                                    training=training)
        B, H, N, D = q_BHND.shape
        Dv = v_BHND.shape[-1]
        blk = plan.block
        M = N // blk
        K = plan.k_index_HMK.shape[-1]
        q = q_BHND.reshape(B, H * M, blk, D)
        k = k_BHND.reshape(B, H * N, D).index_select(1, plan.flat_index).view(B, H * M, K, D)
        v = v_BHND.reshape(B, H * N, Dv).index_select(1, plan.flat_index).view(B, H * M, K, Dv)
        allow = None if plan.k_valid_HMK is None else plan.k_valid_HMK.reshape(1, H * M, 1, K)
        if key_padding_mask_BN is not None:
            kp = key_padding_mask_BN[:, plan.k_index_HMK].reshape(B, H * M, 1, K)
            allow = kp if allow is None else allow & kp
        if token_mask is not None:
            tm = token_mask.expand(H, N, N)
            h = torch.arange(H, device=tm.device).view(H, 1, 1, 1)
            tm = tm[h, plan.q_index_1MQ[..., :, None], plan.k_index_HMK[:, :, None, :]].reshape(1, H * M, blk, K)
            allow = tm if allow is None else allow & tm
        bias = None
        if score_bias is not None:
            bias = score_bias.gather(plan.q_index_1MQ, plan.k_index_HMK)
            bias = bias.reshape(bias.shape[0], H * M, blk, K)
        out = _sdpa_with_allow(q, k, v, allow, bias, dropout_p if training else 0.0, scale)
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
    block_mask: Any  # layout-only BlockMask (B=None), reused when no per-batch mask is given


@register_kernel("flex")
class FlexKernel(Kernel):
    """torch FlexAttention with a BlockMask built from the layout (Triton on CUDA; eager inference on CPU)."""

    @staticmethod
    def _mask_mod(layout, block, kpm=None, token_mask=None):
        def mask_mod(b, h, qi, ki):
            m = layout[h, qi // block, ki // block]
            if kpm is not None:
                m = m & kpm[b, ki]
            if token_mask is not None:
                m = m & token_mask[h if token_mask.shape[0] > 1 else 0, qi, ki]
            return m

        return mask_mod

    def make_plan(self, layout_HMM, block, seq_len, device):
        from torch.nn.attention.flex_attention import create_block_mask

        if layout_HMM is None:
            layout_HMM = torch.ones(1, 1, 1, dtype=torch.bool)
            block = seq_len
        lay = layout_HMM.to(device=device, dtype=torch.bool)
        H = lay.shape[0]
        bm = create_block_mask(self._mask_mod(lay, block), None, H, seq_len, seq_len, device=device)
        return FlexPlan(layout_HMM=lay, block=block, seq_len=seq_len, block_mask=bm)

    def __call__(self, q_BHND, k_BHND, v_BHND, *, plan, key_padding_mask_BN=None, token_mask=None, score_bias=None,
                 dropout_p=0.0, scale=None, training=False):
        from torch.nn.attention.flex_attention import create_block_mask

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
        if key_padding_mask_BN is not None or token_mask is not None:
            tm = None if token_mask is None else token_mask.to(dev)
            bm = create_block_mask(self._mask_mod(lay, plan.block, key_padding_mask_BN, tm), B, H, N, N, device=dev)
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


@register_kernel("auto")
class AutoKernel(Kernel):
    """Picks a kernel per call (device, dtype, grad, N, density); see :func:`choose_kernel`."""

    def make_plan(self, layout_HMM, block, seq_len, device):
        density = 1.0 if layout_HMM is None else float(layout_HMM.float().mean())
        return AutoPlan(layout_HMM, block, seq_len, torch.device(device), density, {})

    def __call__(self, q_BHND, k_BHND, v_BHND, *, plan, **kw):
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q_BHND, k_BHND, v_BHND))
        dropout = kw.get("training", False) and kw.get("dropout_p", 0.0) > 0
        name = choose_kernel(q_BHND.device.type, q_BHND.dtype, plan.seq_len, plan.density, needs_grad, dropout)
        if name not in plan.plans:
            plan.plans[name] = KERNELS[name].make_plan(plan.layout_HMM, plan.block, plan.seq_len, plan.device)
        return KERNELS[name](q_BHND, k_BHND, v_BHND, plan=plan.plans[name], **kw)


def choose_kernel(device_type: str, dtype: torch.dtype, seq_len: int, density: float, needs_grad: bool,
                  dropout: bool) -> str:
    """The ``auto`` rule (documented in docs/model.md).

    - a full layout (density 1) -> ``dense`` (fused SDPA, nothing to skip);
    - CUDA, no attention dropout, density < 0.9 -> ``flex`` (block-sparse Triton kernel, trains);
    - otherwise density <= 0.75 -> ``block_gather`` (skips blocks; any device; trains), else ``dense``.
    """
    if density >= 1.0:
        return "dense"
    if device_type == "cuda" and not dropout and density < 0.9:
        return "flex"
    return "block_gather" if density <= 0.75 else "dense"
