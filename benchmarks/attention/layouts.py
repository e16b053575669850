"""The named layouts of the attention kernel table (the LAYOUT of ``benchmarks.attention --cases LAYOUT@N``) and of
``auto``'s measured table (its entries' ``bench_layout``), at bert-base's head shape from model/presets.py.

Here, below the benchmarks, because devtools/auto_table.py rebuilds each table entry's layout by its name."""

from __future__ import annotations

from typing import Callable

from model.attention import (
    BLOCK_LAYOUTS,
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
    from_ds_config,
)
from model.presets import PRESETS, blockbert

_BERT_BASE = PRESETS["bert-base"]
HEADS: int = _BERT_BASE["num_attention_heads"]
"""Heads of the kernel table: bert-base's 12."""
HEAD_DIM: int = _BERT_BASE["hidden_size"] // HEADS
"""Head size of the kernel table: bert-base's 64."""

TUNED_LAYOUTS: dict[str, Callable[[], SparsityConfig]] = {
    "blockbert_n2": lambda: from_ds_config(blockbert(2, HEADS), HEADS),  # model/presets.py: heads 10:2, block 16
    "blockbert_n3": lambda: from_ds_config(blockbert(3, HEADS), HEADS),
    "fixed_b16": lambda: FixedSparsityConfig(HEADS, block=16),
    "fixed_b64": lambda: FixedSparsityConfig(HEADS, block=64),
    "bigbird_b64": lambda: BigBirdSparsityConfig(HEADS, block=64),
    "bslongformer_b64": lambda: BSLongformerSparsityConfig(HEADS, block=64),
    "local_bi_b64": lambda: LocalSlidingWindowSparsityConfig(HEADS, block=64, attention="bidirectional"),
    "variable_b64": lambda: VariableSparsityConfig(HEADS, block=64, num_random_blocks=1),
}
"""The layouts the docs' tables were measured with (``--cases``'s default layouts)."""


def layouts() -> dict[str, Callable[[], SparsityConfig]]:
    """The LAYOUT choices of ``--measure time --cases``: :data:`TUNED_LAYOUTS`, plus every registered block layout
    mode they do not cover, at its class defaults (so a new mode is benchmarked without an entry here)."""
    covered = {make().mode for make in TUNED_LAYOUTS.values()}
    extra = {m: (lambda cls=cls: cls(HEADS)) for m, cls in BLOCK_LAYOUTS.items() if m not in covered}
    return {**TUNED_LAYOUTS, **extra}
