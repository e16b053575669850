"""The reference LR schedule of the schedule tests: Megatron-LM's ``OptimizerParamScheduler.get_lr``, written out
independently of pretrain/schedule.py."""

from __future__ import annotations

import math


def megatron_get_lr(n, peak, lo, warmup, decay, style, wsd_decay=0, wsd_style="exponential"):
    """Megatron-LM OptimizerParamScheduler.get_lr (init LR 0), written from its definition, as the reference."""
    if warmup > 0 and n <= warmup:
        return peak * n / warmup
    if style == "constant":
        return peak
    if n > decay:
        return lo
    ratio = (n - warmup) / (decay - warmup)
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    elif style == "WSD":
        start = decay - wsd_decay
        r = (n - start) / wsd_decay
        shapes = {"linear": 1 - r, "cosine": 0.5 * (math.cos(math.pi * r) + 1), "exponential": 2 * 0.5**r - 1}
        coeff = 1.0 if n <= start else {**shapes, "minus_sqrt": 1 - math.sqrt(max(r, 0))}[wsd_style]
    else:
        raise AssertionError(style)
    return lo + (peak - lo) * coeff
