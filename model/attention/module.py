"""The one attention module: a layout (data) + a kernel (registry name), with padding and plan caching.

:class:`BlockSparseAttention` is what the encoder uses. DeepSpeed's ``SparseSelfAttention`` (and the rest of
``deepspeed.ops.sparse_attention``) wraps it in its own package, :mod:`model.attention.deepspeed`.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention.band import BandMask
from model.attention.bias import ScoreBias
from model.attention.kernels import get_kernel
from model.attention.layouts import DenseSparsityConfig, SparsityConfig
from model.attention.sparsebert import block_layout_from_mask


class _PaddedOnce:
    """The per-forward masks padded to the layout's length, once per forward: every layer pads the same key-padding
    mask (or document ids) by the same amount, and gets the same tensor object back, so the kernels' per-forward
    caches (flex's BlockMask, kernels/flex.py) hit in every layer after the first. An entry holds for its source
    tensor object at its version (a new batch or an in-place change pads again); not used while compiling."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple] = {}

    def get(self, src: torch.Tensor, p: int, value) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return F.pad(src, (0, p), value=value)
        key = (id(src), src._version, p, value)
        hit = self._entries.get(key)
        if hit is not None and hit[0]() is src:
            return hit[1]
        out = F.pad(src, (0, p), value=value)
        self._entries[key] = (weakref.ref(src), out)
        while len(self._entries) > 16:  # the newest few: one forward needs one or two
            self._entries.pop(next(iter(self._entries)))
        return out

    def all_valid(self, B: int, N: int, device: torch.device) -> torch.Tensor:
        """An all-True ``[B, N]`` key mask (the same object for the same shape and device)."""
        if torch.compiler.is_compiling():
            return torch.ones(B, N, dtype=torch.bool, device=device)
        key = ("ones", B, N, str(device))
        hit = self._entries.get(key)
        if hit is None:
            hit = self._entries[key] = (None, torch.ones(B, N, dtype=torch.bool, device=device))
        return hit[1]


_PADDED = _PaddedOnce()


class BlockSparseAttention(nn.Module):
    """softmax(q k^T * scale + bias, masked by layout/padding/token mask) v over ``[B, H, N, D]`` tensors.

    ``fixed_token_mask`` may also be a :class:`~model.attention.band.BandMask` (a sliding window kept as its
    radius: a banded block layout and element masks inside the computed tiles, never ``[H, n, n]``).

    The layout is made once at ``max_seq_length`` (as DeepSpeed did; random blocks drawn once) and kept in the
    ``master_layout`` buffer (not in ``state_dict``: save it with :meth:`layout_state`). A sequence whose length
    the layout family cannot serve is laid on the padded grid: a plan that serves the real length as it is
    (``plan.serves_length(N)``: block_gather's BlockBERT plan cuts the last chunks) gets it unpadded; otherwise it is
    padded at the end, padded keys are masked and padded rows are cut off.
    Kernel plans are cached per (layout, padded N, device).

    ``fixed_token_mask`` (bool ``[H, n, n]``, e.g. a SparseBERT pattern) is ANDed with every call's attention and
    folded into the block layout (a block stays on iff one of its elements is allowed), so the sparse kernels skip
    the blocks it masks entirely; without a ``sparsity_config`` the layout is derived from it at ``mask_block``.
    Sequences longer than its n are rejected.
    """

    def __init__(
        self,
        sparsity_config: SparsityConfig | None,
        kernel: str = "auto",
        max_seq_length: int = 2048,
        dropout_p: float = 0.0,
        fixed_token_mask: torch.Tensor | BandMask | None = None,
        mask_block: int = 16,
    ):
        super().__init__()
        if fixed_token_mask is not None and not isinstance(fixed_token_mask, BandMask):
            if fixed_token_mask.dim() != 3 or fixed_token_mask.shape[1] != fixed_token_mask.shape[2]:
                raise ValueError(f"fixed_token_mask must be bool [H, n, n], got {tuple(fixed_token_mask.shape)}")
        if fixed_token_mask is not None:
            if sparsity_config is None:
                sparsity_config = DenseSparsityConfig(fixed_token_mask.shape[0], block=mask_block)
            elif fixed_token_mask.shape[0] != sparsity_config.num_heads:
                raise ValueError(
                    f"fixed_token_mask has {fixed_token_mask.shape[0]} heads, the layout {sparsity_config.num_heads}"
                )
            max_seq_length = fixed_token_mask.shape[-1]
        self.sparsity_config = sparsity_config
        self.kernel_name = kernel
        self.kernel = get_kernel(kernel)
        self.dropout_p = dropout_p
        self.max_seq_length = max_seq_length
        master = tm = None
        if sparsity_config is not None:
            master = sparsity_config.make_layout(sparsity_config.padded_length(max_seq_length))
        if fixed_token_mask is not None:
            n_pad = sparsity_config.padded_length(max_seq_length)
            if isinstance(fixed_token_mask, BandMask):
                tm = fixed_token_mask.resized(n_pad)
                master = master * tm.block_layout(sparsity_config.block)
            else:
                p = n_pad - fixed_token_mask.shape[-1]
                tm = F.pad(fixed_token_mask.bool(), (0, p, 0, p), value=False)
                master = master * block_layout_from_mask(tm, sparsity_config.block)
        self.register_buffer("master_layout", master, persistent=False)
        if isinstance(tm, BandMask):  # a plain attribute: no tensor to move or save
            self.fixed_token_mask = tm
        else:
            self.register_buffer("fixed_token_mask", tm, persistent=False)
        self._plans: dict = {}
        self._layout_version = 0

    # -- layout state (random layouts must travel with checkpoints) ------------------------------------------------
    def layout_state(self) -> torch.Tensor | None:
        return None if self.master_layout is None else self.master_layout.detach().cpu().clone()

    def load_layout_state(self, layout: torch.Tensor | None) -> None:
        if (layout is None) != (self.master_layout is None):
            raise ValueError("layout state does not match this module (one is dense, the other sparse)")
        if layout is not None:
            if layout.shape != self.master_layout.shape:
                raise ValueError(
                    f"saved layout has shape {tuple(layout.shape)}, this module's is {tuple(self.master_layout.shape)}"
                    " (different num_heads, block or max_seq_length?)"
                )
            self.master_layout.copy_(layout)
        self._plans.clear()
        self._layout_version += 1

    def layout_for(self, seq_len: int) -> torch.Tensor | None:
        """The int64 [H, Np/block, Np/block] layout applied to a sequence of ``seq_len`` (padded to Np)."""
        if self.sparsity_config is None:
            return None
        n_pad = self.sparsity_config.padded_length(seq_len)
        return self.sparsity_config.layout_for_length(self.master_layout.cpu(), n_pad)

    def build_plan(self, seq_len: int, device: torch.device, dtype: torch.dtype = torch.float32) -> str | None:
        """Build (and cache) the kernel plan for ``dtype`` sequences of ``seq_len`` on ``device`` now (``auto``:
        its choice too). Plan building reads the layout on the host (Python decisions on tensor values), so under
        torch.compile it must not be traced: a cached plan is a dictionary lookup the compiled graph keeps, a
        missing one is a graph break per decision. Returns ``auto``'s start-up line (which kernel and why), else
        None."""
        n_pad = seq_len if self.sparsity_config is None else self.sparsity_config.padded_length(seq_len)
        device = torch.device(device)
        plan = self._plan(n_pad, device)
        if hasattr(plan, "prepare"):  # a plan that picks its kernel per dtype on first use (auto)
            plan.prepare(device, dtype, self.dropout_p)
            return plan.describe(dtype)
        return None

    def _plan(self, n_pad: int, device: torch.device):
        key = (n_pad, str(device), self._layout_version)
        plan = self._plans.get(key)
        if plan is None:
            layout = self.layout_for(n_pad)
            block = None if self.sparsity_config is None else self.sparsity_config.block
            fixed = self.fixed_token_mask
            if isinstance(fixed, BandMask):
                fixed = fixed.resized(n_pad)
            elif fixed is not None:
                fixed = fixed[:, :n_pad, :n_pad]
            family = None if self.sparsity_config is None or fixed is not None else self.sparsity_config.family()
            plan = self.kernel.make_plan(layout, block, n_pad, device, token_mask=fixed, family=family)
            self._plans[key] = plan
        return plan

    def forward(
        self,
        q_BHND: torch.Tensor,
        k_BHND: torch.Tensor,
        v_BHND: torch.Tensor,
        key_padding_mask_BN: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
        score_bias: ScoreBias | None = None,
        scale: float | None = None,
        doc_ids_BN: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``doc_ids_BN`` (int ``[B, N]``, packed sequences): attention stays inside each document, in every
        kernel (see :mod:`model.attention.kernels.registry`); ``cu_seqlens`` (its runs, from the collator) lets
        ``dense`` run the varlen kernel; dropped where the layout pads the sequence."""
        B, H, N, _ = q_BHND.shape
        if self.sparsity_config is not None and H != self.sparsity_config.num_heads:
            raise ValueError(f"q has {H} heads but the sparsity config was built for {self.sparsity_config.num_heads}")
        n_pad = N if self.sparsity_config is None else self.sparsity_config.padded_length(N)
        if self.fixed_token_mask is not None and N > self.max_seq_length:  # (the mask itself is in the plan)
            raise ValueError(
                f"sequence length {N} exceeds the token mask's length {self.max_seq_length}; "
                "raise attention.token_mask.seq_len in the model config"
            )
        plan = self._plan(n_pad, q_BHND.device)
        pad = n_pad != N and not self._serves_unpadded(plan, N, q_BHND.device, q_BHND.dtype, token_mask, score_bias)
        if pad:
            p = n_pad - N
            q_BHND, k_BHND, v_BHND = (F.pad(t, (0, 0, 0, p)) for t in (q_BHND, k_BHND, v_BHND))
            if key_padding_mask_BN is None:
                key_padding_mask_BN = _PADDED.all_valid(B, N, q_BHND.device)
            key_padding_mask_BN = _PADDED.get(key_padding_mask_BN, p, False)
            if token_mask is not None:
                token_mask = F.pad(token_mask, (0, p, 0, p), value=False)
            if doc_ids_BN is not None:  # the padded keys are masked anyway; -1 is no document
                doc_ids_BN = _PADDED.get(doc_ids_BN, p, -1)
            cu_seqlens = None
            if score_bias is not None:
                score_bias = score_bias.padded(n_pad)
        out = self.kernel(
            q_BHND,
            k_BHND,
            v_BHND,
            plan=plan,
            key_padding_mask_BN=key_padding_mask_BN,
            token_mask=token_mask,
            score_bias=score_bias,
            dropout_p=self.dropout_p,
            scale=scale,
            training=self.training,
            doc_ids_BN=doc_ids_BN,
            cu_seqlens=cu_seqlens,
        )
        return out[:, :, :N] if pad else out

    def _serves_unpadded(self, plan, N: int, device, dtype, token_mask, score_bias) -> bool:
        """Whether ``plan`` (made at the padded length) computes this call at its real length ``N``: no padded
        q/k/v copies, no key mask (block_gather's BlockBERT plan: the same chunks, the last ones cut). Calls with a
        per-call token mask or score bias are padded (those are made for the padded grid)."""
        if token_mask is not None or score_bias is not None:
            return False
        if hasattr(plan, "prepare"):  # auto: the plan of the kernel it chose (a dictionary lookup once chosen)
            plan = plan.prepare(device, dtype, self.dropout_p)
        serves = getattr(plan, "serves_length", None)
        return serves is not None and serves(N)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel_name!r}, sparsity={self.sparsity_config!r}, dropout_p={self.dropout_p}"
