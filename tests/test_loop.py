"""The training loop without launching ranks: pretrain/decision.py's stop/save decision (save interval, the last
step, a signal or --exit-interval stopping the run, exiting without a save when there is no --save, resuming at a
step boundary, which steps ask the ranks about the signal), and the real ``Trainer.train`` driven by stand-ins for
the step, the save and the ranks' answer, with a real signal sent through the fault hook."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pretrain import faults
from pretrain.args import CheckpointConfig, LoopConfig
from pretrain.batches import BatchPlan
from pretrain.decision import Action, Decision, Reason, StopRules, decide, runs_a_step, signal_check_due
from pretrain.distributed import ExitSignal
from pretrain.trainer import Parts, Trainer


def rules(train_iters: int = 12, save: bool = True, **kw) -> StopRules:
    return StopRules(train_iters, save, **kw)


def walk(r: StopRules, start: int = 0, signal_from: int | None = None) -> list[tuple[int, Decision]]:
    """The decisions of the loop from ``start`` steps on, as the loop makes them: the signal (received before step
    ``signal_from``) counts only where it is asked; every decision that is not CONTINUE, up to the exit."""
    out, it = [], start
    while runs_a_step(it, r):
        it += 1
        d = decide(it, r, signal_check_due(it, r) and signal_from is not None and it >= signal_from)
        if d.action is not Action.CONTINUE:
            out.append((it, d))
        if d.exits:
            break
    return out


def test_save_interval_and_the_last_step():
    r = rules(10, save_interval=3)
    assert walk(r) == [
        (3, Decision(Action.SAVE, Reason.SAVE_INTERVAL)),
        (6, Decision(Action.SAVE, Reason.SAVE_INTERVAL)),
        (9, Decision(Action.SAVE, Reason.SAVE_INTERVAL)),
        (10, Decision(Action.SAVE_AND_EXIT, Reason.TRAIN_ITERS)),
    ]
    assert walk(rules(9, save_interval=3))[-1] == (9, Decision(Action.SAVE_AND_EXIT, Reason.TRAIN_ITERS))


def test_without_save_nothing_is_saved_and_the_run_still_stops_where_it_would():
    assert walk(rules(10, save=False, save_interval=3)) == [(10, Decision(Action.EXIT, Reason.TRAIN_ITERS))]
    assert walk(rules(10, save=False, exit_interval=4)) == [(4, Decision(Action.EXIT, Reason.EXIT_INTERVAL))]
    assert walk(rules(12, save=False, signal_every=4), signal_from=5) == [(8, Decision(Action.EXIT, Reason.SIGNAL))]


def test_exit_interval_saves_and_stops_unless_the_run_is_done():
    assert walk(rules(6, exit_interval=3)) == [(3, Decision(Action.SAVE_AND_EXIT, Reason.EXIT_INTERVAL))]
    # the last step is a multiple too: the run is done (exit code 0, no --exit-interval line)
    assert decide(6, rules(6, exit_interval=3), False) == Decision(Action.SAVE_AND_EXIT, Reason.TRAIN_ITERS)


def test_a_signal_saves_and_stops_at_the_next_check():
    """Received before step 5, asked every 4 steps: the run saves and stops after step 8 (at most ``signal_every``
    steps after the signal)."""
    assert walk(rules(12, signal_every=4), signal_from=5) == [(8, Decision(Action.SAVE_AND_EXIT, Reason.SIGNAL))]
    assert walk(rules(12, signal_every=4), signal_from=8) == [(8, Decision(Action.SAVE_AND_EXIT, Reason.SIGNAL))]
    # a save or --exit-interval step asks too, and the signal wins over --exit-interval (exit code 4)
    assert walk(rules(12, signal_every=4, save_interval=3), signal_from=5)[-1] == (
        6,
        Decision(Action.SAVE_AND_EXIT, Reason.SIGNAL),
    )
    assert decide(6, rules(12, signal_every=4, exit_interval=6), True).reason is Reason.SIGNAL


def test_a_signal_counts_only_where_it_is_asked_and_never_at_the_last_step():
    r = rules(12, signal_every=4)
    assert decide(5, r, True) == Decision(Action.CONTINUE, None)  # not asked at 5: the answer is not there
    assert decide(12, r, True) == Decision(Action.SAVE_AND_EXIT, Reason.TRAIN_ITERS)  # done: saved, exit code 0
    assert walk(rules(12), signal_from=1) == [(12, Decision(Action.SAVE_AND_EXIT, Reason.TRAIN_ITERS))]  # no handler


@pytest.mark.parametrize(
    "loop, ckpt, asked",
    [
        ({}, {}, [4]),  # the log interval (the last step ends the run anyway)
        ({"exit_signal_interval": 2}, {}, [2, 4, 6]),
        ({}, {"save": "ck", "save_interval": 3}, [3, 4, 6]),  # and every save
        ({}, {"save_interval": 3}, [3, 4, 6]),  # a --save-interval step asks even without --save
        ({"exit_interval": 3}, {}, [3]),  # --exit-interval: the run stops there
        ({"exit_signal_handler": False}, {"save": "ck", "save_interval": 3}, []),  # no handler: never asked
    ],
)
def test_the_signal_is_asked_at_the_log_interval_saves_and_exit_interval_only(loop, ckpt, asked):
    """8 steps, --log-interval 4: the question is an all-reduce the host waits for, so it is not asked every step."""
    settings = {"train_iters": 8, "log_interval": 4, "exit_signal_handler": True, **loop}
    r = StopRules.of(LoopConfig(**settings), CheckpointConfig(**ckpt), 8)
    taken, it = [], 0
    while runs_a_step(it, r):
        it += 1
        taken += [it] if signal_check_due(it, r) else []
        if decide(it, r, False).exits:
            break
    assert taken == asked


def test_resume_at_a_step_boundary_continues_the_straight_runs_decisions():
    """The decision depends on the step counter alone: a run resumed after step k decides as the straight run from
    k + 1 on (no exit at the step it resumed at, even on an --exit-interval multiple); resumed at its last step (or
    with a shorter --train-iters) it takes no step."""
    r = rules(12, save_interval=4, signal_every=2)
    straight = walk(r)
    for k in range(12):
        assert walk(r, start=k) == [(it, d) for it, d in straight if it > k]
    assert walk(rules(6, exit_interval=3), start=3) == [(6, Decision(Action.SAVE_AND_EXIT, Reason.TRAIN_ITERS))]
    assert not runs_a_step(12, r) and not runs_a_step(13, r) and runs_a_step(11, r)
    assert walk(r, start=12) == []


def test_stop_rules_read_the_flags():
    loop = LoopConfig(train_iters=9, log_interval=5, exit_signal_handler=True, exit_interval=7)
    assert StopRules.of(loop, CheckpointConfig(save="ck", save_interval=3), 9) == StopRules(9, True, 3, 7, 5)
    loop = LoopConfig(train_iters=9, exit_signal_handler=True, exit_signal_interval=2)
    assert StopRules.of(loop, CheckpointConfig(), 9) == StopRules(9, False, None, None, 2)
    assert StopRules.of(LoopConfig(train_iters=9), CheckpointConfig(), 9).signal_every is None


# ------------------------------------------------------------------ the real loop, stand-ins for the ranks' work
class Recorder:
    """The parts the loop calls (checkpointer, metrics logger, validator) and the ranks' answer to the signal
    question, as one stand-in that records what the loop asked of it, and when, in ``events``."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.trainer: Trainer | None = None  # whose step counter "when" is

    def save(self, engine, iteration: int, consumed_samples: int) -> str:
        self.events.append(("save", iteration))
        return f"iter_{iteration:07d}"

    def export_dam_masks(self, module) -> None:
        self.events.append(("end", self.trainer.iteration))

    def log(self, step, window, iteration: int, consumed_samples: int, grad_norm=None) -> dict:
        self.events.append(("log", iteration, window.iters, window.tokens))
        return {}

    def log_eval(self, metrics: dict, iteration: int) -> None:
        self.events.append(("eval", iteration))

    def evaluate(self) -> dict:
        return {"loss": 1.0}

    def close(self) -> None:
        self.events.append(("closed",))


