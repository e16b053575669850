"""DeepSpeed's module path ``deepspeed.ops.sparse_attention.matmul`` (model/attention/block_sparse_ops.py)."""

from model.attention.block_sparse_ops import MatMul  # noqa: F401
