"""Model FLOPs per trained token: the one formula the trainer's log (TFLOP/s, MFU) and the benchmarks
(``python -m benchmarks.step``: benchmarks/step/) count with.

"Model FLOPs" (no recomputation; forward + backward = 3 x forward; a multiply-add is 2 FLOPs), per token:
- the encoder's matmuls: 6 x L x (Q, K, V and output projections 4 h a + the feed-forward 2 h f, 3 h f for GLU),
  where a = heads x head size and f the FFN width; 72 L h^2 for BERT's shapes (a = h, f = 4h);
- attention scores and context: 12 L N a x density (QK^T and PV, 2 N a FLOPs each per token, forward), density the
  share of (query, key) pairs the block layout keeps: 1 for dense, about 1/n for BlockBERT n (token-level masks
  are not counted: the kernels compute their blocks in full);
- the MLM head on the labelled tokens only: 6 (h^2 + V h) x the labelled share (the mask rate), V the real vocabulary.

This is the work the model needs (PaLM's MFU), not what an implementation spends, so a change that does less work
raises MFU. Not counted (tests/test_flops.py measures each against torch's FlopCounterMode): the head's unused slots
(the static gather runs the head on max_predictions slots per row, 120 at N=512 for ~77 labelled tokens), the
padded vocabulary rows (pad_vocab_multiple), the chunked loss's recompute of the head in the backward, and the
softmax, LayerNorm, GELU and dropout FLOPs (the counter counts none of them either).
"""

from __future__ import annotations

from model.config import ModelConfig


def flops_per_token(
    hidden: int,
    layers: int,
    seq_len: int,
    vocab: int,
    density: float,
    predicted: float,
    *,
    attention_width: int | None = None,
    ffn: int | None = None,
    glu: bool = False,
) -> float:
    """Model FLOPs per trained token (module docstring); ``attention_width`` (heads x head size) defaults to
    ``hidden`` and ``ffn`` to 4 x ``hidden``, BERT's shapes."""
    a = hidden if attention_width is None else attention_width
    f = 4 * hidden if ffn is None else ffn
    encoder = 6 * layers * (4 * hidden * a + (3 if glu else 2) * hidden * f)
    attention = 12 * layers * seq_len * a * density
    head = 6 * (hidden**2 + vocab * hidden) * predicted
    return encoder + attention + head


def layout_density(config: ModelConfig, seq_len: int) -> float:
    """Share of (query, key) pairs the layers' block layouts keep at ``seq_len`` (padded as the model pads), averaged
    over layers; 1.0 for full attention."""
    total = 0.0
    for i in range(config.num_layers):
        _, layout = config.attention.for_layer(i, config.num_attention_heads)
        if layout is None:
            total += 1.0
        else:
            total += float(layout.make_layout(layout.padded_length(seq_len)).float().mean())
    return total / config.num_layers


def model_flops_per_token(config: ModelConfig, seq_len: int, predicted: float) -> float:
    """:func:`flops_per_token` of a model config at ``seq_len``, ``predicted`` the share of tokens the MLM head
    predicts."""
    return flops_per_token(
        config.hidden_size,
        config.num_layers,
        seq_len,
        config.vocab_size,
        layout_density(config, seq_len),
        predicted,
        attention_width=config.num_attention_heads * config.attention_head_size,
        ffn=config.intermediate_size,
        glu=config.ffn_type == "glu",
    )
