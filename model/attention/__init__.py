"""Block-sparse attention: layouts as data, kernels in a registry, one module."""

from model.attention.bert_sparse_self_attention import BertSparseSelfAttention  # noqa: F401,E402
from model.attention.bias import DenseScoreBias, ScoreBias, SumScoreBias  # noqa: F401,E402
from model.attention.block_sparse_ops import MatMul, Softmax  # noqa: F401,E402
from model.attention.kernels import KERNELS, choose_kernel, get_kernel, register_kernel  # noqa: F401,E402
from model.attention.layouts import (  # noqa: F401
    SPARSITY_MODES,
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
from model.attention.module import BlockSparseAttention, SparseSelfAttention  # noqa: F401,E402
from model.attention.sparse_attention_utils import SparseAttentionUtils  # noqa: F401,E402

# every registered layout class, including ones added later, without listing it here
globals().update({_cls.__name__: _cls for _cls in SPARSITY_MODES.values()})