class AskedSignal(ExitSignal):
    """The real handler; the ranks' answer on one rank (the all-reduce of all_ranks_true over one rank), recorded."""

    def __init__(self, name: str, recorder: Recorder) -> None:
        super().__init__(name)
        self.recorder = recorder

    def received_anywhere(self, device) -> bool:
        self.recorder.events.append(("ask", self.recorder.trainer.iteration))
        return self.received


class CountingSteps(Trainer):
    """The real Trainer (loop, decision, fault hook, close) with a step that only counts: 2 samples, 10 tokens."""

    def train_step(self) -> dict:
        self.iteration += 1
        self.consumed_samples += 2
        return {"tokens": 10, "samples": 2}


def loop_trainer(tmp_path, iters: int, loop: dict, ckpt: dict, hook: faults.Faults, start: int = 0):
    """A Trainer built from parts whose loop (``train``) and ``close`` are the real ones; the checkpointer, metrics
    logger and validator are one recording stand-in (``trainer.recorder``), the step only counts."""
    rec, printed = Recorder(), []
    loop_config = LoopConfig(train_iters=iters, **{"log_interval": 1, "eval_interval": 0, **loop})
    run = SimpleNamespace(loop=loop_config, checkpoint=CheckpointConfig(**ckpt))
    parts = Parts(
        run=run,
        ds=None,
        dist=SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu")),
        engine=SimpleNamespace(train=lambda: None, module=None, destroy=lambda: rec.events.append(("destroyed",))),
        batch=BatchPlan(micro=2, gas=1, global_batch=2, world=1),
        train_iters=iters,
        checkpointer=rec,
        metrics=rec,
        validator=rec,
        train_iter=None,
        to_device=lambda batch: batch,
        faults=hook,
        watchdog=SimpleNamespace(arm=lambda: None, progress=lambda iteration=None: None, stop=lambda: None),
        timer=None,
        signal=AskedSignal(loop_config.exit_signal, rec) if loop_config.exit_signal_handler else None,
        say=printed.append,
        iteration=start,
        consumed_samples=2 * start,
    )
    t = CountingSteps(parts=parts)
    rec.trainer, t.recorder, t.printed = t, rec, printed
    return t


