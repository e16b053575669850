"""The tests' one name for CUDA's SDPA contracts: the rules (model/attention/sdpa_backend.py, torch's
``select_sdp_backend`` written down) and their emulation on CPU (benchmarks/support/cuda_emulation.py), as ``C.<name>``
in tests/test_cuda_contracts.py and tests/test_saved_activations.py."""

from __future__ import annotations

from benchmarks.support.cuda_emulation import EmulatedGPU, Emulation, efficient_mask, emulate_cuda
from model.attention.sdpa_backend import A100, GPUS, H100, V100, gpu_of_this_machine, predicted_backend

__all__ = [
    "A100",
    "GPUS",
    "H100",
    "V100",
    "EmulatedGPU",
    "Emulation",
    "efficient_mask",
    "emulate_cuda",
    "gpu_of_this_machine",
    "predicted_backend",
]
