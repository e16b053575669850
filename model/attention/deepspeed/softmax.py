"""DeepSpeed's module path ``deepspeed.ops.sparse_attention.softmax`` (the op lives in ``block_sparse_ops.py``)."""

from model.attention.deepspeed.block_sparse_ops import Softmax  # noqa: F401
