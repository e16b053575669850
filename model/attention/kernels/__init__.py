"""Attention kernels by backend, registered by name, all with one signature (see :mod:`.registry`).

One module per backend: :mod:`.dense` (the reference), :mod:`.flex`, :mod:`.auto`, and the package
:mod:`.block_gather` with its plans. Importing this package imports every module in it (the loop at the end), so a
new backend is one module with one ``@register_kernel`` class and nothing else to edit.
"""

import importlib
import pkgutil

from model.attention.kernels.auto import AutoKernel, AutoPlan, choose_kernel, device_capability  # noqa: F401
from model.attention.kernels.block_gather import BlockGatherKernel, GatherPlan, query_tile_factor  # noqa: F401
from model.attention.kernels.dense import DenseKernel, DensePlan  # noqa: F401
from model.attention.kernels.flex import FlexKernel, FlexPlan  # noqa: F401
from model.attention.kernels.registry import KERNELS, Kernel, get_kernel, register_kernel  # noqa: F401

for _module in pkgutil.iter_modules(__path__):  # register every backend module, including ones added later
    importlib.import_module(f"{__name__}.{_module.name}")
