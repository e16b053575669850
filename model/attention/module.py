"""The one attention module: a layout (data) + a kernel (registry name), with padding and plan caching.

:class:`BlockSparseAttention` is what the encoder uses; :class:`SparseSelfAttention` wraps it with DeepSpeed's old
constructor and ``forward`` so that code written for ``deepspeed.ops.sparse_attention`` ports by changing an import.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention.band import BandMask
from model.attention.bias import DenseScoreBias, ScoreBias, combine_biases
from model.attention.block_sparse_ops import MatMul, Softmax
from model.attention.kernels import get_kernel
from model.attention.layouts import DenseSparsityConfig, SparsityConfig
from model.attention.sparsebert import block_layout_from_mask


class BlockSparseAttention(nn.Module):
    """softmax(q k^T * scale + bias, masked by layout/padding/token mask) v over ``[B, H, N, D]`` tensors.

    ``fixed_token_mask`` may also be a :class:`~model.attention.band.BandMask` (a sliding window kept as its
    radius: a banded block layout and element masks inside the computed tiles, never ``[H, n, n]``).

    The layout is made once at ``max_seq_length`` (as DeepSpeed did; random blocks drawn once) and kept in the
    ``master_layout`` buffer (not in ``state_dict``: save it with :meth:`layout_state`). A sequence whose length
    the layout family cannot serve is padded at the end; padded keys are masked and padded rows are cut off.
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

    def build_plan(self, seq_len: int, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
        """Build (and cache) the kernel plan for ``dtype`` sequences of ``seq_len`` on ``device`` now (``auto``:
        its choice too). Plan building reads the layout on the host (Python decisions on tensor values), so under
        torch.compile it must not be traced: a cached plan is a dictionary lookup the compiled graph keeps, a
        missing one is a graph break per decision."""
        n_pad = seq_len if self.sparsity_config is None else self.sparsity_config.padded_length(seq_len)
        device = torch.device(device)
        plan = self._plan(n_pad, device)
        if hasattr(plan, "prepare"):  # a plan that picks its kernel per dtype on first use (auto)
            plan.prepare(device, dtype, self.dropout_p)

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
            plan = self.kernel.make_plan(layout, block, n_pad, device, token_mask=fixed)
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
    ) -> torch.Tensor:
        """``doc_ids_BN`` (int ``[B, N]``, packed sequences): attention stays inside each document, in every
        kernel (see :mod:`model.attention.kernels.registry`)."""
        B, H, N, _ = q_BHND.shape
        if self.sparsity_config is not None and H != self.sparsity_config.num_heads:
            raise ValueError(f"q has {H} heads but the sparsity config was built for {self.sparsity_config.num_heads}")
        n_pad = N if self.sparsity_config is None else self.sparsity_config.padded_length(N)
        if self.fixed_token_mask is not None and N > self.max_seq_length:  # (the mask itself is in the plan)
            raise ValueError(
                f"sequence length {N} exceeds the token mask's length {self.max_seq_length}; "
                "raise attention.token_mask.seq_len in the model config"
            )
        if n_pad != N:
            p = n_pad - N
            q_BHND, k_BHND, v_BHND = (F.pad(t, (0, 0, 0, p)) for t in (q_BHND, k_BHND, v_BHND))
            if key_padding_mask_BN is None:
                key_padding_mask_BN = torch.ones(B, N, dtype=torch.bool, device=q_BHND.device)
            key_padding_mask_BN = F.pad(key_padding_mask_BN, (0, p), value=False)
            if token_mask is not None:
                token_mask = F.pad(token_mask, (0, p, 0, p), value=False)
            if doc_ids_BN is not None:  # the padded keys are masked anyway; -1 is no document
                doc_ids_BN = F.pad(doc_ids_BN, (0, p), value=-1)
            if score_bias is not None:
                score_bias = score_bias.padded(n_pad)
        out = self.kernel(
            q_BHND,
            k_BHND,
            v_BHND,
            plan=self._plan(n_pad, q_BHND.device),
            key_padding_mask_BN=key_padding_mask_BN,
            token_mask=token_mask,
            score_bias=score_bias,
            dropout_p=self.dropout_p,
            scale=scale,
            training=self.training,
            doc_ids_BN=doc_ids_BN,
        )
        return out[:, :, :N] if n_pad != N else out

    def extra_repr(self) -> str:
        return f"kernel={self.kernel_name!r}, sparsity={self.sparsity_config!r}, dropout_p={self.dropout_p}"


