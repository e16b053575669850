"""DeepSpeed's module path ``deepspeed.ops.sparse_attention.sparsity_config``: aliases of the layout classes
(model/attention/layouts.py is their one home: the encoder uses them too), so code that imports from this path
(GPT-NeoX does) ports by changing the package name. Every registered layout class is here (DeepSpeed's and ours)."""

from model.attention.layouts import BLOCK_LAYOUTS, SparsityConfig

globals().update({cls.__name__: cls for cls in BLOCK_LAYOUTS.values()})
__all__ = ["SparsityConfig"] + [cls.__name__ for cls in BLOCK_LAYOUTS.values()]
