"""Our parameter names <-> Hugging Face ``BertForMaskedLM`` / ``BertForPreTraining`` names, in one place.

The conversion tools reuse these two functions. Hugging Face BERT has post-LN, head size = hidden/heads and no
sparse attention: :func:`to_hf` refuses models it cannot represent (pre-LN, a free head size), and stores our full
model config under the ``sparse_bert`` key of the HF config dict, so :func:`from_hf` restores sparse layouts.
"""

from __future__ import annotations

from typing import Any

import torch

from model.config import SIZE_FIELDS, AttentionConfig, ModelConfig
from tools.hf_export.stock_modernbert import HF_ACT, OUR_ACT, stock_modernbert_reason
from tools.hf_export.tied import check_tied_and_rest

_HF_IGNORED = ("position_ids", "token_type_ids")  # buffers some transformers versions keep in state dicts

_EMB = {
    "bert.embeddings.word_embeddings.weight": "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.position_embeddings.weight": "bert.embeddings.position_embeddings.weight",
    "bert.embeddings.token_type_embeddings.weight": "bert.embeddings.token_type_embeddings.weight",
    "bert.embeddings.layer_norm.weight": "bert.embeddings.LayerNorm.weight",
    "bert.embeddings.layer_norm.bias": "bert.embeddings.LayerNorm.bias",
    "cls.bias": "cls.predictions.bias",
    "cls.transform.dense.weight": "cls.predictions.transform.dense.weight",
    "cls.transform.dense.bias": "cls.predictions.transform.dense.bias",
    "cls.transform.layer_norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "cls.transform.layer_norm.bias": "cls.predictions.transform.LayerNorm.bias",
}
_NSP = {
    "cls.pooler.weight": "bert.pooler.dense.weight",
    "cls.pooler.bias": "bert.pooler.dense.bias",
    "cls.seq_relationship.weight": "cls.seq_relationship.weight",
    "cls.seq_relationship.bias": "cls.seq_relationship.bias",
}
_LAYER = {
    "attention.out_proj.{}": "attention.output.dense.{}",
    "attn_layer_norm.{}": "attention.output.LayerNorm.{}",
    "ffn_in.{}": "intermediate.dense.{}",
    "ffn_out.{}": "output.dense.{}",
    "ffn_layer_norm.{}": "output.LayerNorm.{}",
}


def _name_map(config: ModelConfig) -> dict[str, str]:
    m = dict(_EMB)
    if config.type_vocab_size == 0:
        del m["bert.embeddings.token_type_embeddings.weight"]
    if config.nsp_head:
        m.update(_NSP)
    for i in range(config.num_layers):
        for ours, theirs in _LAYER.items():
            for p in ("weight", "bias"):
                m[f"bert.encoder.layers.{i}.{ours.format(p)}"] = f"bert.encoder.layer.{i}.{theirs.format(p)}"
    return m


STOCK_FIELDS = {
    *SIZE_FIELDS,
    "type_vocab_size",
    "hidden_dropout",
    "attention_dropout",
    "layer_norm_eps",
    "hidden_act",
    "initializer_range",
    "pad_token_id",
    "nsp_head",
    "head_size",
    "attention",
    "pad_vocab_multiple",  # padding inside the decoder GEMM only: the same function and weights
}
"""ModelConfig fields Hugging Face BERT has; any other field away from its default needs our code."""


def stock_bert_reason(config: ModelConfig, weights_only: bool = False) -> str | None:
    """Why stock Hugging Face BERT cannot represent this model, or None if it can: the one place that decides.

    ``weights_only=True`` asks whether the weights map onto HF BERT's names (what :func:`to_hf` / :func:`from_hf`
    need; a sparse layout or token mask then travels in the config's ``sparse_bert`` entry); False whether stock
    ``BertForMaskedLM`` computes exactly this model (what the converter needs to skip the remote code)."""
    if config.pre_layer_norm:
        return "Hugging Face BertForMaskedLM is post-LN; a pre_layer_norm model cannot be exported to it"
    if config.head_size is not None and config.head_size * config.num_attention_heads != config.hidden_size:
        return f"Hugging Face BERT needs head_size = hidden_size / heads; this model has head_size {config.head_size}"
    if config.position.type != "absolute" or config.segment != "input":
        return (
            f"Hugging Face BERT has input position/segment embeddings only; this model uses position "
            f"{config.position.type!r} and segment {config.segment!r} (export it as remote code)"
        )
    if config.attention.dam() is not None:
        return (
            "a DAM-search model has learned mask parameters Hugging Face BERT cannot hold; export the mask "
            "(export_learned_masks) and convert the stage-2 model instead"
        )
    if config.hidden_act not in HF_ACT:
        return f"hidden_act {config.hidden_act!r} has no Hugging Face equivalent"
    if config.ffn_type != "standard" or not config.linear_bias or not config.norm_bias:
        return (
            f"Hugging Face BERT has a standard feed-forward with biases everywhere; this model has ffn_type "
            f"{config.ffn_type!r}, linear_bias {config.linear_bias}, norm_bias {config.norm_bias}"
        )
    if weights_only:
        return None
    default = ModelConfig().to_dict()
    d = config.to_dict()
    extra = sorted(k for k in d if k not in STOCK_FIELDS and d[k] != default[k])
    if extra:
        return f"settings stock BERT lacks: {extra}"
    if config.type_vocab_size == 0:
        return "no segment embeddings (type_vocab_size 0; HF BERT would index an empty table)"
    for i in range(config.num_layers):
        if config.attention.for_layer(i, config.num_attention_heads)[1] is not None:
            return f"sparse attention (layer {i})"
        tm = config.attention.token_mask_for_layer(i)
        if tm is not None:
            return f"SparseBERT token mask {tm.pattern!r} (layer {i})"
    return None


