"""Our parameter names <-> Hugging Face ``ModernBertForMaskedLM`` names, and when stock ModernBERT computes our model.

A model with rotary positions, pre-LN, GeGLU, no attention LayerNorm in layer 0 and, per layer, either full
attention (global layers) or the exact ``sliding_window`` token mask (local layers of ``attention.global_every``,
one window for all) is exactly transformers' ModernBERT: :func:`to_hf_modernbert` writes its weights and a
``ModernBertConfig`` dict (``layer_types`` listed layer by layer, so any global/local cadence exports), which loads
without remote code. :func:`stock_modernbert_reason` says why a model is not one (a block layout or BlockBERT on a
layer, DIET positions, ...); those keep the remote-code export. Our full config rides along under ``sparse_bert``,
so :func:`from_hf_modernbert` restores it; a plain ModernBERT config (e.g. ``answerdotai/ModernBERT-base``) gives the
equivalent ModelConfig.

Dropout: ModernBERT drops after the GeGLU product (``mlp_dropout``) and after the attention output projection
(``attention_dropout``); we drop after each sublayer (``hidden_dropout``). The export maps hidden_dropout to
embedding/mlp dropout and attention_dropout to attention dropout: evaluation is identical, fine-tuning with dropout
on places it slightly differently. ModernBERT trained without dropout (the presets' 0.0).
"""

from __future__ import annotations

from typing import Any

import torch

from model.config import SIZE_FIELDS, ModelConfig
from tools.hf_export.tied import check_tied_and_rest

HF_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
"""Our hidden_act -> transformers' ACT2FN name (the same function; BERT and ModernBERT configs alike)."""
OUR_ACT = {v: k for k, v in HF_ACT.items()} | {"gelu_new": "gelu_tanh"}
"""transformers' activation name -> our hidden_act (BERT and ModernBERT use the same names)."""
_WINDOW_PATTERN = "sliding_window"


def _window_of_layer(config: ModelConfig, i: int) -> tuple[int | None, str | None]:
    """(window of a stock-expressible local layer or None for a full-attention global layer, reason it is neither)."""
    att = config.attention
    _, layout = att.for_layer(i, config.num_attention_heads)
    tm = att.token_mask_for_layer(i)
    if att.is_global(i):
        if layout is not None or tm is not None:
            what = f"layout {layout.mode!r}" if layout is not None else f"token mask {tm.pattern!r}"
            return None, (
                f"layer {i} is a global layer with {what}; stock ModernBERT's global layers attend to every token "
                "(a window layer must be a local layer of attention.global_every, with rope_theta_local)"
            )
        return None, None
    if layout is not None:
        return None, (
            f"local layer {i} uses the block layout {layout.mode!r}; stock ModernBERT's window is token-exact "
            f"(use attention.local = {{'token_mask': {{'pattern': '{_WINDOW_PATTERN}', 'window': W}}}})"
        )
    if tm is None or tm.pattern != _WINDOW_PATTERN or tm.drop_diagonal:
        what = "no mask" if tm is None else f"token mask {tm.pattern!r}" + (" without diagonal" * tm.drop_diagonal)
        return None, f"local layer {i} has {what}; stock ModernBERT's local layers are the '{_WINDOW_PATTERN}' band"
    return tm.params.window, None


def stock_modernbert_reason(config: ModelConfig) -> str | None:
    """Why stock ``transformers.ModernBertForMaskedLM`` cannot compute exactly this model, or None if it can."""
    c = config
    if c.position.type != "rotary":
        return f"ModernBERT has rotary positions; this model uses position {c.position.type!r}"
    if c.segment != "input" or c.type_vocab_size != 0:
        return (
            f"ModernBERT has no segment information; this model has type_vocab_size {c.type_vocab_size} and "
            f"segment {c.segment!r} (set type_vocab_size 0)"
        )
    if not c.pre_layer_norm or c.first_attn_norm:
        return (
            "ModernBERT is pre-LN without an attention LayerNorm in layer 0; this model has pre_layer_norm "
            f"{c.pre_layer_norm}, first_attn_norm {c.first_attn_norm}"
        )
    if c.ffn_type != "glu":
        return f"ModernBERT's feed-forward is a GLU; this model has ffn_type {c.ffn_type!r}"
    if c.head_size is not None and c.head_size * c.num_attention_heads != c.hidden_size:
        return f"ModernBERT needs head_size = hidden_size / heads; this model has head_size {c.head_size}"
    if c.hidden_act not in HF_ACT:
        return f"hidden_act {c.hidden_act!r} has no transformers equivalent"
    if c.nsp_head:
        return "ModernBertForMaskedLM has no next-sentence head; this model has nsp_head true"
    if c.attention.dam() is not None:
        return "a DAM-search model has learned mask parameters stock ModernBERT cannot hold"
    known = set(_CONFIG_FIELDS)
    default, d = ModelConfig().to_dict(), c.to_dict()
    extra = sorted(k for k in d if k not in known and d[k] != default[k])
    if extra:
        return f"settings stock ModernBERT lacks: {extra}"
    windows = set()
    for i in range(c.num_layers):
        window, reason = _window_of_layer(c, i)
        if reason is not None:
            return reason
        if window is not None:
            windows.add(window)
    if len(windows) > 1:
        return f"ModernBERT has one local window for all local layers; this model has {sorted(windows)}"
    return None


