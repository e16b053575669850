"""FlexAttention's Triton tile sizes when a score_mod/mask_mod reads a dense [.., N, N] tensor (a DIET bias, a token
mask): torch's default H100 forward tiles do not fit in shared memory then (seen on an H200, docs/gpu_results.md).
The choice is checked here against the device's shared memory (mocked); the compiled kernels run only on a GPU
(tests/test_cuda_kernels.py::test_fully_padded_rows_token_masks_and_diet_bias_gradients)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from model.attention.kernels import flex


def _smem(monkeypatch, nbytes: int) -> None:
    props = SimpleNamespace(shared_memory_per_block_optin=nbytes)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)


def _fwd_smem(opts: dict, dtype_bytes: int = 2, head_dim: int = 64, stages_default: int = 3) -> int:
    """Shared memory of the forward tiles (K, V, a bias and a bool mask tile per stage, plus Q): the estimate behind
    the choice, with torch's H100 defaults (128 x 128, 3 stages) where an option is not set."""
    m, n = opts.get("BLOCK_M", 128), opts.get("BLOCK_N", 128)
    stages = opts.get("num_stages", stages_default)
    per_stage = 2 * n * head_dim * dtype_bytes + m * n * dtype_bytes + m * n
    return stages * per_stage + m * head_dim * dtype_bytes


@pytest.mark.parametrize(
    "smem, gpu", [(232448, "H100/H200 (sm90)"), (166912, "A100 (sm80)"), (101376, "A10/RTX 3090 (sm86)")]
)
def test_tiles_fit_the_device_shared_memory(monkeypatch, smem, gpu):
    _smem(monkeypatch, smem)
    opts = flex.element_kernel_options(torch.device("cuda", 0))
    assert _fwd_smem({}) > 232448  # torch's default H100 tiles with a bias and a mask: the failure seen
    assert _fwd_smem(opts) <= smem, (gpu, opts)
    assert all(128 % opts.get(k, 128) == 0 for k in ("BLOCK_M", "BLOCK_N"))  # tiles divide the 128-token mask blocks
