"""Block-sparse attention: layouts as data, kernels in a registry, one module."""

from model.attention.layouts import (  # noqa: F401
    BigBirdSparsityConfig,
    BlockBERTSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
    from_ds_config,
    layout_density,
)
