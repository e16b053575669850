"""DeepSpeed's module path ``deepspeed.ops.sparse_attention.softmax`` (model/attention/block_sparse_ops.py)."""

from model.attention.block_sparse_ops import Softmax  # noqa: F401
