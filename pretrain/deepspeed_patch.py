"""DeepSpeed 0.19.8's ZeRO-1/2 gradient norm and clipping without host syncs, applied at start-up.

docs/upstream/deepspeed-sync.md is the same change as a patch for upstream, with the reasons. In every optimizer step
of ZeRO 1-2 DeepSpeed 0.19.8 makes the host wait for the device three times per parameter group (the H200's CUDA
sync debug mode counted 6 per step with our two groups, docs/performance.md):

- ``runtime/utils.py:mask_nan_or_inf_with_val_inplace`` (from ``get_grad_norm_direct``) builds its fill value with
  ``torch.tensor(-1.0, device=...)`` (a blocking copy of host memory) and passes that 0-dim device tensor to
  ``masked_fill_``, whose CUDA kernel reads it back (``value.item()``). Filling with the Python number does the same
  without either;
- ``ZeRO's unscale_and_clip_grads`` asks ``is_invalid_grad_norm`` (``bool()`` of a device tensor) only to replace an
  invalid norm (NaN, inf, the -1 sentinel) with +inf; ``torch.where`` does that on the device.

Why the trainer applies it rather than only proposing it upstream: these are 6 of the 7 syncs of the shipped bf16
step, nothing else removes them, a step that syncs can neither overlap the host with the device nor be captured in a
CUDA graph; the change is a few lines whose results are bitwise those of the originals (tests/test_deepspeed_patch.py:
finite, inf, NaN and -1 norms; the same trained parameters with and without it), and requirements.txt pins DeepSpeed
0.19.8 exactly. Any other DeepSpeed version is left alone (the start-up line says so): its code may differ.
"""

from __future__ import annotations

import math
from typing import Any

import torch

PATCHED_VERSION = "0.19.8"
"""The one DeepSpeed version these replacements were written and tested against."""
_MASK_HOMES = ("deepspeed.runtime.utils", "deepspeed.runtime.zero.stage_1_and_2", "deepspeed.runtime.zero.stage3")
"""The modules that hold ``mask_nan_or_inf_with_val_inplace`` (imported by name, so each module's name is patched)."""
MASK, CLIP = "mask_nan_or_inf_with_val_inplace", "unscale_and_clip_grads"
_applied: dict[tuple[str, str], Any] = {}
"""(module, name) -> DeepSpeed's original, once applied."""


def mask_nan_or_inf_with_val_inplace(input: torch.Tensor, device: Any = None, val: float = -1.0) -> None:
    """NaN and inf entries of ``input`` become ``val`` in place (DeepSpeed's sentinel for an invalid norm, -1), with
    a Python number as the fill value: no host-to-device copy, no read-back. ``device`` is DeepSpeed's signature."""
    input.masked_fill_(input.isnan().logical_or(input.isinf()), val)


def _invalid_norm_as_inf(norm: torch.Tensor) -> torch.Tensor:
    """+inf where ``norm`` is NaN, inf or negative (the -1 sentinel), computed on the device."""
    invalid = ~torch.isfinite(norm) | (norm < 0)
    return torch.where(invalid, torch.full_like(norm, float("inf")), norm)


def unscale_and_clip_grads(self: Any, grad_groups_flat: list, total_norm: torch.Tensor | float) -> None:
    """DeepSpeedZeroOptimizer.unscale_and_clip_grads with the invalid-norm replacement made on the device: the same
    arithmetic in the same order (scale = loss_scale x max(1, (norm / loss_scale + 1e-6) / clip)), so the same
    gradients bit for bit."""
    if self.clip_grad == 0.0 and self.loss_scale == 1.0:
        return
    combined_scale = self.loss_scale
    if self.clip_grad > 0.0:
        if torch.is_tensor(total_norm):
            clip_norm = _invalid_norm_as_inf(total_norm)
        elif not math.isfinite(float(total_norm)) or total_norm < 0:  # a direct caller's float: no device involved
            clip_norm = torch.tensor(float("inf"), dtype=torch.float, device=self.device)
        else:
            clip_norm = total_norm
        clip = ((clip_norm / self.loss_scale) + 1e-6) / self.clip_grad
        clip = torch.clamp(clip, min=1.0)
        combined_scale = clip * self.loss_scale
    for grad in grad_groups_flat:
        for g in grad if isinstance(grad, list) else [grad]:
            g.data.mul_(1.0 / combined_scale)


def apply() -> str:
    """Install the replacements into DeepSpeed (once; before or after deepspeed.initialize: every call looks them up
    at call time); returns the start-up line saying what was done."""
    import importlib

    import deepspeed

    if deepspeed.__version__ != PATCHED_VERSION:
        return (
            f"DeepSpeed {deepspeed.__version__}: its ZeRO-1/2 gradient-norm and clipping host syncs are left as they "
            f"are (pretrain/deepspeed_patch.py replaces them in {PATCHED_VERSION} only)"
        )
    if not _applied:
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

        for home in _MASK_HOMES:
            module = importlib.import_module(home)
            _applied[(home, MASK)] = getattr(module, MASK)
            setattr(module, MASK, mask_nan_or_inf_with_val_inplace)
        _applied[("DeepSpeedZeroOptimizer", CLIP)] = DeepSpeedZeroOptimizer.unscale_and_clip_grads
        DeepSpeedZeroOptimizer.unscale_and_clip_grads = unscale_and_clip_grads
    return (
        f"DeepSpeed {PATCHED_VERSION}: ZeRO-1/2 gradient norm and clipping without host syncs "
        "(pretrain/deepspeed_patch.py; docs/upstream/deepspeed-sync.md)"
    )


def originals() -> dict[str, Any]:
    """DeepSpeed's own functions, whether or not :func:`apply` ran (for the parity tests)."""
    from deepspeed.runtime import utils
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    mask = _applied.get(("deepspeed.runtime.utils", MASK), getattr(utils, MASK))
    clip = _applied.get(("DeepSpeedZeroOptimizer", CLIP), DeepSpeedZeroOptimizer.unscale_and_clip_grads)
    return {MASK: mask, CLIP: clip}
