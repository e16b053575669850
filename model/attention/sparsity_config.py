"""DeepSpeed's module path ``deepspeed.ops.sparse_attention.sparsity_config``: the layout classes (model/attention/
layouts.py holds them), so code that imports from this path (GPT-NeoX does) ports by changing the package name."""

from model.attention.layouts import (  # noqa: F401
    BigBirdSparsityConfig,
    BlockBERTSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
)
