"""LR schedule: linear warmup to the peak, then linear decay to min_lr (BERT, RoBERTa, BlockBERT, DIET), a cosine
decay, a constant LR, or warmup-stable-decay (WSD: the peak held until the last ``wsd_decay_iters`` of the decay
steps, then an anneal to min_lr; ModernBERT anneals with 1 - sqrt). Names and formulas follow Megatron-LM's
``OptimizerParamScheduler`` (``--lr-decay-style``, ``--lr-wsd-decay-style``, ``--lr-wsd-decay-iters``).

The schedule counts in one unit (``unit``): optimizer steps (a run given by --train-iters) or, as Megatron-LM does
for a run given by --train-samples, samples: every update then advances it by its global batch, so during a batch
ramp the warmup and decay follow the samples (tokens) seen, not the number of smaller early steps.

A torch LRScheduler so DeepSpeed saves/loads it with the checkpoint and steps it only on applied optimizer
steps (skipped fp16 overflow steps do not advance it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

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
UNITS = ("iters", "samples")
"""What the schedule counts: optimizer steps (--train-iters) or samples (--train-samples, as Megatron-LM)."""
LEGACY_SETTINGS = {**PRE_WSD_SETTINGS, "unit": "iters"}
"""What a schedule saved before a setting existed ran with (no anneal phase; counted in steps)."""
FORMULA_SETTINGS = ("peak", "min_lr", "warmup", "decay_iters", "style", "wsd_decay_iters", "wsd_style")
"""lr_at's keywords; warmup, decay_iters and wsd_decay_iters are in the schedule's unit."""
SETTINGS = (*FORMULA_SETTINGS, "unit")
"""The schedule's settings: WarmupLinearDecay's attributes and saved state."""


def schedule_settings(
    peak: float,
    min_lr: float,
    warmup: int,
    decay_iters: int,
    style: str,
    wsd_decay_iters: int = 0,
    wsd_style: str = WSD_DEFAULT_STYLE,
    unit: str = "iters",
) -> dict[str, Any]:
    """The SETTINGS dict (WarmupLinearDecay's keywords and saved state), normalised for comparison on resume."""
    if unit not in UNITS:
        raise ValueError(f"schedule unit must be one of {UNITS}, got {unit!r}")
    return {
        "peak": float(peak),
        "min_lr": float(min_lr),
        "warmup": int(warmup),
        "decay_iters": int(decay_iters),
        "style": style,
        "wsd_decay_iters": int(wsd_decay_iters),
        "wsd_style": wsd_style,
        "unit": unit,
    }


@dataclass(frozen=True)
class Point:
    """Where an update falls in the schedule, in its unit: what a registered style turns into an LR."""

    n: int
    """Units counted, this update included (n > warmup: the warmup is common to every style)."""
    peak: float
    min_lr: float
    warmup: int
    decay_iters: int
    wsd_decay_iters: int
    wsd_style: str

    @property
    def decayed(self) -> bool:
        """Past the decay length (or no decay length after warmup): the LR is min_lr."""
        return self.n > self.decay_iters or self.decay_iters <= self.warmup

    @property
    def ratio(self) -> float:
        """Fraction of the decay (after warmup) done."""
        return (self.n - self.warmup) / (self.decay_iters - self.warmup)

    def between(self, coeff: float) -> float:
        """min_lr + coeff x (peak - min_lr)."""
        return self.min_lr + (self.peak - self.min_lr) * coeff


LR_STYLES: dict[str, Callable[[Point], float]] = {}
"""--lr-decay-style name -> the LR after warmup (registered with :func:`register_lr_style`; the flag's choices, the
docs table and the tests' parameters come from here)."""


def register_lr_style(name: str) -> Callable[[Callable[[Point], float]], Callable[[Point], float]]:
    """Decorator adding an LR decay style: ``@register_lr_style("name") def f(p: Point) -> float`` (its docstring is
    the docs' line)."""

    def add(fn: Callable[[Point], float]) -> Callable[[Point], float]:
        if name in LR_STYLES:
            raise ValueError(f"LR decay style {name!r} is registered twice")
        if not (fn.__doc__ or "").strip():
            raise TypeError(f"LR decay style {name!r} needs a docstring (its line in docs/configuration.md)")
        LR_STYLES[name] = fn
        return fn

    return add


@register_lr_style("linear")
def _linear(p: Point) -> float:
    """Linear decay from the peak to min_lr over the decay length (BERT, RoBERTa, BlockBERT, DIET)."""
    return p.min_lr if p.decayed else p.between(1.0 - p.ratio)


@register_lr_style("cosine")
def _cosine(p: Point) -> float:
    """Half a cosine from the peak to min_lr over the decay length."""
    return p.min_lr if p.decayed else p.between(0.5 * (math.cos(math.pi * p.ratio) + 1.0))


@register_lr_style("constant")
def _constant(p: Point) -> float:
    """The peak LR after warmup, to the end (min_lr is not used)."""
    return p.peak


@register_lr_style("WSD")
def _wsd(p: Point) -> float:
    """Warmup-stable-decay: the peak until the last --lr-wsd-decay-iters/-samples of the decay length, then an anneal
    to min_lr shaped by --lr-wsd-decay-style (ModernBERT; Megatron-LM's name)."""
    if p.decayed:
        return p.min_lr
    anneal_start = p.decay_iters - p.wsd_decay_iters
    if p.n <= anneal_start:
        return p.peak
    if p.wsd_decay_iters <= 0:
        return p.min_lr
    return p.between(WSD_DECAY_STYLES[p.wsd_style]((p.n - anneal_start) / p.wsd_decay_iters))


def lr_at(
    step: int,
    peak: float,
    min_lr: float,
    warmup: int,
    decay_iters: int,
    style: str = "linear",
    wsd_decay_iters: int = 0,
    wsd_style: str = WSD_DEFAULT_STYLE,
    increment: int = 1,
) -> float:
    """LR of the update that follows `step` applied units and adds `increment` more (1 step; or its global batch
    when the schedule counts samples): Megatron-LM's ``get_lr`` at ``num_steps = step + increment``, i.e. counting
    this update (Megatron applies that LR one update later: its first update runs at --lr-warmup-init, 0). A linear
    warmup, then the registered style's LR."""
    n = step + increment
    if warmup > 0 and n <= warmup:
        return peak * n / warmup
    return LR_STYLES[style](Point(n, peak, min_lr, warmup, decay_iters, wsd_decay_iters, wsd_style))


class WarmupLinearDecay(LRScheduler):
    """Sets every param group's lr to lr_at(last_epoch, increment=next_increment); state is last_epoch (units
    applied: steps, or samples) plus the settings.

    Counting samples, DeepSpeed's ``engine.step(lr_kwargs={"increment": batch})`` advances it by each applied
    update's batch, and the trainer calls ``set_next_increment(batch)`` before each step, so the LR of a step during
    a batch ramp counts the samples of that step."""

    def __init__(self, optimizer: torch.optim.Optimizer, **settings: Any) -> None:
        """``settings``: :func:`schedule_settings`'s arguments by keyword (``style`` linear unless given), checked and
        normalised there: they become the attributes and the saved state."""
        self.__dict__.update(schedule_settings(**{"style": "linear", **settings}))
        self.next_increment = 1
        super().__init__(optimizer)

    def load_state_dict(self, state_dict: dict) -> None:
        """A checkpoint from before WSD (or sample counting) existed lacks those settings: it ran without an anneal
        phase, counting steps."""
        super().load_state_dict({**LEGACY_SETTINGS, **state_dict})

    def step(self, increment: int | None = None) -> None:  # type: ignore[override]
        """One applied update: ``increment`` units (default 1 step)."""
        if increment is not None:
            self.last_epoch += int(increment) - 1  # torch's step adds the last one
        super().step()

    def set_next_increment(self, increment: int) -> None:
        """The next update adds ``increment`` units (its global batch, counting samples): set the LR it uses."""
        self.next_increment = int(increment)
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = list(lrs)

    def get_lr(self) -> list[float]:
        lr = lr_at(self.last_epoch, **{k: getattr(self, k) for k in FORMULA_SETTINGS}, increment=self.next_increment)
        return [lr for _ in self.optimizer.param_groups]
