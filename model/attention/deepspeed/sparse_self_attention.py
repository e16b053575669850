"""``SparseSelfAttention``: DeepSpeed 0.19.5's module (``deepspeed.ops.sparse_attention.sparse_self_attention``) on
our :class:`~model.attention.module.BlockSparseAttention`: DeepSpeed's constructor, ``forward``, mask modes and the
methods user subclasses call or override."""

from __future__ import annotations

import torch
import torch.nn as nn

from model.attention.bias import DenseScoreBias, ScoreBias, combine_biases
from model.attention.deepspeed.block_sparse_ops import MatMul, Softmax
from model.attention.layouts import SparsityConfig
from model.attention.module import BlockSparseAttention


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
