"""``dense``: SDPA over all N x N scores with the layout expanded to a token mask. The reference; O(N^2).

Packed rows of full attention that carry ``cu_seqlens`` take the varlen route on CUDA instead (no N x N mask:
model/attention/kernels/varlen.py); elsewhere the same-document mask, which is exact."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.attention.band import dense_mask
from model.attention.kernels.registry import Call, Kernel, register_kernel, same_document
from model.attention.kernels.sdpa import sdpa_with_allow
from model.attention.kernels.varlen import varlen_attention, varlen_refusal


@dataclass
class DensePlan:
    """The layout (and the fixed token mask) expanded to one bool ``[H|1, N, N]`` mask; None = everything."""

    allow_HNN: torch.Tensor | None

    def varlen_fits(self, call: Call) -> bool:
        """The varlen route serves packed rows of full attention: nothing but the documents masks (no layout, token
        mask, key mask or score bias)."""
        return (
            self.allow_HNN is None
            and call.key_padding_mask_BN is None
            and call.token_mask is None
            and (call.score_bias is None)
        )

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        key_padding_mask_BN, token_mask, score_bias, dropout_p, scale = call
        N = q_BHND.shape[2]
        if call.cu_seqlens is not None and self.varlen_fits(call) and varlen_refusal(q_BHND, dropout_p) is None:
            return varlen_attention(q_BHND, k_BHND, v_BHND, call.cu_seqlens, dropout_p, scale)
        allow = self.allow_HNN
        if token_mask is not None:
            allow = token_mask if allow is None else allow & token_mask
        per_row = None  # [B, 1, N|1, N]: what differs between rows of the batch
        if key_padding_mask_BN is not None:
            per_row = key_padding_mask_BN[:, None, None, :]
        if call.doc_ids_BN is not None:
            same = same_document(call.doc_ids_BN, call.doc_ids_BN).unsqueeze(1)
            per_row = same if per_row is None else per_row & same
        if per_row is not None:
            allow = per_row if allow is None else allow.unsqueeze(0) & per_row
        bias = None if score_bias is None else score_bias.dense(N)
        return sdpa_with_allow(q_BHND, k_BHND, v_BHND, allow, bias, dropout_p, scale)


@register_kernel("dense")
class DenseKernel(Kernel):
    """SDPA with the layout as a mask: the reference every other kernel is tested against."""

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None, family=None) -> DensePlan:
        tm = None if token_mask is None else dense_mask(token_mask, device).to(device=device, dtype=torch.bool)
        if layout_HMM is None:
            return DensePlan(tm)
        lay = layout_HMM.to(device=device, dtype=torch.bool).repeat_interleave(block, 1).repeat_interleave(block, 2)
        return DensePlan(lay if tm is None else lay & tm)
