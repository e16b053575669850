"""The pretraining loop over a run's parts (pretrain/parts.py builds them in the order a bit-exact resume needs):
train_step (its micro_batches, one micro_step each), then where due the metrics logger's log, the validator's
evaluation and the checkpointer's save, as pretrain/decision.py decides; the fault hook is the one place faults
enter; close() always runs.

The parts: :class:`pretrain.checkpointer.Checkpointer` (resume decision, load, save, retention, integrity, the
non-finite refusal), :class:`pretrain.metrics.MetricsLogger` (log window, throughput, MFU, stragglers, console, JSON
and TensorBoard), :class:`pretrain.validator.Validator` (held-out batches), :class:`pretrain.faults.Faults`.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import torch
import torch.distributed as dist

from pretrain.args import RunConfig
from pretrain.batches import device_batch, host_tokens  # noqa: F401  (device_batch: the benchmarks' import)
from pretrain.checkpointer import NonFiniteLossError
from pretrain.decision import Decision, Reason, StopRules, decide, runs_a_step, signal_check_due
from pretrain.distributed import all_ranks_true, destroy_distributed
from pretrain.metrics import LogWindow, log_line, peak_memory_mb  # noqa: F401  (re-exported: one trainer API)
from pretrain.parallelize import clip_gradients
from pretrain.parts import Parts, build_parts

__all__ = ["NonFiniteLossError", "Parts", "Trainer", "device_batch", "log_line", "peak_memory_mb"]


class Trainer:
    """``Trainer(run)`` builds every part from the run's settings (pretrain/parts.py ``build_parts``; with
    ``run_config_text``, each checkpoint gets it as ``config.toml``); ``Trainer(parts=...)`` runs the loop over
    parts built elsewhere (a test's)."""

    def __init__(
        self, run: RunConfig | None = None, *, run_config_text: str | None = None, parts: Parts | None = None
    ) -> None:
        if parts is None:
            if run is None:
                raise TypeError("Trainer needs a RunConfig (or parts=)")
            parts = build_parts(run, run_config_text)
        self.parts = parts
        self.run, self.ds, self.dist, self.engine = parts.run, parts.ds, parts.dist, parts.engine
        self.batch, self.train_iters, self.train_iter = parts.batch, parts.train_iters, parts.train_iter
        self.checkpointer, self.metrics, self.validator = parts.checkpointer, parts.metrics, parts.validator
        self.faults, self.watchdog, self.timer, self.signal = parts.faults, parts.watchdog, parts.timer, parts.signal
        self.iteration, self.consumed_samples = parts.iteration, parts.consumed_samples
        self.say, self.to_device, self.count_tokens = parts.say, parts.to_device, host_tokens
        self.grad_norm = None
        """The last step's gradient norm where the trainer clips (parts.own_grad_norm; on the device)."""

    # ------------------------------------------------------------------ steps
    def micro_batches(self, gas: int) -> Iterator[tuple[dict[str, Any], int]]:
        """The data one step consumes: ``gas`` micro-batches of this rank (the accumulation), each on the device with
        its real (unpadded) token count, read from ``train_iter`` inside the data time the straggler check measures."""
        for _ in range(gas):
            try:
                with self.timer.data():
                    self.faults.before_micro_batch(self.dist.rank)
                    host = next(self.train_iter)
            except StopIteration:
                raise RuntimeError(
                    f"the training data ran out at iteration {self.iteration + 1}; the sample index "
                    "was built for fewer samples than --train-iters x --global-batch-size"
                ) from None
            tokens = self.count_tokens(host)
            yield self.to_device(host), tokens

    def micro_step(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward and backward of one micro-batch. Returns its loss (auxiliary loss included) and auxiliary loss,
        detached and still on the device."""
        engine = self.engine
        with self.timer.forward():
            out = engine(**batch)
        loss = out.loss
        aux = engine.module.auxiliary_loss()
        if aux is not None:
            loss = loss + aux
        loss = self.faults.on_loss(loss, self.iteration + 1, self.dist.rank)
        engine.backward(loss)
        return loss.detach(), None if aux is None else aux.detach()

    def train_step(self) -> dict[str, Any]:
        """One optimizer step over `gas` micro-batches. Raises NonFiniteLossError on every rank together.

        Nothing here waits for the device except, in bf16/fp32, the one all-reduce per step that decides (on all
        ranks together, before the update) whether the loss was finite; fp16 leaves that to the loss scaler.
        Loss and auxiliary-loss sums stay on the device until a log interval reads them; tokens are counted on the
        host batch.
        """
        engine, device = self.engine, self.dist.device
        skipped_before = engine.skipped_steps
        batch_size, gas = self.batch.at(self.consumed_samples, engine)
        # the LR this step uses: counting samples, the schedule counts this step's batch (a ramp changes it)
        increment = batch_size if engine.lr_scheduler.unit == "samples" else 1
        engine.lr_scheduler.set_next_increment(increment)
        lr = engine.get_lr()[0]
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        tokens = 0
        aux_sum = None
        for micro, (batch, batch_tokens) in enumerate(self.micro_batches(gas)):
            last = micro == gas - 1
            if self.batch.ramp is not None:  # DeepSpeed's own count of micro-steps assumes a fixed accumulation
                engine.set_gradient_accumulation_boundary(last)
            tokens += batch_tokens
            loss, aux = self.micro_step(batch)
            if aux is not None:
                aux_sum = aux.double() + (0.0 if aux_sum is None else aux_sum)
            loss_sum += loss.double()
            if last:
                self._before_update(loss_sum)
            engine.step(lr_kwargs={"increment": increment})
        self.iteration += 1
        self.consumed_samples += batch_size
        return {
            "loss_sum": loss_sum / gas,
            "tokens": tokens,
            "samples": batch_size,
            "skipped": engine.skipped_steps - skipped_before,
            "aux_loss": None if aux_sum is None else aux_sum / gas,
            "lr": lr,
        }

    def _before_update(self, loss_sum: torch.Tensor) -> None:
        """At the accumulation boundary (gradients reduced, update not yet applied): stop every rank together on a
        non-finite loss (bf16/fp32), and clip where DeepSpeed does not (ds.trainer_clips: ZeRO-0 fp32 or autocast)."""
        if self.ds.precision != "fp16" and not all_ranks_true(torch.isfinite(loss_sum), self.dist.device):
            raise NonFiniteLossError(
                f"non-finite loss at iteration {self.iteration + 1} ({self.ds.precision}); every rank stopped "
                f"before the update. Last complete checkpoint: {self.checkpointer.last_checkpoint_text()}"
            )
        if self.parts.own_grad_norm:
            self.grad_norm = clip_gradients(self.engine.module, self.ds.clip_grad)

    # ------------------------------------------------------------------ loop
    def save(self) -> str:
        """The checkpointer's save of this step (every rank)."""
        return self.checkpointer.save(self.engine, self.iteration, self.consumed_samples)

    def evaluate(self) -> dict[str, float]:
        """The validator's metrics now (every rank)."""
        return self.validator.evaluate()

    def train(self) -> bool:
        """Run to --train-iters (or --exit-interval). Returns False when --exit-signal-handler stopped the run early
        (after saving), True otherwise.

        Each step: the fault hook, train_step, the log and evaluation where due, then pretrain/decision.py's
        decision (the signal asked only where it is due: a collective), a save, an exit."""
        loop = self.run.loop
        rules = StopRules.of(loop, self.run.checkpoint, self.train_iters)
        self.engine.train()
        window = LogWindow()
        self.watchdog.arm()
        decision = None
        while runs_a_step(self.iteration, rules):
            self.faults.before_step(self.iteration + 1, self.dist.rank)
            step = self.train_step()
            self.watchdog.progress(self.iteration)
            window.add(step)
            if self.iteration % loop.log_interval == 0 or self.iteration == self.train_iters:
                self.metrics.log(step, window, self.iteration, self.consumed_samples, self.grad_norm)
                window = LogWindow()
            paused = time.perf_counter()
            if loop.eval_interval and self.iteration % loop.eval_interval == 0:
                self.metrics.log_eval(self.evaluate(), self.iteration)
            signalled = signal_check_due(self.iteration, rules) and self.signal.received_anywhere(self.dist.device)
            decision = decide(self.iteration, rules, signalled)
            if decision.saves:
                self.save()
                self.watchdog.progress()
            # evaluation and checkpointing are not training: keep them out of the window's tokens/s (as
            # Megatron-LM stops its interval timer around evaluation)
            window.start += time.perf_counter() - paused
            if decision.exits:
                self._say_why(decision)
                break
        self.checkpointer.export_dam_masks(self.engine.module)
        self._drain()
        return decision is None or decision.reason is not Reason.SIGNAL

    def _say_why(self, decision: Decision) -> None:
        """The line of a run that stops before --train-iters (nothing for a finished run)."""
        ckpt, loop = self.run.checkpoint, self.run.loop
        if decision.reason is Reason.SIGNAL:
            saved = (
                f"saved {ckpt.save}; run the same command with --load {ckpt.save}"
                if decision.saves
                else "nothing saved (no --save)"
            )
            name = self.signal.received_name or loop.exit_signal
            self.say(f"{name} received: stopping at iteration {self.iteration}; {saved}")
        elif decision.reason is Reason.EXIT_INTERVAL:
            self.say(f"--exit-interval {loop.exit_interval}: stopping at iteration {self.iteration}")

    def _drain(self) -> None:
        """Every rank's collectives finish before any rank leaves, so no rank tears down its sockets while a peer is
        still in a collective. (The gloo abort at interpreter exit this once tried to prevent is avoided by the entry
        point leaving without finalization: common.process.exit_process.)"""
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Flush outputs, stop the loader's workers, restore signal handlers, destroy the process group; safe after any
        failure, safe twice. The entry point then leaves without interpreter finalization (pretrain/train.py), so
        everything that must reach the disk or be joined is done here."""
        if self.train_iter is not None:  # joins the DataLoader's worker processes now, not at interpreter exit
            close_iter = getattr(self.train_iter, "close", None)
            if close_iter is not None:
                close_iter()
            self.train_iter = None
        if self.signal is not None:
            self.signal.restore()
            self.signal = None
        self.metrics.close()
        if self.engine is not None:  # DeepSpeed's own teardown (ZeRO-3 hooks, optimizer) while Python is whole
            self.engine.destroy()
            self.engine = None
        destroy_distributed()
        if self.watchdog is not None:  # armed until here: a teardown that hangs on a lost peer ends too
            self.watchdog.stop()
            self.watchdog = None

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
