"""Regenerate tests/data/ds0195_layouts.npz from DeepSpeed 0.19.5's own sparsity_config.py (see README.md here).

Usage (the sdist stays outside the repository):
    pip download deepspeed==0.19.5 --no-deps --no-binary :all: -d /tmp/ds0195
    tar xzf /tmp/ds0195/deepspeed-0.19.5.tar.gz -C /tmp/ds0195
    .venv/bin/python tests/data/make_layout_goldens.py \
        /tmp/ds0195/deepspeed-0.19.5/deepspeed/ops/sparse_attention/sparsity_config.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

# (name, class, kwargs, seq_len): only non-random configurations (random blocks = 0), as DeepSpeed drew
# random blocks from Python's global `random`, which we deliberately do not reproduce.
CASES = [
    ("dense_h2_b16_n64", "DenseSparsityConfig", {"num_heads": 2}, 64),
    ("fixed_default_n256", "FixedSparsityConfig", {"num_heads": 2}, 256),
    ("fixed_partial_window_n272", "FixedSparsityConfig", {"num_heads": 2}, 272),
    ("fixed_uni_n256", "FixedSparsityConfig", {"num_heads": 2, "attention": "unidirectional"}, 256),
    (
        "fixed_horizontal_g2_n208",
        "FixedSparsityConfig",
        {
            "num_heads": 4,
            "block": 16,
            "num_local_blocks": 4,
            "num_global_blocks": 2,
            "horizontal_global_attention": True,
        },
        208,
    ),
    (
        "fixed_perhead_patterns_n320",
        "FixedSparsityConfig",
        {
            "num_heads": 4,
            "block": 32,
            "different_layout_per_head": True,
            "num_local_blocks": 4,
            "num_global_blocks": 1,
            "num_different_global_patterns": 4,
        },
        320,
    ),
    (
        "fixed_perhead_uni_n224",
        "FixedSparsityConfig",
        {
            "num_heads": 3,
            "block": 16,
            "different_layout_per_head": True,
            "num_local_blocks": 6,
            "num_global_blocks": 2,
            "num_different_global_patterns": 3,
            "attention": "unidirectional",
        },
        224,
    ),
    ("variable_default_n256", "VariableSparsityConfig", {"num_heads": 2}, 256),
    (
        "variable_windows_n320",
        "VariableSparsityConfig",
        {"num_heads": 2, "local_window_blocks": [2, 3, 5], "global_block_indices": [0, 7, 30]},
        320,
    ),
    (
        "variable_ranges_horizontal_n256",
        "VariableSparsityConfig",
        {
            "num_heads": 2,
            "local_window_blocks": [4],
            "global_block_indices": [1, 9],
            "global_block_end_indices": [3, 12],
            "horizontal_global_attention": True,
        },
        256,
    ),
    (
        "variable_uni_n256",
        "VariableSparsityConfig",
        {"num_heads": 2, "local_window_blocks": [3, 4], "global_block_indices": [2, 10], "attention": "unidirectional"},
        256,
    ),
    (
        "bigbird_norandom_n256",
        "BigBirdSparsityConfig",
        {"num_heads": 2, "num_random_blocks": 0, "num_sliding_window_blocks": 3, "num_global_blocks": 1},
        256,
    ),
    (
        "bigbird_norandom_w5_g2_n512_b32",
        "BigBirdSparsityConfig",
        {"num_heads": 2, "block": 32, "num_random_blocks": 0, "num_sliding_window_blocks": 5, "num_global_blocks": 2},
        512,
    ),
    (
        "bigbird_norandom_uni_n256",
        "BigBirdSparsityConfig",
        {"num_heads": 2, "num_random_blocks": 0, "attention": "unidirectional"},
        256,
    ),
    ("bslongformer_default_n256", "BSLongformerSparsityConfig", {"num_heads": 2}, 256),
    (
        "bslongformer_ranges_n384",
        "BSLongformerSparsityConfig",
        {
            "num_heads": 2,
            "num_sliding_window_blocks": 5,
            "global_block_indices": [0, 10],
            "global_block_end_indices": [2, 13],
        },
        384,
    ),
    (
        "bslongformer_uni_n256",
        "BSLongformerSparsityConfig",
        {"num_heads": 2, "global_block_indices": [0, 5], "attention": "unidirectional"},
        256,
    ),
    ("local_default_n256", "LocalSlidingWindowSparsityConfig", {"num_heads": 2}, 256),
    (
        "local_bi_w5_n256",
        "LocalSlidingWindowSparsityConfig",
        {"num_heads": 2, "num_sliding_window_blocks": 5, "attention": "bidirectional"},
        256,
    ),
]


def main(path: str) -> None:
    spec = importlib.util.spec_from_file_location("ds0195_sparsity_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the file imports only torch and random
    arrays, meta = {}, {}
    for name, cls, kwargs, n in CASES:
        arrays[name] = getattr(mod, cls)(**kwargs).make_layout(n).numpy().astype(np.int8)
        meta[name] = {"class": cls, "kwargs": kwargs, "seq_len": n}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    out = Path(__file__).with_name("ds0195_layouts.npz")
    np.savez_compressed(out, **arrays)
    print(f"wrote {out} ({len(CASES)} layouts)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
