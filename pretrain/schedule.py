"""LR schedule: linear warmup to the peak, then linear decay to min_lr (BERT, RoBERTa, BlockBERT, DIET).

A torch LRScheduler so DeepSpeed saves/loads it with the checkpoint and steps it only on applied optimizer
steps (skipped fp16 overflow steps do not advance it).
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LRScheduler


def lr_at(step: int, peak: float, min_lr: float, warmup: int, decay_iters: int, style: str = "linear") -> float:
    """LR after `step` applied optimizer steps (step 0 is the first update)."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if style == "constant":
        return peak
    if decay_iters <= warmup:
        return min_lr
    progress = min(1.0, (step - warmup) / (decay_iters - warmup))
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
    ) -> None:
        self.peak, self.min_lr, self.warmup, self.decay_iters, self.style = peak, min_lr, warmup, decay_iters, style
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        lr = lr_at(self.last_epoch, self.peak, self.min_lr, self.warmup, self.decay_iters, self.style)
        return [lr for _ in self.optimizer.param_groups]
