"""Additive attention-score biases that every kernel can apply inside its own tiling.

A kernel never materialises more of a bias than it computes scores for: ``dense`` asks for the full
``[B|1, H|1, N, N]`` tensor, ``block_gather`` for the tiles it gathered, ``flex`` for a ``score_mod``. Positional
schemes (DIET-ABS/REL, per-head segment biases in model/positions.py) subclass :class:`ScoreBias` and compute each form
directly from their parameters instead of from a dense tensor.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


class ScoreBias:
    """Interface: added to ``q.k * scale`` before softmax (after scaling, like DeepSpeed's ``rpe``)."""

    def dense(self, n: int) -> torch.Tensor:
        """Bias broadcastable to ``[B, H, n, n]``."""
        raise NotImplementedError

    def gather(self, head_G: torch.Tensor, q_index_GQ: torch.Tensor, k_index_GK: torch.Tensor) -> torch.Tensor:
        """Bias for G gathered tiles: tile g is head ``head_G[g]``, query tokens ``q_index_GQ[g]``, key tokens
        ``k_index_GK[g]``; returns ``[B|1, G, Q, K]``."""
        raise NotImplementedError

    def score_mod(self) -> Callable:
        """FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)``."""
        raise NotImplementedError

    def padded(self, n_new: int) -> "ScoreBias":
        """The same bias for a sequence padded at the end to ``n_new`` (padded keys are masked anyway)."""
        raise NotImplementedError

    def split_low_rank(self) -> tuple[torch.Tensor | None, torch.Tensor | None, "ScoreBias | None"]:
        """``(a_HNR, b_HNR, rest)``: the part of the bias that is a product ``a_i . b_j`` (per head, rank R), for
        FlexAttention to fold into q and k (a score_mod can only index a table: an ``[H, N, N]`` one), and the
        rest as a bias (None when nothing is left). Default: no low-rank part."""
        return None, None, self


class DenseScoreBias(ScoreBias):
    """A bias given as a tensor broadcastable to ``[B, H, N, N]`` (DeepSpeed's ``rpe``, additive masks)."""

    def __init__(self, bias: torch.Tensor):
        while bias.dim() < 4:
            bias = bias.unsqueeze(0)
        if bias.dim() != 4 or bias.shape[-2] not in (1, bias.shape[-1]):
            raise ValueError(f"score bias must be broadcastable to [B, H, N, N]; got shape {tuple(bias.shape)}")
        self.bias = bias

    def dense(self, n: int) -> torch.Tensor:
        if self.bias.shape[-1] != n:
            raise ValueError(f"score bias covers {self.bias.shape[-1]} tokens, the sequence has {n}")
        return self.bias

    def gather(self, head_G: torch.Tensor, q_index_GQ: torch.Tensor, k_index_GK: torch.Tensor) -> torch.Tensor:
        b = self.bias
        h = head_G[:, None, None] if b.shape[1] > 1 else torch.zeros_like(head_G[:, None, None])
        qi = q_index_GQ[:, :, None] if b.shape[2] > 1 else torch.zeros_like(q_index_GQ[:, :1, None])
        return b[:, h, qi, k_index_GK[:, None, :]]

    def score_mod(self) -> Callable:
        b = self.bias
        bsel, hsel, qsel = b.shape[0] > 1, b.shape[1] > 1, b.shape[2] > 1

        def mod(score, bi, hi, qi, ki):
            return score + b[bi if bsel else 0, hi if hsel else 0, qi if qsel else 0, ki].to(score.dtype)

        return mod

    def padded(self, n_new: int) -> "DenseScoreBias":
        p = n_new - self.bias.shape[-1]
        return self if p == 0 else DenseScoreBias(F.pad(self.bias, (0, p, 0, p if self.bias.shape[2] > 1 else 0)))


class SumScoreBias(ScoreBias):
    """Several biases added together (e.g. an additive key-padding mask plus a relative-position term)."""

    def __init__(self, parts: list[ScoreBias]):
        self.parts = list(parts)

    def dense(self, n: int) -> torch.Tensor:
        out = self.parts[0].dense(n)
        for p in self.parts[1:]:
            out = out + p.dense(n)
        return out

    def gather(self, head_G: torch.Tensor, q_index_GQ: torch.Tensor, k_index_GK: torch.Tensor) -> torch.Tensor:
        out = self.parts[0].gather(head_G, q_index_GQ, k_index_GK)
        for p in self.parts[1:]:
            out = out + p.gather(head_G, q_index_GQ, k_index_GK)
        return out

    def score_mod(self) -> Callable:
        mods = [p.score_mod() for p in self.parts]

        def mod(score, b, h, q, k):
            for m in mods:
                score = m(score, b, h, q, k)
            return score

        return mod

    def padded(self, n_new: int) -> "SumScoreBias":
        return SumScoreBias([p.padded(n_new) for p in self.parts])

    def split_low_rank(self) -> tuple[torch.Tensor | None, torch.Tensor | None, "ScoreBias | None"]:
        a = b = None
        rest: list[ScoreBias] = []
        for p in self.parts:
            pa, pb, pr = p.split_low_rank()
            if pa is not None and a is None:
                a, b = pa, pb
            else:
                rest.append(p if pa is not None else pr)
        return a, b, combine_biases(*rest)


def combine_biases(*biases: ScoreBias | None) -> ScoreBias | None:
    parts = [b for b in biases if b is not None]
    return None if not parts else parts[0] if len(parts) == 1 else SumScoreBias(parts)
