"""A ds_config ``sparse_attention`` block read as DeepSpeed 0.19.5's own parser read it (``runtime/config.py``
``get_sparse_*_config``): old training configs keep their meaning when the trainer hands the block to the model."""

from __future__ import annotations

from typing import Any

DS_PARSER_DEFAULTS: dict[str, dict[str, Any]] = {
    "dense": {"block": 16, "different_layout_per_head": False},
    "fixed": {
        "block": 16,
        "different_layout_per_head": False,
        "num_local_blocks": 4,
        "num_global_blocks": 1,
        "attention": "bidirectional",
        "horizontal_global_attention": False,
        "num_different_global_patterns": 1,
    },
    "variable": {
        "block": 16,
        "different_layout_per_head": False,
        "num_random_blocks": 0,
        "local_window_blocks": [4],
        "global_block_indices": [0],
        "global_block_end_indices": None,
        "attention": "bidirectional",
        "horizontal_global_attention": False,
    },
    "bigbird": {
        "block": 16,
        "different_layout_per_head": False,
        "num_random_blocks": 0,
        "num_sliding_window_blocks": 3,
        "num_global_blocks": 1,
    },
    "bslongformer": {
        "block": 16,
        "different_layout_per_head": False,
        "num_sliding_window_blocks": 3,
        "global_block_indices": [0],
        "global_block_end_indices": None,
    },
}
"""What DeepSpeed's parser filled in for absent keys, per mode (one per ``layouts.DEEPSPEED_MODES``). Its defaults
differ from the classes' in one place: bigbird's num_random_blocks is 0 there, 1 in the class."""


def from_deepspeed_block(block: dict[str, Any]) -> dict[str, Any]:
    """A ds_config ``sparse_attention`` block as DeepSpeed's parser read it: no ``mode`` means ``fixed``, absent keys
    take the parser's defaults (``{"mode": "bigbird"}`` has 0 random blocks, as it had in DeepSpeed). Deliberate
    difference: DeepSpeed's parser dropped ``attention`` for bigbird and bslongformer; we keep it when given."""
    mode = block.get("mode", "fixed")
    return {"mode": mode, **DS_PARSER_DEFAULTS.get(mode, {}), **block}
