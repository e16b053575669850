"""Model recipes, in one place: the named presets (``--model-preset NAME``) and the builders that write the
attention and position settings of each paper's set-up.

Every other home (the trainer's shorthand flags, the run scripts, the benchmarks and tools) names a preset or calls
a builder here, so a setting is written once. A new recipe is one entry of :data:`PRESETS` (built with the builders
below); ``ModelConfig.preset(name, **overrides)`` turns it into a config.

Standard library only: the values are plain JSON-like dicts, checked when a ``ModelConfig`` is built from them.
"""

from __future__ import annotations

from typing import Any

PAPER_HEAD_SPLITS: dict[int, str] = {2: "10:2", 3: "8:2:2"}
"""The blockwise-attention paper's heads per permutation for 12 heads (Table 2: n=2 -> 10:2, n=3 -> 8:2:2)."""
PAPER_HEADS = 12
BLOCKBERT_TILE = 16
"""Tile size of the BlockBERT layout tensor (the layout's default; N is padded to num_blocks x tile)."""


class PresetError(ValueError):
    """A recipe that cannot be built (unknown name, a head split that does not fit); the message says what to use."""


def scale_head_split(split: str, heads: int) -> str:
    """A head split such as ``10:2`` scaled to ``heads`` heads, keeping its proportions: every group keeps at least
    one head and the first group takes the rounding remainder (12 -> 10:2 / 8:2:2; 4 -> 3:1 / 2:1:1; 16 -> 13:3 /
    10:3:3). The one place a split is scaled (the benchmarks and the trainer's shorthand call it)."""
    try:
        parts = [int(x) for x in str(split).split(":")]
    except ValueError:
        raise PresetError(f"head split {split!r} must look like '10:2' (heads per group, ':'-separated)") from None
    if not parts or min(parts) < 0 or sum(parts) < 1:
        raise PresetError(f"head split {split!r} must be non-negative head counts with a positive sum")
    if heads == sum(parts):
        return ":".join(map(str, parts))
    scaled = [max(1, round(p * heads / sum(parts))) for p in parts]
    scaled[0] += heads - sum(scaled)
    if scaled[0] < 1:
        raise PresetError(f"{heads} heads cannot be split over {len(parts)} groups as {split!r}; give a split")
    return ":".join(map(str, scaled))


def blockbert(n: int, heads: int | str = PAPER_HEADS, block: int | None = BLOCKBERT_TILE) -> dict[str, Any]:
    """BlockBERT's layout (``attention.sparsity``) with ``n`` blocks. ``heads``: the model's head count (the paper's
    split for n, :data:`PAPER_HEAD_SPLITS`, scaled to it) or an explicit split such as ``"9:3"``. ``block=None``
    leaves the tile out (the layout's default, 16)."""
    if isinstance(heads, str):
        split = heads
    else:
        if n not in PAPER_HEAD_SPLITS:
            raise PresetError(
                f"BlockBERT n={n} has no paper head split (n = {sorted(PAPER_HEAD_SPLITS)}); give the split, e.g. "
                f"--head-assignment {':'.join(['1'] * n)}"
            )
        split = scale_head_split(PAPER_HEAD_SPLITS[n], heads)
    d: dict[str, Any] = {"mode": "blockbert", "num_blocks": int(n), "head_assignment": split}
    if block is not None:
        d["block"] = int(block)
    return d


def sparsebert(pattern: str, seq_len: int | None = None, **params: Any) -> dict[str, Any]:
    """A SparseBERT token mask (``attention.token_mask``): a registered pattern (no_diagonal, strided, fixed, ...,
    dam, file) built for ``seq_len`` (None = max_position_embeddings), plus the pattern's own parameters (e.g.
    ``stride=16``, ``path="masks.pt"``)."""
    d: dict[str, Any] = {"pattern": pattern}
    if seq_len is not None:
        d["seq_len"] = int(seq_len)
    d.update(params)
    return d


DIET_KINDS = {"abs": ("diet_abs", "rank"), "rel": ("diet_rel", "max_distance")}
"""DIET kind -> (position type, the field ``size`` sets): d_p for DIET-ABS, the clip distance K for DIET-REL."""