def _squeeze_to(x: torch.Tensor, dims: int, what: str) -> torch.Tensor:
    while x.dim() > dims:
        if 1 not in x.shape[1:]:
            raise ValueError(f"{what} of shape {tuple(x.shape)} cannot be squeezed to {dims} dims")
        x = x.squeeze(next(d for d in range(x.dim() - 1, 0, -1) if x.shape[d] == 1))
    return x


def _mask_from_mode(x: torch.Tensor, mode: str, what: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """DeepSpeed's mask modes -> (allowed bool or None, additive bias or None).

    ``mul``: 0 means masked (-inf), anything else 0 added. ``add``: the values are added; -inf entries become
    boolean masks so that fully masked rows can return zeros instead of NaN. The mask is returned whether or not it
    has a -inf (asking would make the host wait for the device on every layer call).
    """
    if mode == "mul":
        return x != 0, None
    if mode == "add":
        x = x.float() if not x.is_floating_point() else x
        neg_inf = torch.isneginf(x)
        return ~neg_inf, x.masked_fill(neg_inf, 0.0)
    raise ValueError(f"{what} mode must be 'add' or 'mul', got {mode!r}")


class SparseSelfAttention(nn.Module):
    """Drop-in for ``deepspeed.ops.sparse_attention.SparseSelfAttention`` (0.19.5 semantics), on our kernels.

    Differences: fp32/fp16/bf16, attention dropout (``attn_dropout``), a kernel choice (``kernel``), sequence
    lengths that are not block multiples are padded instead of rejected, and plans are cached per layout (DeepSpeed
    kept one class-wide cache keyed by length, shared between different layouts).

    The methods user subclasses call or override keep DeepSpeed's behaviour: ``get_layout``, ``get_ops(H, L)``
    (the ``sdd``/``dsd`` :class:`MatMul` and :class:`Softmax` for a length, in the class-wide ``ops`` cache),
    ``transpose_key_for_scores`` and ``transpose_mask_for_sparse`` (both called by ``forward``). ``forward`` runs the
    configured kernel; a subclass that overrides ``get_ops`` gets its ops run by ``forward`` as DeepSpeed did
    (scores, softmax with the masks, context).
    """

    ops: dict = {}
    """Class-wide cache of ``get_ops`` results, as DeepSpeed's; keyed by length, block and the layout itself (DeepSpeed
    keyed by length only, so two modules with different layouts shared, and used, the first one's ops)."""

    def __init__(
        self,
        sparsity_config: SparsityConfig,
        key_padding_mask_mode: str = "add",
        attn_mask_mode: str = "mul",
        max_seq_length: int = 2048,
        *,
        kernel: str = "auto",
        attn_dropout: float = 0.0,
    ):
        super().__init__()
        for name, mode in (("key_padding_mask_mode", key_padding_mask_mode), ("attn_mask_mode", attn_mask_mode)):
            if mode not in ("add", "mul"):
                raise ValueError(f"{name} must be 'add' or 'mul', got {mode!r}")
        self.sparsity_config = sparsity_config
        self.key_padding_mask_mode = key_padding_mask_mode
        self.attn_mask_mode = attn_mask_mode
        self.attention = BlockSparseAttention(sparsity_config, kernel, max_seq_length, attn_dropout)
        # DeepSpeed's module kept its layout in a persistent buffer named master_layout: the same tensor as the inner
        # module's, so a state_dict saved by DeepSpeed (bing_bert checkpoints) loads with strict=True and restores a
        # random layout; our other buffers are not persistent, so the keys are exactly DeepSpeed's
        self.register_buffer("master_layout", self.attention.master_layout)
        self.register_load_state_dict_post_hook(SparseSelfAttention._layout_loaded)
        self._need_layout_synchronization = True

    @staticmethod
    def _layout_loaded(module: "SparseSelfAttention", incompatible_keys) -> None:
        module.attention.load_layout_state(module.master_layout)  # same tensor: drops plans made for the old one

    def get_layout(self, L: int) -> torch.Tensor:
        """The layout for length ``L`` (a multiple of the block size), on the CPU, as DeepSpeed's ``get_layout``:
        the first call in a distributed job takes rank 0's master layout (random layouts agree everywhere)."""
        import torch.distributed as dist

        if self._need_layout_synchronization and dist.is_available() and dist.is_initialized():
            dist.broadcast(self.master_layout, src=0)
            self.attention.load_layout_state(self.master_layout)
            self._need_layout_synchronization = False
        if L % self.sparsity_config.block != 0:
            raise ValueError(f"Sequence Length, {L}, needs to be dividable by Block size {self.sparsity_config.block}!")
        nb = L // self.sparsity_config.block
        return self.master_layout[..., :nb, :nb].cpu()

    def get_ops(self, H: int, L: int) -> tuple[MatMul, MatMul, Softmax]:
        """(scores ``sdd`` q k^T, context ``dsd`` p v, ``Softmax``) for length ``L`` (a block multiple), built on
        ``get_layout(L)`` once and kept in the class-wide :attr:`ops` cache (``H`` is unused, as in DeepSpeed)."""
        layout = self.get_layout(L)
        key = (L, self.sparsity_config.block, tuple(layout.shape), layout.numpy().tobytes())
        if key not in SparseSelfAttention.ops:
            block = self.sparsity_config.block
            SparseSelfAttention.ops[key] = (
                MatMul(layout, block, "sdd", trans_a=False, trans_b=True),
                MatMul(layout, block, "dsd", trans_a=False, trans_b=False),
                Softmax(layout, block),
            )
        return SparseSelfAttention.ops[key]

    def transpose_key_for_scores(self, x: torch.Tensor, L: int) -> torch.Tensor:
        """``key`` as ``[B, H, L, D]``: a key given transposed (``[B, H, D, L]``, its length dim not L) is permuted."""
        if x.size(2) != L:
            return x.permute(0, 1, 3, 2)
        return x

    def transpose_mask_for_sparse(
        self, qtype: torch.dtype, x: torch.Tensor, is_key_padding_mask: bool = False
    ) -> torch.Tensor:
        """A mask cast to the query's dtype and squeezed: a key padding mask keeps its batch dim (every other unit
        dim goes, ``[B, 1, 1, N]`` -> ``[B, N]``), an attention mask loses every unit dim (``[1, 1, N, N]`` ->
        ``[N, N]``)."""
        x = x.type(qtype)
        if is_key_padding_mask:
            for d in range(x.dim() - 1, 0, -1):
                x = x.squeeze(dim=d)
            return x
        return x.squeeze()

    def _run_ops(self, query, key, value, rpe, key_padding_mask, attn_mask) -> torch.Tensor:
        """DeepSpeed's forward through ``get_ops``: block-sparse scores, softmax with scale/rpe/masks, context."""
        _, H, L, D = query.shape
        sdd, dsd, softmax = self.get_ops(H, L)
        probs = softmax(
            sdd(query, key),
            scale=float(D) ** -0.5,
            rpe=rpe,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            key_padding_mask_mode=self.key_padding_mask_mode,
            attn_mask_mode=self.attn_mask_mode,
        )
        return dsd(probs, value)

    def forward(self, query, key, value, rpe=None, key_padding_mask=None, attn_mask=None):
        """q/k/v ``[B, H, N, D]`` (key may be ``[B, H, D, N]``); key_padding_mask ``[B, N]`` (extra unit dims are
        squeezed); attn_mask ``[N, N]``; rpe broadcastable to ``[B, H, N, N]``, added after scaling."""
        B, H, N, D = query.shape
        key = self.transpose_key_for_scores(key, N)
        if query.shape != key.shape or key.shape[:3] != value.shape[:3]:
            raise NotImplementedError("only self-attention is supported for now")
        if key_padding_mask is not None:
            key_padding_mask = self.transpose_mask_for_sparse(query.dtype, key_padding_mask, is_key_padding_mask=True)
        if attn_mask is not None:
            attn_mask = self.transpose_mask_for_sparse(query.dtype, attn_mask)
        if type(self).get_ops is not SparseSelfAttention.get_ops:  # a subclass's own ops, run as DeepSpeed ran them
            return self._run_ops(query, key, value, rpe, key_padding_mask, attn_mask)
        kpm_allow = token_allow = None
        biases: list[ScoreBias | None] = []
        if key_padding_mask is not None:
            kpm = _squeeze_to(key_padding_mask, 2, "key_padding_mask").to(query.device)
            kpm_allow, kpm_bias = _mask_from_mode(kpm, self.key_padding_mask_mode, "key_padding_mask")
            if kpm_bias is not None:
                biases.append(DenseScoreBias(kpm_bias[:, None, None, :]))
        if attn_mask is not None:
            am = _squeeze_to(attn_mask, 2, "attn_mask").to(query.device)
            token_allow, am_bias = _mask_from_mode(am, self.attn_mask_mode, "attn_mask")
            if am_bias is not None:
                biases.append(DenseScoreBias(am_bias))
        if rpe is not None:
            biases.append(DenseScoreBias(rpe))
        return self.attention(
            query,
            key,
            value,
            key_padding_mask_BN=kpm_allow,
            token_mask=None if token_allow is None else token_allow.unsqueeze(0),
            score_bias=combine_biases(*biases),
            scale=float(D) ** -0.5,
        )
