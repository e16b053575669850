"""The trainer's batches: how many samples each step takes (:class:`BatchPlan`: fixed, or Megatron's ramp) and
what a host batch becomes on the device (:func:`device_batch`; the benchmarks time the same inputs)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pretrain.args import train_iterations

_BATCH_KEYS = (
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "labels",
    "next_sentence_label",
    "doc_ids",
    "cu_seqlens",
)


def device_batch(batch: dict[str, torch.Tensor], device: torch.device, max_predictions: int | None) -> dict[str, Any]:
    """What the trainer makes of a host batch (benchmarks time the same inputs): the attention mask dropped on
    the host where it masks nothing, the rest copied (pinned and asynchronous on CUDA), and ``max_predictions`` for
    the static MLM gather (None: the boolean-mask head).

    The mask is dropped when it is all ones, and always for packed rows (``doc_ids``: padding carries id -1, a
    document of its own, so no real token attends to it without a key mask; the padding tokens attend to each other
    and carry no label). Attention then runs without a mask (SDPA's unmasked kernels; packed rows: the varlen route
    with ``cu_seqlens``, model/attention/kernels/varlen.py). Under ``--compile`` a padded and an unpadded batch are
    two input signatures, so Dynamo keeps two graphs (tests/test_compile.py holds that count);
    ``cu_seqlens``, whose length is the batch's segment count, is marked dynamic so packed batches share one graph."""
    keys = [k for k in _BATCH_KEYS if k in batch]
    if "attention_mask" in batch and ("doc_ids" in batch or bool(batch["attention_mask"].all())):
        keys.remove("attention_mask")
    if device.type == "cuda":
        out: dict[str, Any] = {k: batch[k].pin_memory().to(device, non_blocking=True) for k in keys}
    else:
        out = {k: batch[k] for k in keys}
    if "cu_seqlens" in out:
        torch._dynamo.maybe_mark_dynamic(out["cu_seqlens"], 0)
    if max_predictions is not None and "labels" in out:
        out["max_predictions"] = max_predictions
    return out


def host_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Real (unpadded) tokens of a host batch."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


@dataclasses.dataclass
class BatchPlan:
    """Micro batch, accumulation steps and global batch (flags and ds_config agreed: ds_config.resolve_batch_sizes)
    on ``world`` data-parallel ranks, and the batch ramp when --rampup-batch-size is given."""

    micro: int
    gas: int
    global_batch: int
    world: int
    ramp: Any = None
    """pretrain.batch_ramp.BatchRamp, or None: every step takes ``global_batch``."""

    def train_iters(self, loop, iteration: int, consumed_samples: int) -> int:
        """--train-iters, or the steps --train-samples allows; on resume, the samples still to consume are counted
        with this run's global batch (it may differ from the checkpoint's). With a batch ramp, Megatron's count from
        the start: the ramp depends only on consumed samples, so a resume has the same steps."""
        if self.ramp is not None:
            return self.ramp.train_iters(loop.train_samples)
        if loop.train_samples is None or iteration == 0:
            return train_iterations(loop, self.global_batch)
        remaining = max(0, loop.train_samples - consumed_samples) // self.global_batch
        return iteration + remaining

    def samples_needed(self, train_iters: int, iteration: int, consumed_samples: int) -> int:
        """Samples the sample index must hold: those consumed plus those of the steps still to run."""
        left = train_iters - iteration
        if self.ramp is not None:
            return self.ramp.samples_after(consumed_samples, left)
        return consumed_samples + left * self.global_batch

    def at(self, consumed_samples: int, engine) -> tuple[int, int]:
        """(global batch, accumulation steps) of the next step: the ramp's (DeepSpeed's engine told), else fixed."""
        if self.ramp is None:
            return self.global_batch, self.gas
        batch = self.ramp.batch_at(consumed_samples)
        if batch != engine.train_batch_size():
            engine.set_train_batch_size(batch)
        return batch, batch // (self.micro * self.world)