_CONFIG_FIELDS = (
    *SIZE_FIELDS,
    "type_vocab_size",
    "hidden_dropout",
    "attention_dropout",
    "layer_norm_eps",
    "pre_layer_norm",
    "nsp_head",
    "head_size",
    "hidden_act",
    "initializer_range",
    "pad_token_id",
    "attention",
    "position",
    "segment",
    "ffn_type",
    "linear_bias",
    "norm_bias",
    "first_attn_norm",
    "pad_vocab_multiple",
)
"""ModelConfig fields :func:`stock_modernbert_reason` checks; a new field away from its default needs our code."""


def _name_map(config: ModelConfig) -> dict[str, str]:
    """Ours -> theirs for every parameter of the model (biases as the config has them; decoder weight tied)."""
    lin = ("weight", "bias") if config.linear_bias else ("weight",)
    norm = ("weight", "bias") if config.norm_bias else ("weight",)
    m = {"bert.embeddings.word_embeddings.weight": "model.embeddings.tok_embeddings.weight", "cls.bias": "decoder.bias"}
    for p in norm:
        m[f"bert.embeddings.layer_norm.{p}"] = f"model.embeddings.norm.{p}"
        m[f"bert.encoder.final_layer_norm.{p}"] = f"model.final_norm.{p}"
        m[f"cls.transform.layer_norm.{p}"] = f"head.norm.{p}"
    for p in lin:
        m[f"cls.transform.dense.{p}"] = f"head.dense.{p}"
    for i in range(config.num_layers):
        ours, theirs = f"bert.encoder.layers.{i}.", f"model.layers.{i}."
        for p in lin:
            m[f"{ours}attention.qkv.{p}"] = f"{theirs}attn.Wqkv.{p}"
            m[f"{ours}attention.out_proj.{p}"] = f"{theirs}attn.Wo.{p}"
            m[f"{ours}ffn_in.{p}"] = f"{theirs}mlp.Wi.{p}"
            m[f"{ours}ffn_out.{p}"] = f"{theirs}mlp.Wo.{p}"
        for p in norm:
            if i > 0:  # layer 0 has no attention LayerNorm (checked by stock_modernbert_reason)
                m[f"{ours}attn_layer_norm.{p}"] = f"{theirs}attn_norm.{p}"
            m[f"{ours}ffn_layer_norm.{p}"] = f"{theirs}mlp_norm.{p}"
    return m


def hf_modernbert_config(config: ModelConfig) -> dict[str, Any]:
    """The ``ModernBertConfig`` dict of a stock-expressible model (our config kept under ``sparse_bert``)."""
    c = config
    windows = [w for w in (_window_of_layer(c, i)[0] for i in range(c.num_layers)) if w is not None]
    act = HF_ACT[c.hidden_act]
    return {
        "model_type": "modernbert",
        "architectures": ["ModernBertForMaskedLM"],
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_attention_heads,
        "hidden_activation": act,
        "classifier_activation": act,
        "max_position_embeddings": c.max_position_embeddings,
        "initializer_range": c.initializer_range,
        "norm_eps": c.layer_norm_eps,
        "norm_bias": c.norm_bias,
        "attention_bias": c.linear_bias,
        "mlp_bias": c.linear_bias,
        "classifier_bias": c.linear_bias,
        "decoder_bias": True,
        "attention_dropout": c.attention_dropout,
        "embedding_dropout": c.hidden_dropout,
        "mlp_dropout": c.hidden_dropout,
        "layer_types": [
            "full_attention" if c.attention.is_global(i) else "sliding_attention" for i in range(c.num_layers)
        ],
        "local_attention": windows[0] if windows else 128,  # unused when every layer is global
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": c.position.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": c.position.rope_theta_local},
        },
        "pad_token_id": c.pad_token_id,
        "bos_token_id": None,
        "eos_token_id": None,
        "cls_token_id": None,
        "sep_token_id": None,
        "tie_word_embeddings": True,
        "sparse_bert": c.to_dict(),
    }