def diet(kind: str, size: int = 128, sharing: str = "none") -> dict[str, Any]:
    """DIET's decoupled positional attention (``position``): ``abs`` (rank ``size``) or ``rel`` (distances clipped to
    ``size``); ``sharing`` none | layer | head."""
    if kind not in DIET_KINDS:
        raise PresetError(f"DIET kind {kind!r} unknown; choose one of {sorted(DIET_KINDS)}")
    type_, key = DIET_KINDS[kind]
    return {"type": type_, key: int(size), "sharing": sharing}


def modernbert(window: int = 128, global_every: int = 3, global_sparsity: dict | None = None) -> dict[str, Any]:
    """ModernBERT's attention (``attention``): an exact ``window``-token sliding window on the local layers, global
    attention where layer % ``global_every`` == 0; ``global_sparsity`` (e.g. :func:`blockbert`) puts a layout on the
    global layers only (the local layers then say ``sparsity: null``)."""
    local: dict[str, Any] = {"token_mask": {"pattern": "sliding_window", "window": int(window)}}
    attention: dict[str, Any] = {"kernel": "auto", "global_every": int(global_every), "local": local}
    if global_sparsity is not None:
        attention["sparsity"] = global_sparsity
        attention["local"] = {"sparsity": None, **local}
    return attention


_BASE: dict[str, Any] = dict(
    vocab_size=30522,
    hidden_size=768,
    num_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
    type_vocab_size=2,
)
MODERNBERT_LAYERS: dict[str, Any] = dict(
    type_vocab_size=0,
    pre_layer_norm=True,
    ffn_type="glu",
    linear_bias=False,
    norm_bias=False,
    first_attn_norm=False,
)
"""ModernBERT's layers apart from sizes, positions and attention: no segment embeddings, pre-LN without an attention
LayerNorm in layer 0, GeGLU, no biases (what stock ModernBertForMaskedLM requires besides rotary positions)."""
_MODERNBERT: dict[str, Any] = dict(
    _BASE,
    num_layers=22,
    intermediate_size=1152,
    max_position_embeddings=1024,  # ModernBERT's first pretraining phase; its 8192 context came after
    hidden_dropout=0.0,
    attention_dropout=0.0,
    layer_norm_eps=1e-5,
    **MODERNBERT_LAYERS,
    position={"type": "rotary", "rope_theta": 160000.0, "rope_theta_local": 10000.0},
    attention=modernbert(128),
)
PRESETS: dict[str, dict[str, Any]] = {
    "bert-base": dict(_BASE),
    "bert-large": dict(_BASE, hidden_size=1024, num_layers=24, num_attention_heads=16, intermediate_size=4096),
    "tiny": dict(_BASE, hidden_size=64, num_layers=2, num_attention_heads=4, intermediate_size=128),
    # BlockBERT (paper: RoBERTa-1seq setting, no NSP, N=512 or 1024)
    "blockbert-base-n2": dict(_BASE, attention={"kernel": "auto", "sparsity": blockbert(2)}),
    "blockbert-base-n3": dict(_BASE, attention={"kernel": "auto", "sparsity": blockbert(3)}),
    # DIET (decoupled positional attention): no input positions, per-head position terms in the logits
    "diet-abs-base": dict(_BASE, position=diet("abs")),
    "diet-rel-base": dict(_BASE, position=diet("rel")),
    # ModernBERT (arXiv 2412.13663): pre-LN without biases, GeGLU, RoPE, a 128-token window in two of every three
    # layers (global attention where layer % 3 == 0); exports to stock transformers.ModernBertForMaskedLM
    "modernbert-base": dict(_MODERNBERT),
    # ModernBERT with BlockBERT n=2 on its global layers (the export then carries our code)
    "modernbert-blockbert-base": dict(_MODERNBERT, attention=modernbert(128, global_sparsity=blockbert(2))),
    "modernbert-tiny": dict(
        _MODERNBERT,
        hidden_size=64,
        num_layers=4,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=256,
        attention=modernbert(32),
    ),
}
"""Preset name -> ModelConfig fields (``ModelConfig.preset`` fills the rest with the field defaults)."""


def preset_names() -> list[str]:
    """The registered preset names, sorted (the choices of every ``--model-preset`` flag)."""
    return sorted(PRESETS)
