"""Deprecated path, kept for one release: moved to ``model.attention.deepspeed.bert_sparse_self_attention`` (DeepSpeed's
API has its own package). Code ported to this path keeps importing, with a DeprecationWarning naming the new one."""

from model.attention import warn_moved

warn_moved(__name__)
from model.attention.deepspeed.bert_sparse_self_attention import BertSparseSelfAttention  # noqa: E402,F401
