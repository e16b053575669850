"""DeepSpeed's ``deepspeed.ops.sparse_attention`` (0.19.5) API, on our attention module and kernels.

Code written for DeepSpeed ports by changing the package name only: ``from deepspeed.ops.sparse_attention import
SparseSelfAttention, FixedSparsityConfig`` becomes ``from model.attention.deepspeed import ...``, and DeepSpeed's
module paths exist below this package (``.sparsity_config``, ``.sparse_self_attention``,
``.bert_sparse_self_attention``, ``.sparse_attention_utils``, ``.matmul``, ``.softmax``); ``.ds_config`` reads an old
ds_config ``sparse_attention`` block as DeepSpeed's parser did (the trainer's ds_config reader calls it). The layout
classes are aliases of :mod:`model.attention.layouts` (their one home). The encoder and the Hugging Face export never
import this package: they run :class:`model.attention.module.BlockSparseAttention` directly.
"""

from model.attention.deepspeed.bert_sparse_self_attention import BertSparseSelfAttention
from model.attention.deepspeed.block_sparse_ops import MatMul, Softmax
from model.attention.deepspeed.sparse_attention_utils import SparseAttentionUtils
from model.attention.deepspeed.sparse_self_attention import SparseSelfAttention
from model.attention.deepspeed.sparsity_config import *  # noqa: F403  (the layout classes, as DeepSpeed's package)
from model.attention.deepspeed.sparsity_config import __all__ as _layout_names

__all__ = _layout_names + [
    "SparseSelfAttention",
    "BertSparseSelfAttention",
    "SparseAttentionUtils",
    "MatMul",
    "Softmax",
]
