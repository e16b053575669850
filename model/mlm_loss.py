"""The MLM loss over the vocabulary-sized decoder without a full logits tensor.

The plain loss (``F.cross_entropy(logits.float(), targets)``) keeps the fp32 log-softmax of every predicted row
until the backward (about 2 GB at bert-base, N=512, batch 128, 128 slots per row: issue #47), and its forward holds
the logits, their fp32 copy and that log-softmax at once.
:func:`chunked_mlm_loss` computes the same sum a chunk of rows at a time inside ``torch.utils.checkpoint`` (non
re-entrant): each chunk's logits are freed as soon as its loss is summed and recomputed, one chunk at a time, in
the backward. What the backward keeps is the chunk's input rows ([T, D]); the price is one more decoder GEMM per
step (about 1% of bert-base's FLOPs at a 15% mask rate). The gradients are autograd's own (autocast and fp16 loss
scaling behave as in the plain path: the upstream gradient is known when the chunk's gradient is formed).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHUNK_LOGITS = 1 << 26
"""Logits per chunk (rows x padded vocabulary): about 2,200 rows of bert-base's 30,528, whose bf16 logits, fp32
copy and fp32 log-softmax take about 0.7 GB while the chunk is computed."""


def chunk_rows(padded_vocab: int, logits_per_chunk: int = CHUNK_LOGITS) -> int:
    """Predicted rows per chunk so that a chunk holds about ``logits_per_chunk`` logits."""
    return max(1, logits_per_chunk // padded_vocab)


def _chunk_loss(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    hidden_cD: torch.Tensor,
    targets_c: torch.Tensor,
    valid_c: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the chunk's cross-entropies over valid rows, fp32; valid rows predicted right)."""
    logits_cV = logits_fn(hidden_cD)
    ce_c = F.cross_entropy(logits_cV.float(), targets_c, reduction="none")
    correct = ((logits_cV.detach().argmax(-1) == targets_c) & valid_c).sum()
    return (ce_c * valid_c).sum(), correct


def chunked_mlm_loss(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    hidden_TD: torch.Tensor,
    targets_T: torch.Tensor,
    valid_T: torch.Tensor,
    rows: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy of the valid rows, number of them predicted right) of ``logits_fn(hidden_TD)`` (the
    MLM head, logits over the real vocabulary) against ``targets_T``, ``rows`` predicted rows at a time, each
    chunk recomputed in the backward (module docstring). Without gradients the chunks just run one after the
    other. ``targets_T`` must be valid class ids everywhere (0 where ``valid_T`` is False)."""
    T = hidden_TD.shape[0]
    grad = torch.is_grad_enabled() and hidden_TD.requires_grad
    total = hidden_TD.new_zeros((), dtype=torch.float32)
    correct = torch.zeros((), dtype=torch.int64, device=hidden_TD.device)
    for start in range(0, max(T, 1), rows):  # T = 0: one empty chunk, so the loss (0) still has a graph
        part = (hidden_TD[start : start + rows], targets_T[start : start + rows], valid_T[start : start + rows])
        if grad:
            ce, ok = checkpoint(_chunk_loss, logits_fn, *part, use_reentrant=False, preserve_rng_state=False)
        else:
            ce, ok = _chunk_loss(logits_fn, *part)
        total = total + ce
        correct = correct + ok
    return total, correct
