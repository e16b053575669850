"""Batch-size warm-up with Megatron-LM's ``--rampup-batch-size START INCREMENT SAMPLES`` semantics, computed by
megatron-core's own ``RampupBatchsizeNumMicroBatchesCalculator``: the global batch starts at START and grows by
INCREMENT every SAMPLES / ((GLOBAL - START) / INCREMENT) consumed samples until it reaches --global-batch-size.

The batch of a step depends only on the samples consumed before it, so a resume (on any number of ranks) continues
the ramp exactly. The micro batch stays fixed; the accumulation steps change (DeepSpeed's
``engine.set_train_batch_size``).
"""

from __future__ import annotations

import warnings

from pretrain.args import ArgsError


def _calculator_class():
    """megatron-core's calculator, imported only for a ramp (the package import is slow and warns that Transformer
    Engine and Apex, which the calculator does not use, are missing)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

    return RampupBatchsizeNumMicroBatchesCalculator


class BatchRamp:
    def __init__(self, ramp: list[int], global_batch: int, micro: int, dp: int) -> None:
        start, increment, samples = ramp
        unit = micro * dp
        if start % unit or increment % unit:
            raise ArgsError(
                f"--rampup-batch-size {start} {increment} {samples}: the start batch and the increment must be "
                f"multiples of micro batch {micro} x {dp} data-parallel rank(s) = {unit}, so every batch of the ramp "
                "is whole micro-batches on every rank"
            )
        if not start <= global_batch or (global_batch - start) % increment:
            raise ArgsError(
                f"--rampup-batch-size {start} {increment} {samples}: the ramp must go from {start} up to the global "
                f"batch {global_batch} in whole increments of {increment}"
            )
        self.ramp_samples = samples
        self.global_batch = global_batch
        if start == global_batch:
            self._calc = None
        else:
            self._calc = _calculator_class()(global_batch, micro, dp, False, 1, start, increment, samples)

    def batch_at(self, consumed_samples: int) -> int:
        """The global batch of the step that starts after ``consumed_samples`` samples."""
        if self._calc is None:
            return self.global_batch
        self._calc.update(consumed_samples, consistency_check=True)
        return self._calc.get_current_global_batch_size()

    def train_iters(self, train_samples: int) -> int:
        """Steps to consume ``train_samples`` (Megatron's ``update_train_iters``: the ramp-up steps, then whole
        global batches; a partial last batch is dropped)."""
        iters, consumed = 0, 0
        while consumed <= self.ramp_samples and consumed <= train_samples:
            consumed += self.batch_at(consumed)
            iters += 1
        if train_samples > consumed:
            iters += (train_samples - consumed) // self.global_batch
        return iters

    def samples_after(self, consumed_samples: int, steps: int) -> int:
        """Samples consumed after ``steps`` more steps from ``consumed_samples``."""
        while steps > 0 and consumed_samples <= self.ramp_samples:
            consumed_samples += self.batch_at(consumed_samples)
            steps -= 1
        return consumed_samples + steps * self.global_batch
