"""Block-sparse attention: layouts as data, kernels in a registry, one module.

DeepSpeed's ``deepspeed.ops.sparse_attention`` API lives in :mod:`model.attention.deepspeed` (``SparseSelfAttention``,
``BertSparseSelfAttention``, ``SparseAttentionUtils``, ``MatMul``, ``Softmax`` and DeepSpeed's module paths).
"""

from model.attention.bias import DenseScoreBias, ScoreBias, SumScoreBias  # noqa: F401
from model.attention.kernels import KERNELS, choose_kernel, get_kernel, register_kernel  # noqa: F401
from model.attention.layouts import (  # noqa: F401
    BLOCK_LAYOUTS,
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
from model.attention.module import BlockSparseAttention  # noqa: F401

# every registered layout class, including ones added later, without listing it here
globals().update({_cls.__name__: _cls for _cls in BLOCK_LAYOUTS.values()})
