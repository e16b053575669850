"""LR schedule: linear warmup to the peak, then linear decay to min_lr (BERT, RoBERTa, BlockBERT, DIET), a constant
LR, or warmup-stable-decay (WSD: the peak held until the last ``wsd_decay_iters`` of the decay steps, then an anneal to
min_lr; ModernBERT anneals with 1 - sqrt). Names and formulas follow Megatron-LM's ``--lr-decay-style WSD``,
``--lr-wsd-decay-style`` and ``--lr-wsd-decay-iters``.

A torch LRScheduler so DeepSpeed saves/loads it with the checkpoint and steps it only on applied optimizer
steps (skipped fp16 overflow steps do not advance it).
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LRScheduler

#: the anneal of a WSD schedule: fraction r in [0, 1] of the anneal done -> share of (peak - min_lr) left
WSD_DECAY_STYLES = {
    "linear": lambda r: 1.0 - r,
    "cosine": lambda r: 0.5 * (math.cos(math.pi * r) + 1.0),
    "exponential": lambda r: 2.0 * 0.5**r - 1.0,
    "minus_sqrt": lambda r: 1.0 - math.sqrt(r),
}
WSD_DEFAULT_STYLE = "exponential"
"""Megatron-LM's default --lr-wsd-decay-style."""
PRE_WSD_SETTINGS = {"wsd_decay_iters": 0, "wsd_style": WSD_DEFAULT_STYLE}
"""What a schedule saved before WSD existed ran with (no anneal phase)."""
SETTINGS = ("peak", "min_lr", "warmup", "decay_iters", "style", "wsd_decay_iters", "wsd_style")
"""The schedule's settings: lr_at's keywords, WarmupLinearDecay's attributes and saved state."""


def lr_at(
    step: int,
    peak: float,
    min_lr: float,
    warmup: int,
    decay_iters: int,
    style: str = "linear",
    wsd_decay_iters: int = 0,
    wsd_style: str = WSD_DEFAULT_STYLE,
) -> float:
    """LR after `step` applied optimizer steps (step 0 is the first update)."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if style == "constant":
        return peak
    if style == "WSD":
        anneal_start = decay_iters - wsd_decay_iters
        if step < anneal_start:
            return peak
        if wsd_decay_iters <= 0:
            return min_lr
        ratio = min(1.0, (step - anneal_start + 1) / wsd_decay_iters)
        return min_lr + (peak - min_lr) * WSD_DECAY_STYLES[wsd_style](ratio)
    if decay_iters <= warmup:
        return min_lr
    # step + 1 updates done, as in the warmup (Megatron's num_steps): the peak is the LR of the warmup's last step
    # only, and the decay's first step is already below it (step - warmup held the peak for two steps)
    progress = min(1.0, (step + 1 - warmup) / (decay_iters - warmup))
    return min_lr + (peak - min_lr) * (1.0 - progress)


class WarmupLinearDecay(LRScheduler):
    """Sets every param group's lr to lr_at(last_epoch); state is just last_epoch (plus the settings)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        peak: float,
        min_lr: float,
        warmup: int,
        decay_iters: int,
        style: str = "linear",
        wsd_decay_iters: int = 0,
        wsd_style: str = WSD_DEFAULT_STYLE,
    ) -> None:
        self.peak, self.min_lr, self.warmup, self.decay_iters, self.style = peak, min_lr, warmup, decay_iters, style
        self.wsd_decay_iters, self.wsd_style = wsd_decay_iters, wsd_style
        super().__init__(optimizer)

    def load_state_dict(self, state_dict: dict) -> None:
        """A checkpoint from before WSD existed has no WSD settings: it ran without an anneal phase."""
        super().load_state_dict({**PRE_WSD_SETTINGS, **state_dict})

    def get_lr(self) -> list[float]:
        lr = lr_at(self.last_epoch, **{k: getattr(self, k) for k in SETTINGS})
        return [lr for _ in self.optimizer.param_groups]
