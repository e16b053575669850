"""``SparseAttentionUtils``: DeepSpeed's helpers to make a pretrained Hugging Face BERT/RoBERTa sparse (longer
positions, sparse self-attention layers, padding to the block size), working on transformers 5.

What changed since DeepSpeed 0.19.5 wrote them, and what we do about it:
- transformers 5's embeddings keep ``position_ids`` and ``token_type_ids`` buffers of the old length: they are
  extended with the position table (DeepSpeed grew only the weights, so longer inputs failed);
- transformers 5's ``BertAttention`` calls ``self.self(hidden_states, attention_mask=..., **kwargs)`` with a 4-D mask
  (additive or boolean, or None) and expects ``(context, attention_weights)``: the replacement layer accepts that and
  returns that; called bing_bert-style (``forward(hidden_states, attention_mask)``) it still returns the context;
- DeepSpeed's ``replace_model_self_attention_with_sparse_self_attention`` called a method the model does not have;
  ours calls :meth:`SparseAttentionUtils.replace_self_attention_layer_with_sparse_self_attention_layer`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.attention.deepspeed.bert_sparse_self_attention import BertSparseSelfAttention
from model.attention.layouts import SparsityConfig


class _HFSparseSelfAttention(BertSparseSelfAttention):
    """A BertSparseSelfAttention that also speaks transformers 5's self-attention protocol."""

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        """transformers 5 calls with keywords (encoder_hidden_states=..., ...) and unpacks (context, weights);
        bing_bert-style code calls ``(hidden_states, attention_mask)`` and gets the context."""
        kpm = attention_mask
        if attention_mask is not None and attention_mask.dim() == 4:
            row = attention_mask[:, 0, 0, :]  # a padding mask: every query row masks the same keys
            kpm = torch.where(row, 0.0, float("-inf")) if row.dtype == torch.bool else row
        ctx = super().forward(hidden_states, kpm)
        return (ctx, None) if kwargs else ctx


def _embeddings(model):
    for name in ("bert", "roberta"):
        if hasattr(model, name):
            return name, getattr(model, name).embeddings
    raise ValueError(
        'Please extend "extend_position_embedding" function to support your model type. It currently '
        'only supports "bert" & "roberta"!'
    )


class SparseAttentionUtils:
    """DeepSpeed 0.19.5's static helpers, same names and signatures."""

    @staticmethod
    def extend_position_embedding(model, max_position: int):
        """Grow the position table to ``max_position`` by repeating the trained rows (RoBERTa keeps its 2 offset rows
        first), and the embeddings' position/token-type id buffers with it."""
        kind, emb = _embeddings(model)
        weight = emb.position_embeddings.weight
        offset = 2 if kind == "roberta" else 0
        original = weight.size(0) - offset
        if not max_position > original:
            raise ValueError(f"max_position {max_position} must be larger than the current {original}")
        multiples = max(1, max_position // original)
        rows = [weight.data[:offset]] + [weight.data[offset:]] * multiples
        new = torch.cat(rows, 0)
        new_size = offset + original * multiples
        emb.position_embeddings.weight = torch.nn.Parameter(new, requires_grad=weight.requires_grad)
        emb.position_embeddings.num_embeddings = new_size
        if hasattr(emb, "position_ids"):
            emb.register_buffer(
                "position_ids", torch.arange(new_size, device=new.device).expand((1, -1)), persistent=False
            )
        if hasattr(emb, "token_type_ids") and isinstance(emb.token_type_ids, torch.Tensor):
            emb.register_buffer(
                "token_type_ids", torch.zeros((1, new_size), dtype=torch.long, device=new.device), persistent=False
            )
        model.config.max_position_embeddings = offset + max_position
        print(f"Extended position embeddings to {original * multiples}")
        return model

    @staticmethod
    def update_tokenizer_model_max_length(tokenizer, max_position: int):
        tokenizer.model_max_length = max_position
        tokenizer.init_kwargs["model_max_length"] = max_position
        print(f"updated tokenizer model max imum length to {max_position}")
        return tokenizer

    @staticmethod
    def replace_model_self_attention_with_sparse_self_attention(
        model, max_position: int, sparsity_config: SparsityConfig = SparsityConfig(num_heads=4)
    ):
        if hasattr(model, "bert"):
            model.config.max_position_embeddings = max_position
            layers = model.bert.encoder.layer
        elif hasattr(model, "roberta"):
            model.config.max_position_embeddings = max_position + 2
            layers = model.roberta.encoder.layer
        else:
            raise ValueError(
                'Please extend "update_model_self_attention_to_sparse_self_attention" function to '
                'support your model type. It currently only supports "bert" & "roberta"!'
            )
        SparseAttentionUtils.replace_self_attention_layer_with_sparse_self_attention_layer(
            model.config, layers, sparsity_config
        )
        return model

    @staticmethod
    def replace_self_attention_layer_with_sparse_self_attention_layer(
        config, layers, sparsity_config: SparsityConfig = SparsityConfig(num_heads=4)
    ):
        """Each layer's ``attention.self`` becomes a sparse self-attention that keeps the trained q/k/v linears."""
        for layer in layers:
            old = layer.attention.self
            new = _HFSparseSelfAttention(config, sparsity_config).to(old.query.weight.device)
            new.query, new.key, new.value = old.query, old.key, old.value
            layer.attention.self = new
        return layers

    @staticmethod
    def pad_to_block_size(
        block_size,
        input_ids,
        attention_mask,
        token_type_ids,
        position_ids,
        inputs_embeds,
        pad_token_id,
        model_embeddings,
    ):
        """Pad the sequence dimension to a multiple of ``block_size``; returns (pad_len, input_ids, attention_mask,
        token_type_ids, position_ids, inputs_embeds) with the padding masked in ``attention_mask``."""
        batch_size, seq_len = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
        pad_len = (block_size - seq_len % block_size) % block_size
        if pad_len > 0:
            if inputs_embeds is not None:
                pad_ids = inputs_embeds.new_full((batch_size, pad_len), pad_token_id, dtype=torch.long)
                inputs_embeds = torch.cat([inputs_embeds, model_embeddings(pad_ids)], dim=-2)
            if input_ids is not None:
                input_ids = F.pad(input_ids, (0, pad_len), value=pad_token_id)
            if position_ids is not None:
                position_ids = F.pad(position_ids, (0, pad_len), value=pad_token_id)
            attention_mask = F.pad(attention_mask, (0, pad_len), value=False)
            token_type_ids = F.pad(token_type_ids, (0, pad_len), value=0)
        return pad_len, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds

    @staticmethod
    def unpad_sequence_output(pad_len: int, sequence_output: torch.Tensor) -> torch.Tensor:
        if pad_len > 0:
            sequence_output = sequence_output[:, :-pad_len]
        return sequence_output
