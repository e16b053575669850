"""What the training loop does after a step: continue, save, save and exit, or exit. Pure: a function of the step
counter, the run's settings and whether a rank received the exit signal; no I/O, no ranks.

Every rank evaluates it on the same counter and settings, so all ranks decide alike without a message. The one
input that differs between ranks, a received signal, is agreed by an all-reduce the host waits for, so it is asked
only at the steps ``signal_check_due`` names (the log interval, saves, --exit-interval), never every step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pretrain.args import CheckpointConfig, LoopConfig


class Action(enum.Enum):
    CONTINUE = "continue"
    SAVE = "save"
    SAVE_AND_EXIT = "save-and-exit"
    EXIT = "exit"


class Reason(enum.Enum):
    """Why a step saves or ends the run; the first that applies wins, in this order."""

    TRAIN_ITERS = "train-iters"
    """The last step: the run is done (a signal is not asked then: the run ends and saves anyway)."""
    SIGNAL = "signal"
    """A rank received --exit-signal, SIGTERM or SIGINT: the entry point exits 4 (requeue and --load)."""
    EXIT_INTERVAL = "exit-interval"
    """A multiple of --exit-interval."""
    SAVE_INTERVAL = "save-interval"
    """A multiple of --save-interval: save and go on."""


@dataclass(frozen=True)
class StopRules:
    """The settings the decision reads (identical on every rank)."""

    train_iters: int
    """Steps of the whole run (--train-iters, or what --train-samples allows)."""
    save: bool
    """--save given: without it nothing is saved, and the run still stops where it would have saved and stopped."""
    save_interval: int | None = None
    exit_interval: int | None = None
    signal_every: int | None = None
    """Ask the ranks about the signal every this many steps (--exit-signal-interval, default --log-interval); None:
    no --exit-signal-handler, never asked."""

    @classmethod
    def of(cls, loop: LoopConfig, ckpt: CheckpointConfig, train_iters: int) -> StopRules:
        signal_every = (loop.exit_signal_interval or loop.log_interval) if loop.exit_signal_handler else None
        return cls(train_iters, bool(ckpt.save), ckpt.save_interval, loop.exit_interval, signal_every)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: Reason | None
    """None with CONTINUE."""

    @property
    def saves(self) -> bool:
        return self.action in (Action.SAVE, Action.SAVE_AND_EXIT)

    @property
    def exits(self) -> bool:
        return self.action in (Action.EXIT, Action.SAVE_AND_EXIT)


def runs_a_step(iteration: int, rules: StopRules) -> bool:
    """Whether the loop takes another step after ``iteration`` steps (a run resumed at its last step takes none)."""
    return iteration < rules.train_iters


def _multiple(iteration: int, interval: int | None) -> bool:
    return bool(interval) and iteration % interval == 0


def signal_check_due(iteration: int, rules: StopRules) -> bool:
    """Whether the ranks ask, after step ``iteration``, whether one of them received the signal (a collective):
    every ``signal_every`` steps and at every --save-interval and --exit-interval step (a multiple of
    --save-interval asks even without --save), never at the last step."""
    if rules.signal_every is None or iteration >= rules.train_iters:
        return False
    return any(_multiple(iteration, k) for k in (rules.signal_every, rules.exit_interval, rules.save_interval))


def decide(iteration: int, rules: StopRules, signalled: bool) -> Decision:
    """What to do after step ``iteration``. ``signalled``: the ranks' answer to the signal question, which counts
    only where ``signal_check_due`` asks it. Exiting saves when --save is given; so does a --save-interval step."""
    signalled = signalled and signal_check_due(iteration, rules)
    if iteration >= rules.train_iters:
        reason = Reason.TRAIN_ITERS
    elif signalled:
        reason = Reason.SIGNAL
    elif _multiple(iteration, rules.exit_interval):
        reason = Reason.EXIT_INTERVAL
    elif _multiple(iteration, rules.save_interval):
        reason = Reason.SAVE_INTERVAL
    else:
        return Decision(Action.CONTINUE, None)
    if reason is Reason.SAVE_INTERVAL:
        return Decision(Action.SAVE, reason) if rules.save else Decision(Action.CONTINUE, None)
    return Decision(Action.SAVE_AND_EXIT if rules.save else Action.EXIT, reason)