def to_hf_modernbert(
    state_dict: dict[str, torch.Tensor], config: ModelConfig
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Our state dict -> (``ModernBertForMaskedLM`` state dict without the tied decoder weight, config dict)."""
    reason = stock_modernbert_reason(config)
    if reason is not None:
        raise ValueError(f"stock ModernBERT cannot express this model: {reason}")
    names = _name_map(config)
    missing, unknown = sorted(set(names) - set(state_dict)), sorted(set(state_dict) - set(names))
    if missing or unknown:
        raise ValueError(f"state dict does not match the config: missing {missing[:5]}, unexpected {unknown[:5]}")
    return {theirs: state_dict[ours] for ours, theirs in names.items()}, hf_modernbert_config(config)


def _config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    """The ModelConfig equal to a plain ModernBERT config (no ``sparse_bert`` entry)."""
    act = cfg.get("hidden_activation", "gelu")
    if act not in OUR_ACT or cfg.get("classifier_activation", "gelu") != act:
        raise ValueError(
            f"ModernBERT hidden_activation {act!r} / classifier_activation {cfg.get('classifier_activation')!r}: "
            f"both must be the same one of {sorted(OUR_ACT)}"
        )
    biases = {cfg.get(k, False) for k in ("attention_bias", "mlp_bias", "classifier_bias")}
    if len(biases) != 1 or not cfg.get("decoder_bias", True):
        raise ValueError("ModernBERT attention_bias, mlp_bias and classifier_bias must agree and decoder_bias be true")
    n = cfg["num_hidden_layers"]
    every = cfg.get("global_attn_every_n_layers", 3)
    types = cfg.get("layer_types") or ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    local = [i for i, t in enumerate(types) if t == "sliding_attention"]
    cadence = next((k for k in range(1, n + 1) if [i for i in range(n) if i % k] == local), None)
    if local and cadence is None:
        raise ValueError(f"ModernBERT layer_types {types} are not a global-every-k cadence")
    rope = cfg.get("rope_parameters") or {}
    full, sliding = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    if any(r.get("rope_type", "default") != "default" for r in (full, sliding)):
        raise ValueError(f"ModernBERT rope_parameters {rope}: only rope_type 'default' is supported")
    attention: dict[str, Any] = {"kernel": "auto"}
    if local:
        window = cfg.get("local_attention", 128)
        attention.update(global_every=cadence, local={"token_mask": {"pattern": _WINDOW_PATTERN, "window": window}})
    return ModelConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=n,
        num_attention_heads=cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"],
        max_position_embeddings=cfg.get("max_position_embeddings", 8192),
        type_vocab_size=0,
        hidden_dropout=float(cfg.get("mlp_dropout", 0.0)),
        attention_dropout=float(cfg.get("attention_dropout", 0.0)),
        layer_norm_eps=cfg.get("norm_eps", 1e-5),
        pre_layer_norm=True,
        hidden_act=OUR_ACT[act],
        initializer_range=cfg.get("initializer_range", 0.02),
        pad_token_id=cfg.get("pad_token_id") or 0,
        attention=attention,
        position={
            "type": "rotary",
            "rope_theta": float(full.get("rope_theta", cfg.get("global_rope_theta", 160000.0))),
            "rope_theta_local": float(sliding.get("rope_theta", cfg.get("local_rope_theta", 10000.0))),
        },
        ffn_type="glu",
        linear_bias=biases.pop(),
        norm_bias=bool(cfg.get("norm_bias", False)),
        first_attn_norm=False,
    )


def from_hf_modernbert(
    hf_state_dict: dict[str, torch.Tensor], hf_config: Any
) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """``ModernBertForMaskedLM`` state dict + config (or its dict) -> (our state dict, ModelConfig)."""
    cfg = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    config = ModelConfig.from_dict(cfg["sparse_bert"]) if cfg.get("sparse_bert") else _config_from_hf(cfg)
    reason = stock_modernbert_reason(config)
    if reason is not None:
        raise ValueError(f"the ModernBERT config does not describe a stock ModernBERT: {reason}")
    sd = dict(hf_state_dict)
    out = {ours: sd.pop(theirs) for ours, theirs in _name_map(config).items() if theirs in sd}
    missing = sorted(set(_name_map(config)) - set(out))
    if missing:
        raise ValueError(f"the ModernBERT state dict lacks the weights for our {missing[:5]}")
    tied = {
        "decoder.weight": (
            out["bert.embeddings.word_embeddings.weight"],
            "the token embeddings; our MLM decoder is tied",
        )
    }
    check_tied_and_rest(sd, tied, "ModernBERT")
    return out, config
