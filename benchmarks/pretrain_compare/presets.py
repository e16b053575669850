"""Scales (presets) and attention configurations of the comparison, as registries: a new config is one entry."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from model.presets import PRESETS as MODEL_PRESETS
from model.presets import PresetError, blockbert, diet, modernbert, sparsebert

REPO = Path(__file__).resolve().parents[2]


class CompareError(RuntimeError):
    """A comparison cannot go on; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """Encoder size and training length shared by every config of a comparison. The encoder's shape is a model
    preset's (model/presets.py, the one home of model shapes), with ``shape`` overriding its fields where the
    comparison's scale has no preset of its own."""

    model_preset: str
    seq_length: int
    micro_batch_size: int
    global_batch_size: int | None  # None: micro batch x ranks
    train_iters: int
    eval_interval: int
    eval_iters: int
    log_interval: int
    lr: float
    ds_config: str
    strided_stride: int  # SparseBERT strided l: ~70% sparsity at this N, as Table 3's strided (70.4% at n=128)
    shape: dict[str, int] = dataclasses.field(default_factory=dict)

    def _shape(self, field: str) -> int:
        return self.shape.get(field, MODEL_PRESETS[self.model_preset][field])

    def settings(self) -> dict[str, Any]:
        """The preset as a report writes it down: its fields and the encoder's shape they give."""
        shape = dict(num_layers=self.num_layers, hidden_size=self.hidden_size, num_heads=self.num_heads)
        return {**dataclasses.asdict(self), **shape, "ffn_hidden_size": self.ffn_hidden_size}

    num_layers = property(lambda self: self._shape("num_layers"))
    hidden_size = property(lambda self: self._shape("hidden_size"))
    num_heads = property(lambda self: self._shape("num_attention_heads"))
    ffn_hidden_size = property(lambda self: self._shape("intermediate_size"))


PRESETS: dict[str, Preset] = {
    # the test's scale (model preset tiny): seconds per run on 2 CPU cores
    "tiny": Preset("tiny", 128, 2, None, 6, 3, 2, 1, 1e-3, "ds_configs/zero2_fp32.json", 16),
    # the committed CPU comparison (docs/results.md): ~1 s per step on the 2-core dev box (2 ranks x 4 x 512)
    "cpu-small": Preset(
        "tiny",
        *(512, 4, None, 500, 50, 8, 10, 2e-3, "ds_configs/zero2_fp32.json", 80),
        shape=dict(num_layers=4, hidden_size=128, intermediate_size=512),
    ),
    # BERT-base at N=512 with the blockwise paper's batch (131,072 tokens) for a GPU node; set --train-iters
    "bert-base": Preset("bert-base", 512, 32, 256, 20000, 1000, 50, 100, 5e-4, "ds_configs/zero2_bf16.json", 80),
}
"""Fields in order: model preset, N, micro batch, global batch, iterations, eval interval, eval iterations, log
interval, learning rate, DeepSpeed JSON, strided l."""

CONFIG_NAMES = (
    "dense",
    "blockbert_n2",
    "blockbert_n3",
    "sparsebert_strided",
    "diet_rel",
    "diet_abs",
    "modernbert",
    "modernbert_blockbert",
)
MODERNBERT_CONFIGS = ("modernbert", "modernbert_blockbert")
"""ModernBERT's architecture (model preset ``modernbert-base``: pre-LN without biases, GeGLU, RoPE, a 128-token
window in two of every three layers) at the preset's size; ``modernbert_blockbert`` puts BlockBERT n=2 on the
global layers."""
DEFAULT_CONFIGS = ("dense", "blockbert_n2", "blockbert_n3", "sparsebert_strided", "diet_rel")


def head_assignment(num_heads: int, blocks: int) -> str:
    """The blockwise paper's split scaled to ``num_heads`` (model.presets.blockbert): 12 heads -> 10:2 (n=2),
    8:2:2 (n=3); 4 -> 3:1, 2:1:1."""
    try:
        return blockbert(blocks, num_heads)["head_assignment"]
    except PresetError as e:
        raise CompareError(str(e)) from None


def attention_and_position(config: str, preset: Preset) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """ModelConfig ``attention`` fields and ``position`` block of a named config: the recipes of model/presets.py
    (the set-ups of run_scripts/pretrain_*.sh), scaled to the preset's heads and N."""
    n = preset.seq_length
    if config == "dense":  # RoBERTa-1seq
        return {"kernel": "dense"}, None
    try:
        if config in ("blockbert_n2", "blockbert_n3"):
            return {"kernel": "auto", "sparsity": blockbert(int(config[-1]), preset.num_heads)}, None
        if config == "sparsebert_strided":
            return {"kernel": "auto", "token_mask": sparsebert("strided", n, stride=preset.strided_stride)}, None
        if config == "diet_rel":
            return {"kernel": "auto"}, diet("rel", min(128, n))
        if config == "diet_abs":
            return {"kernel": "auto"}, diet("abs", min(128, preset.hidden_size))
    except PresetError as e:
        raise CompareError(f"config {config!r} at {preset.num_heads} heads: {e}") from None
    raise CompareError(f"unknown config {config!r}; choose from {', '.join(CONFIG_NAMES)}")


def _modernbert_dict(config: str, preset: Preset) -> dict[str, Any]:
    from model.config import ModelConfig

    # GeGLU's intermediate size as ModernBERT-base's ratio (1152 / 768); the window as ModernBERT's, capped at N / 4
    d = ModelConfig.preset(
        "modernbert-base",
        num_layers=preset.num_layers,
        hidden_size=preset.hidden_size,
        num_attention_heads=preset.num_heads,
        intermediate_size=preset.hidden_size * 3 // 2,
        max_position_embeddings=preset.seq_length,
    ).to_dict()
    window = min(128, preset.seq_length // 4)
    d["attention"]["local"] = modernbert(window)["local"]
    if config == "modernbert_blockbert":
        d["attention"].update(attention_and_position("blockbert_n2", preset)[0])
    return ModelConfig.from_dict(d).to_dict()


def model_config_dict(config: str, preset: Preset) -> dict[str, Any]:
    """The full ModelConfig (validated by ModelConfig.from_dict) a run trains; vocab comes from the tokenizer."""
    from model.config import ModelConfig

    if config in MODERNBERT_CONFIGS:
        return _modernbert_dict(config, preset)
    d = ModelConfig.preset(
        "bert-base",
        num_layers=preset.num_layers,
        hidden_size=preset.hidden_size,
        num_attention_heads=preset.num_heads,
        intermediate_size=preset.ffn_hidden_size,
        max_position_embeddings=preset.seq_length,
    ).to_dict()
    attention, position = attention_and_position(config, preset)
    d["attention"].update(attention)
    if position is not None:
        d["position"] = position
    return ModelConfig.from_dict(d).to_dict()
