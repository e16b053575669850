"""``--micro-batch-size auto``: the largest micro batch that fits the GPU's memory, the global batch kept.

The recipes fix the global batch (the paper's tokens per step); the micro batch is a speed setting: on one H200 at
N=512 bert-base bf16 reached 18.5% MFU at micro batch 32 and 27.6% at 128 (the bf3efde run,
``docs/gpu_reports/2026-11-27-h200-bf3efde/``). So ``auto`` picks, from :data:`CANDIDATES`, the largest micro batch
that divides the per-rank batch (global batch / data-parallel ranks, and the ``--rampup-batch-size`` start and
increment when a ramp is on) and whose estimated peak memory fits the free device memory; gradient accumulation
makes up the rest. On a CPU it takes :data:`CPU_DEFAULT` (or the largest candidate below it that divides), so CPU runs
and tests are deterministic.

The memory estimate is a formula of the model (no probe step: the same on every rank, before anything is built):

- per token and layer, ``18 h + 4 f`` bytes of 16-bit activations (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", Table 2: ``34 h`` at ``f = 4 h``, attention without the ``N x N``
  scores, as SDPA/cuDNN/flash keep none); fp32 training doubles it;
- the MLM head per gathered slot: the vocabulary's logits in 16 bits, their fp32 copy and the saved log-softmax
  (``10 V`` bytes); embeddings ``5 h`` bytes per token;
- static: ``20`` bytes per parameter (16-bit weights and gradients, fp32 master weights, fp32 gradient partition,
  Adam's two moments; ZeRO's partitioning only lowers it).

Checked against the bf3efde run (docs/gpu_reports/2026-11-27-h200-bf3efde/, eager; tests/test_micro_batch_auto.py
reads it): at N=512 the formula gives 190 MiB per sample against 197.5 measured (torch.cuda.max_memory_allocated,
b=64 and b=128), at N=4096 1451 MiB against 1527 (b=4 and b=16). The
choice keeps :data:`ACTIVATION_MARGIN` over the estimate and uses :data:`MEMORY_FRACTION` of the free memory (the
allocator's fragmentation, cuBLAS/cuDNN workspaces, the NCCL buffers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from data_pipeline.data_config import DataConfig
    from model.config import ModelConfig

#: micro batches ``auto`` considers (powers of two: the GEMM shapes stay tensor-core friendly). 128 is the largest:
#: the bf3efde run measured 25.6% MFU at 64 and 27.6% at 128 (N=512), the gain flattening while memory doubles.
CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128)
#: what ``auto`` takes on a CPU (the paper recipes' 8: 32 V100s at N=512), or the largest candidate below it that
#: divides the per-rank batch
CPU_DEFAULT = 8
#: share of the free device memory the estimate may fill
MEMORY_FRACTION = 0.85
#: factor on the per-sample activation estimate (the formula was within 5% of the measurements; eager kernels,
#: other attention kernels and other models keep more)
ACTIVATION_MARGIN = 1.25
#: static bytes per parameter: 16-bit weights (2) and gradients (2), fp32 master weights (4) and gradient partition
#: (4), Adam's two fp32 moments (8)
STATIC_BYTES_PER_PARAM = 20
MIB = 2**20


class MicroBatchError(ValueError):
    """``auto`` cannot choose: no candidate divides the batch, or none fits."""


@dataclass(frozen=True)
class MemoryModel:
    """What the estimate needs of the model and the data (:func:`memory_model` builds it from the configs)."""

    num_layers: int
    hidden_size: int
    ffn_size: int
    """The feed-forward inner width the activations have (2 x intermediate for a GLU's first linear)."""
    vocab_size: int
    seq_length: int
    mlm_slots: int
    """Gathered MLM positions per sample (the logits the head computes)."""
    num_params: int
    activation_bytes: int = 2
    """2 for bf16/fp16 training, 4 for fp32."""

    def per_sample_bytes(self) -> int:
        """Activation bytes one sample keeps for the backward (the formula of the module docstring)."""
        scale = self.activation_bytes / 2
        layer = self.num_layers * (18 * self.hidden_size + 4 * self.ffn_size) * scale
        embed = 5 * self.hidden_size * scale
        head = self.mlm_slots * self.vocab_size * 10
        return int(self.seq_length * (layer + embed) + head)

    def static_bytes(self) -> int:
        return self.num_params * STATIC_BYTES_PER_PARAM


@dataclass(frozen=True)
class MicroBatchChoice:
    """The micro batch ``auto`` chose and why (the trainer prints :attr:`reason`)."""

    micro: int
    reason: str


def divisible_candidates(per_rank_batches: list[int]) -> list[int]:
    """The :data:`CANDIDATES` that divide every per-rank batch (global, ramp start and increment per rank)."""
    return [c for c in CANDIDATES if all(b % c == 0 for b in per_rank_batches)]


def per_rank_batches(global_batch: int, dp_world_size: int, ramp: list[int] | None = None) -> list[int]:
    """The batches a micro batch x ranks must divide, per rank; a clear error when the ranks do not divide one."""
    batches = [("--global-batch-size", global_batch)]
    if ramp is not None:
        batches += [("--rampup-batch-size START", ramp[0]), ("--rampup-batch-size INCREMENT", ramp[1])]
    out = []
    for flag, b in batches:
        if b % dp_world_size:
            raise MicroBatchError(
                f"{flag} {b} is not a multiple of the {dp_world_size} data-parallel ranks, so no micro batch keeps "
                "it; change it (or the number of ranks)"
            )
        out.append(b // dp_world_size)
    return out


def choose_micro_batch(
    per_rank: list[int], device_type: str, free_bytes: int | None = None, model: MemoryModel | None = None
) -> MicroBatchChoice:
    """The micro batch for ``--micro-batch-size auto`` (pure: the memory budget is given).

    ``per_rank``: :func:`per_rank_batches`. On ``device_type`` 'cpu' (or any device without ``free_bytes``) the
    :data:`CPU_DEFAULT`; on a GPU the largest candidate whose estimate fits ``MEMORY_FRACTION x free_bytes``.
    """
    fits = divisible_candidates(per_rank)
    if not fits:
        raise MicroBatchError(
            f"--micro-batch-size auto: no candidate of {list(CANDIDATES)} divides the per-rank batch "
            f"{' and '.join(map(str, per_rank))}; give --micro-batch-size N (a divisor) instead"
        )
    if device_type != "cuda" or free_bytes is None or model is None:
        micro = max(c for c in fits if c <= CPU_DEFAULT)
        return MicroBatchChoice(
            micro,
            f"micro batch {micro} (--micro-batch-size auto on {device_type}: the CPU default {CPU_DEFAULT}, or the "
            f"largest candidate below it dividing the per-rank batch {per_rank[0]}; no memory to fill)",
        )
    budget = MEMORY_FRACTION * free_bytes - model.static_bytes()
    per_sample = ACTIVATION_MARGIN * model.per_sample_bytes()
    chosen = [c for c in fits if c * per_sample <= budget]
    if not chosen:
        raise MicroBatchError(
            f"--micro-batch-size auto: even micro batch 1 needs about {per_sample / MIB:.0f} MiB of activations "
            f"beyond {model.static_bytes() / MIB:.0f} MiB of weights and optimizer state, more than "
            f"{MEMORY_FRACTION:.0%} of the {free_bytes / MIB:.0f} MiB free; use a shorter --seq-length, "
            "--checkpoint-activations with an explicit --micro-batch-size, or more ranks (ZeRO)"
        )
    micro = max(chosen)
    # fits are the powers of two up to the largest divisor of every batch: below it, the next one is 2 x micro
    why = (
        f"the largest candidate dividing the per-rank batch {per_rank[0]}"
        if micro == max(fits)
        else f"{2 * micro} would need about {(2 * micro * per_sample + model.static_bytes()) / MIB:.0f} MiB"
    )
    total = (micro * per_sample + model.static_bytes()) / MIB
    return MicroBatchChoice(
        micro,
        f"micro batch {micro} (--micro-batch-size auto: estimated {total:.0f} MiB = "
        f"{model.static_bytes() / MIB:.0f} MiB static + {micro} x {per_sample / MIB:.1f} MiB per sample "
        f"(activations x {ACTIVATION_MARGIN}) of {MEMORY_FRACTION:.0%} of {free_bytes / MIB:.0f} MiB free; {why}; "
        f"candidates {list(fits)})",
    )


def memory_model(model_config: ModelConfig, data_config: DataConfig, precision: str) -> MemoryModel:
    """The :class:`MemoryModel` of a ModelConfig and DataConfig (parameters counted on the meta device)."""
    import torch

    from model.bert import BertForPreTraining

    with torch.device("meta"):
        num_params = sum(p.numel() for p in BertForPreTraining(model_config).parameters())
    glu = model_config.ffn_type == "glu"
    n = data_config.seq_length
    slots = data_config.max_predictions
    if slots is None:  # dynamic gather: the labelled tokens, p x N plus a margin
        slots = min(n, math.ceil(1.25 * data_config.mask_prob * n))
    return MemoryModel(
        num_layers=model_config.num_layers,
        hidden_size=model_config.hidden_size,
        ffn_size=(2 if glu else 1) * model_config.intermediate_size,
        vocab_size=model_config.vocab_size,
        seq_length=n,
        mlm_slots=slots,
        num_params=num_params,
        activation_bytes=4 if precision == "fp32" else 2,
    )
