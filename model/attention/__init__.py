"""Block-sparse attention: layouts as data, kernels in a registry, one module.

DeepSpeed's ``deepspeed.ops.sparse_attention`` API lives in :mod:`model.attention.deepspeed`. Its names
(``SparseSelfAttention``, ``BertSparseSelfAttention``, ``SparseAttentionUtils``, ``MatMul``, ``Softmax``) and module
paths (``model.attention.sparse_self_attention`` ...) were served from here before; they still are for one release,
with a DeprecationWarning naming the new import, so code ported to them keeps working while it changes the import.
"""

import importlib
import warnings

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

_MOVED_NAMES = ("SparseSelfAttention", "BertSparseSelfAttention", "SparseAttentionUtils", "MatMul", "Softmax")
"""Names moved to model.attention.deepspeed (deprecated here for one release)."""


def warn_moved(old: str) -> None:
    """Warn that ``old`` (a module path or ``model.attention.<name>``) moved into :mod:`model.attention.deepspeed`."""
    new = old.replace("model.attention.", "model.attention.deepspeed.", 1)
    warnings.warn(f"{old} moved to {new}; the old path goes in the next release", DeprecationWarning, stacklevel=3)


def __getattr__(name: str):
    """The moved names, imported on first use (the encoder and the HF export never load the DeepSpeed package)."""
    if name in _MOVED_NAMES:
        warn_moved(f"model.attention.{name}")
        return getattr(importlib.import_module("model.attention.deepspeed"), name)
    raise AttributeError(f"module 'model.attention' has no attribute {name!r}")
