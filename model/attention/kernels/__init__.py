"""Attention kernels by backend, registered by name, all with one signature (see :mod:`.registry`).

One module per backend: :mod:`.dense` (the reference), :mod:`.flex`, :mod:`.auto`, and the package
:mod:`.block_gather` with its plans. Importing this package registers every kernel (the imports below); a new
backend is one module with one ``@register_kernel`` class plus its import line here. The import is explicit, not
discovered, because the Hugging Face remote-code export copies the modules that are imported statically
(tools/hf_export/remote_code.py).
"""

from model.attention.kernels.auto import AutoKernel, AutoPlan, choose_kernel, device_capability  # noqa: F401
from model.attention.kernels.block_gather import BlockGatherKernel, GatherPlan, query_tile_factor  # noqa: F401
from model.attention.kernels.dense import DenseKernel, DensePlan  # noqa: F401
from model.attention.kernels.flex import FlexKernel, FlexPlan  # noqa: F401
from model.attention.kernels.registry import KERNELS, Kernel, get_kernel, register_kernel  # noqa: F401
from model.attention.kernels.triton_block import TritonBlockKernel, TritonBlockPlan  # noqa: F401
