"""DeepSpeed's module path ``deepspeed.ops.sparse_attention.sparse_self_attention`` (the class lives in
model/attention/module.py)."""

from model.attention.module import SparseSelfAttention  # noqa: F401
