"""Hugging Face config of an exported sparse-attention BERT (written by tools/hf_export; depends on torch and
transformers only). ``sparse_bert`` holds the full training-time model config (layouts, head size, positional
variants); the usual BERT fields mirror it so that generic tooling reads the sizes."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from .ours_config import ModelConfig


@dataclass(repr=False)
class SparseBertConfig(PretrainedConfig):
    model_type = "sparsebert"

    sparse_bert: dict | None = None
    token_mask_lengths: dict | None = None
    """``{"layer{i}": n}`` of every layer with a stored SparseBERT token mask (the ``token_masks`` buffers' size)."""
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    classifier_dropout: float | None = None

    def __post_init__(self, **kwargs):
        ours = self.model_config()  # validates the stored config
        self.sparse_bert = ours.to_dict()
        self.vocab_size = ours.vocab_size
        self.hidden_size = ours.hidden_size
        self.num_hidden_layers = ours.num_layers
        self.num_attention_heads = ours.num_attention_heads
        self.intermediate_size = ours.intermediate_size
        self.max_position_embeddings = ours.max_position_embeddings
        self.type_vocab_size = ours.type_vocab_size
        self.hidden_dropout_prob = ours.hidden_dropout
        self.attention_probs_dropout_prob = ours.attention_dropout
        self.layer_norm_eps = ours.layer_norm_eps
        self.initializer_range = ours.initializer_range
        self.pad_token_id = ours.pad_token_id
        super().__post_init__(**kwargs)

    def model_config(self) -> ModelConfig:
        """Our training-time ModelConfig (the single source of every architectural setting, dropouts included)."""
        d = dict(self.sparse_bert) if self.sparse_bert else ModelConfig().to_dict()
        return ModelConfig.from_dict(d)

    def build_config(self) -> ModelConfig:
        """The config the modules are built from: every fixed token mask replaced by a stand-in of the same size
        (``no_diagonal``), so building never draws a random pattern nor reads a mask file; the real masks are the
        ``token_masks`` buffers loaded with the weights."""
        d = self.model_config().to_dict()
        lengths = dict(self.token_mask_lengths or {})
        att = d["attention"]
        per = att.get("per_layer")

        def stand_in(tm: dict, n: int) -> dict:
            return {"pattern": "no_diagonal", "seq_len": int(n), "block": tm.get("block", 16)}

        top = att.get("token_mask")
        if top is not None and top.get("pattern") != "dam":
            users = [i for i in range(d["num_layers"]) if per is None or "token_mask" not in per[i]]
            n = next((lengths[f"layer{i}"] for i in users if f"layer{i}" in lengths), d["max_position_embeddings"])
            att["token_mask"] = stand_in(top, n)
        for i, entry in enumerate(per or []):
            tm = entry.get("token_mask")
            if tm is not None:
                entry["token_mask"] = stand_in(tm, lengths.get(f"layer{i}", d["max_position_embeddings"]))
        return ModelConfig.from_dict(d)