STOCK_ARCHITECTURES = {"bert": "BertForMaskedLM", "modernbert": "ModernBertForMaskedLM"}
"""Stock transformers classes an export can be (``model_type`` -> MLM class); everything else is remote code."""


def stock_export(config: ModelConfig) -> tuple[str | None, str | None]:
    """``(model_type, None)`` when a stock transformers class computes exactly this model ("bert": BERT's
    architecture, sparse or not expressible; "modernbert": rotary + GeGLU + pre-LN with full / exact-window
    layers), else ``(None, why not)`` with the reason of each: the converter's one decision between stock and
    remote code."""
    bert = stock_bert_reason(config)
    if bert is None:
        return "bert", None
    modern = stock_modernbert_reason(config)
    if modern is None:
        return "modernbert", None
    return None, f"stock BERT: {bert}; stock ModernBERT: {modern}"


def _check_representable(config: ModelConfig) -> None:
    reason = stock_bert_reason(config, weights_only=True)
    if reason is not None:
        raise ValueError(reason)


def to_hf(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Our state dict -> (HF ``BertForMaskedLM``/``BertForPreTraining`` state dict, HF ``BertConfig`` dict)."""
    _check_representable(config)
    names = _name_map(config)
    out: dict[str, torch.Tensor] = {}
    expected = set(names) | {
        f"bert.encoder.layers.{i}.attention.qkv.{p}" for i in range(config.num_layers) for p in ("weight", "bias")
    }
    missing = sorted(expected - set(state_dict))
    unknown = sorted(set(state_dict) - expected)
    if missing or unknown:
        raise ValueError(f"state dict does not match the config: missing {missing[:5]}, unexpected {unknown[:5]}")
    for ours, theirs in names.items():
        out[theirs] = state_dict[ours]
    for i in range(config.num_layers):
        for p in ("weight", "bias"):
            q, k, v = state_dict[f"bert.encoder.layers.{i}.attention.qkv.{p}"].chunk(3, dim=0)
            for name, t in (("query", q), ("key", k), ("value", v)):
                out[f"bert.encoder.layer.{i}.attention.self.{name}.{p}"] = t.clone()
    out["cls.predictions.decoder.weight"] = state_dict["bert.embeddings.word_embeddings.weight"]
    out["cls.predictions.decoder.bias"] = state_dict["cls.bias"]
    hf_config = {
        "model_type": "bert",
        "architectures": ["BertForPreTraining" if config.nsp_head else "BertForMaskedLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": HF_ACT[config.hidden_act],
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": True,
        "sparse_bert": config.to_dict(),
    }
    return out, hf_config


def from_hf(hf_state_dict: dict[str, torch.Tensor], hf_config: Any) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """HF BERT state dict + config (``BertConfig`` or its dict) -> (our state dict, ModelConfig).

    A config written by :func:`to_hf` restores our full config (sparse attention included); a plain HF config
    gives a dense post-LN model. ``cls.predictions.decoder.weight`` must equal the word embeddings (tied).
    """
    cfg = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    if cfg.get("sparse_bert"):
        config = ModelConfig.from_dict(cfg["sparse_bert"])
    else:
        if cfg.get("hidden_act", "gelu") not in OUR_ACT:
            raise ValueError(f"HF hidden_act {cfg.get('hidden_act')!r} is not supported; use one of {sorted(OUR_ACT)}")
        sd_keys = set(hf_state_dict)
        config = ModelConfig(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            max_position_embeddings=cfg["max_position_embeddings"],
            type_vocab_size=cfg.get("type_vocab_size", 2),
            hidden_dropout=cfg.get("hidden_dropout_prob", 0.1),
            attention_dropout=cfg.get("attention_probs_dropout_prob", 0.1),
            layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
            hidden_act=OUR_ACT[cfg.get("hidden_act", "gelu")],
            initializer_range=cfg.get("initializer_range", 0.02),
            pad_token_id=cfg.get("pad_token_id") or 0,
            nsp_head="cls.seq_relationship.weight" in sd_keys,
            attention=AttentionConfig(kernel="dense"),
        )
    _check_representable(config)
    sd = {k: v for k, v in hf_state_dict.items() if not k.endswith(_HF_IGNORED)}
    out: dict[str, torch.Tensor] = {}
    for ours, theirs in _name_map(config).items():
        if theirs not in sd:
            raise ValueError(f"Hugging Face state dict lacks {theirs!r} (needed for our {ours!r})")
        out[ours] = sd.pop(theirs)
    for i in range(config.num_layers):
        for p in ("weight", "bias"):
            parts = [sd.pop(f"bert.encoder.layer.{i}.attention.self.{n}.{p}") for n in ("query", "key", "value")]
            out[f"bert.encoder.layers.{i}.attention.qkv.{p}"] = torch.cat(parts, 0)
    tied = {
        "cls.predictions.decoder.weight": (
            out["bert.embeddings.word_embeddings.weight"],
            "the word embeddings; our MLM decoder is tied",
        ),
        "cls.predictions.decoder.bias": (out["cls.bias"], "cls.predictions.bias"),
    }
    check_tied_and_rest(sd, tied, "Hugging Face")
    return out, config
