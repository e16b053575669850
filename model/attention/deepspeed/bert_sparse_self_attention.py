"""``BertSparseSelfAttention``: DeepSpeed's BERT self-attention layer with block-sparse attention (bing_bert and the
DeepSpeed sparse-attention tutorial build their models from it), on our kernels.

Same constructor (``config`` with ``hidden_size`` and ``num_attention_heads``, ``sparsity_config``), the same
``query``/``key``/``value`` linears, ``transpose_for_scores`` and ``forward(hidden_states, attention_mask)``:
``attention_mask`` is bing_bert's additive key-padding mask (``[B, 1, 1, N]`` of 0 / -10000, or any shape that
squeezes to ``[B, N]``); the result is the context ``[B, N, hidden]``.
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention.deepspeed.sparse_self_attention import SparseSelfAttention
from model.attention.layouts import FixedSparsityConfig, SparsityConfig


class BertSparseSelfAttention(nn.Module):
    def __init__(self, config, sparsity_config: SparsityConfig = FixedSparsityConfig(num_heads=4)):
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(
                f"The hidden size ({config.hidden_size}) is not a multiple of the number of attention "
                f"heads ({config.num_attention_heads})"
            )
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = int(config.hidden_size / config.num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        max_len = getattr(config, "max_position_embeddings", 2048)
        self.sparse_self_attention = SparseSelfAttention(sparsity_config, max_seq_length=max(max_len, 2048))

    def transpose_for_scores(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N, heads x d]`` -> ``[B, heads, N, d]``."""
        x = x.view(*x.size()[:-1], self.num_attention_heads, self.attention_head_size)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        q_BHND = self.transpose_for_scores(self.query(hidden_states))
        k_BHND = self.transpose_for_scores(self.key(hidden_states))
        v_BHND = self.transpose_for_scores(self.value(hidden_states))
        ctx_BHND = self.sparse_self_attention(q_BHND, k_BHND, v_BHND, key_padding_mask=attention_mask)
        ctx_BNHD = ctx_BHND.permute(0, 2, 1, 3).contiguous()
        return ctx_BNHD.view(*ctx_BNHD.size()[:-2], self.all_head_size)
