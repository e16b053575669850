"""The kernel registry: every attention kernel is a registered :class:`Kernel` with one signature.

``kernel(q_BHND, k_BHND, v_BHND, *, plan, key_padding_mask_BN, token_mask, score_bias, dropout_p, scale, training)``

- ``plan`` comes from ``kernel.make_plan(layout_HMM, block, seq_len, device, token_mask=None, family=None)`` and
  is cached by the caller per (layout, N, device); ``layout_HMM`` None means full attention. A fixed
  ``token_mask`` (bool ``[H|1, N, N]``, e.g. a SparseBERT pattern) given here is folded into the plan once instead
  of being re-applied every call. A plan object runs itself (``plan.run(q, k, v, call)`` with the per-call inputs
  in a :class:`Call`), so a kernel never dispatches on plan types. ``family`` (the layout family) is read by
  ``auto`` only.
- ``key_padding_mask_BN``: bool, True = key may be attended. ``token_mask``: bool broadcastable to ``[H, N, N]``,
  True = allowed, combined (AND) with the block layout. ``score_bias``: a :class:`~model.attention.bias.ScoreBias`.
- ``doc_ids_BN``: int document id of every token of a packed sequence (None = one document per row); query i may
  attend key j only when ``doc_ids_BN[b, i] == doc_ids_BN[b, j]``, ANDed with everything above. Each kernel applies
  it in its own tiling (dense: a ``[B, 1, N, N]`` mask; block_gather: gathered for its tiles; flex: in the
  ``mask_mod`` and the BlockMask), never by materialising more than the kernel already does.
- ``cu_seqlens``: int32 ``[S + 1]``, given with ``doc_ids_BN`` when the batch carries it: the same documents as runs
  of the flattened batch (padding, id -1, one more run). ``dense`` runs FlashAttention's varlen kernel over them on
  CUDA when nothing else masks (model/attention/kernels/varlen.py); other kernels ignore it.
- Rows with nothing to attend to return zeros (and zero gradients), never NaN.

``dense`` is the reference that every other kernel is tested against (tests/test_attention.py takes the list of
kernels from :data:`KERNELS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from model.attention.bias import ScoreBias


@dataclass(frozen=True)
class Call:
    """What one attention call passes to a plan besides q/k/v (every plan's ``run(q, k, v, call)``)."""

    key_padding_mask_BN: torch.Tensor | None = None
    """bool, True = key may be attended."""
    token_mask: torch.Tensor | None = None
    """bool broadcastable to ``[H, N, N]``, True = allowed; ANDed with the layout and the plan's fixed mask."""
    score_bias: ScoreBias | None = None
    """Additive score bias (DIET), applied by each plan in its own tiling."""
    dropout_p: float = 0.0
    """Attention dropout of this call (0 outside training)."""
    scale: float | None = None
    """Score scale (None: 1/sqrt(head size))."""
    configured_dropout_p: float = 0.0
    """The module's attention dropout whether or not this call trains (``auto`` decides on it, so training and
    evaluation run the same kernel); not unpacked by ``__iter__``."""
    doc_ids_BN: torch.Tensor | None = None
    """int, the document of every token (packed sequences): attention stays inside a document; None = no document
    mask. Not unpacked by ``__iter__``."""
    cu_seqlens: torch.Tensor | None = None
    """int32 ``[S + 1]``, with ``doc_ids_BN`` of a packed batch: where each run of equal ids starts in the flattened
    ``B * N`` tokens (model/attention/kernels/varlen.py). Read by ``dense``'s varlen route only; every kernel keeps
    applying ``doc_ids_BN``. Not unpacked by ``__iter__``."""

    def __iter__(self):
        """The first five fields in order, not copied (``dataclasses.astuple`` would deep-copy the tensors)."""
        return iter((self.key_padding_mask_BN, self.token_mask, self.score_bias, self.dropout_p, self.scale))


KERNELS: dict[str, "Kernel"] = {}
"""Registered kernels by name (one instance each); ``--attention-kernel`` choices and the tests come from here."""


def register_kernel(name: str) -> Callable[[type], type]:
    """Class decorator: register one instance of the kernel class under ``name``."""

    def deco(cls: type) -> type:
        if name in KERNELS:
            raise ValueError(f"attention kernel {name!r} is registered twice")
        cls.name = name
        KERNELS[name] = cls()
        return cls

    return deco


def get_kernel(name: str) -> "Kernel":
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; registered kernels: {sorted(KERNELS)}")
    return KERNELS[name]


class Kernel:
    """Base class. ``make_plan`` precomputes what depends only on the layout; ``__call__`` runs the plan."""

    name = "base"
    runs_on_cpu = True
    """Whether the kernel runs on CPU at all (False: a GPU-only kernel; the CPU parity tests leave it out and the CUDA
    tests compare it with ``dense``)."""
    trains_on_cpu = True
    """Whether the kernel has a backward on CPU (tests and ``auto`` read it)."""

    def make_plan(
        self,
        layout_HMM: torch.Tensor | None,
        block: int,
        seq_len: int,
        device: torch.device,
        token_mask: torch.Tensor | None = None,
        family: str | None = None,
    ) -> Any:
        """``family``: the layout family (``SparsityConfig.family()``, None for none or a token-mask layout); only
        ``auto`` reads it (its measured table is keyed by it)."""
        raise NotImplementedError

    def __call__(
        self,
        q_BHND: torch.Tensor,
        k_BHND: torch.Tensor,
        v_BHND: torch.Tensor,
        *,
        plan: Any,
        key_padding_mask_BN: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
        score_bias: ScoreBias | None = None,
        dropout_p: float = 0.0,
        scale: float | None = None,
        training: bool = False,
        doc_ids_BN: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return plan.run(
            q_BHND,
            k_BHND,
            v_BHND,
            Call(
                key_padding_mask_BN,
                token_mask,
                score_bias,
                dropout_p if training else 0.0,
                scale,
                dropout_p,
                doc_ids_BN,
                cu_seqlens,
            ),
        )


def same_document(doc_q: torch.Tensor, doc_k: torch.Tensor) -> torch.Tensor:
    """bool ``[..., Q, K]``: query and key lie in the same document (``doc_q`` ``[..., Q]``, ``doc_k`` ``[..., K]``)."""
    return doc_q.unsqueeze(-1) == doc_k.unsqueeze(-2)