def run_loop(t) -> bool:
    """train(), then the guaranteed close(): the signal handler restored, the parts closed in order."""
    try:
        return t.train()
    finally:
        t.close()
        assert t.recorder.events[-2:] == [("closed",), ("destroyed",)] and t.signal is None and t.engine is None
        del t.recorder.events[-2:]
        t.events = t.recorder.events


def test_the_loop_saves_stops_and_logs_where_the_decision_says(tmp_path):
    loop = {"exit_signal_handler": True, "log_interval": 4, "eval_interval": 3}
    t = loop_trainer(tmp_path, 8, loop, {"save": str(tmp_path), "save_interval": 3}, faults.Faults())
    assert run_loop(t) is True
    assert t.events == [
        ("eval", 3),
        ("ask", 3),
        ("save", 3),
        ("log", 4, 4, 40),
        ("ask", 4),
        ("eval", 6),
        ("ask", 6),
        ("save", 6),
        ("log", 8, 4, 40),
        ("save", 8),
        ("end", 8),
    ]
    assert t.printed == []


def test_a_signal_sent_through_the_fault_hook_saves_and_stops_at_the_next_check(tmp_path):
    """SIGTERM at the start of step 5 (SPARSEBERT_FAULT_SIGNAL through the hook), the handler configured for
    SIGUSR1, asked every 4 steps: caught, saved and stopped after step 8, train() False (the entry's exit code 4)."""
    hook = faults.from_environment({"SPARSEBERT_FAULT_SIGNAL": "0:5:SIGTERM"})
    loop = {"exit_signal_handler": True, "exit_signal": "SIGUSR1", "log_interval": 4}
    t = loop_trainer(tmp_path, 12, loop, {"save": str(tmp_path)}, hook)
    assert run_loop(t) is False
    assert t.events == [("log", 4, 4, 40), ("ask", 4), ("log", 8, 4, 40), ("ask", 8), ("save", 8), ("end", 8)]
    assert t.printed == [
        f"SIGTERM received: stopping at iteration 8; saved {tmp_path}; run the same command with --load {tmp_path}"
    ]


def test_exit_interval_and_a_resumed_run_in_the_loop(tmp_path):
    t = loop_trainer(tmp_path, 6, {"exit_interval": 3}, {"save": str(tmp_path)}, faults.Faults())
    assert run_loop(t) is True
    assert [e for e in t.events if e[0] != "log"] == [("save", 3), ("end", 3)]
    assert t.printed == ["--exit-interval 3: stopping at iteration 3"]
    t = loop_trainer(tmp_path, 6, {"exit_interval": 3}, {"save": str(tmp_path)}, faults.Faults(), start=3)
    assert run_loop(t) is True
    assert [e for e in t.events if e[0] != "log"] == [("save", 6), ("end", 6)] and t.printed == []
    t = loop_trainer(tmp_path, 6, {}, {"save": str(tmp_path)}, faults.Faults(), start=6)
    assert run_loop(t) is True and t.events == [("end", 6)]  # resumed at its last step: no step, no save


def test_without_save_a_signal_stops_the_loop_saying_nothing_was_saved(tmp_path):
    hook = faults.from_environment({"SPARSEBERT_FAULT_SIGNAL": "0:2:SIGUSR1"})
    loop = {"exit_signal_handler": True, "exit_signal": "SIGUSR1", "log_interval": 2}
    t = loop_trainer(tmp_path, 6, loop, {}, hook)
    assert run_loop(t) is False
    assert ("save", 2) not in t.events and t.events[-1] == ("end", 2)
    assert t.printed == ["SIGUSR1 received: stopping at iteration 2; nothing saved (no --save)"]
