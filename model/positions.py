"""Positional information: BERT's learned absolute input embeddings, or DIET's decoupled positional attention
(position never enters the value path), plus per-head segment attention.

DIET-ABS, DIET-REL and per-head segment biases are :class:`~model.attention.bias.ScoreBias` objects built per layer
and per forward from their parameters; each kernel asks them for exactly the scores it computes (``dense`` the full
``[1, H, n, n]``, ``block_gather`` its gathered tiles, ``flex`` a ``score_mod``), so no N x N bias is materialised
by the block-sparse kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.strict_config import from_dict
from model.attention.bias import ScoreBias, combine_biases

POSITION_TYPES = ("absolute", "diet_abs", "diet_rel", "rotary")
SHARING = ("none", "layer", "head")
SEGMENT_TYPES = ("input", "per_head")


class AbsolutePositionEmbedding(nn.Embedding):
    """Learned absolute positions 0..max-1, added at the input (BERT)."""

    def forward_positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        if seq_len > self.num_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings {self.num_embeddings}; "
                "shorten the inputs or raise max_position_embeddings in the model config"
            )
        return self(torch.arange(seq_len, device=device))


@dataclass
class PositionConfig:
    """How positions enter the model (JSON: ``position``)."""

    type: str = "absolute"
    """absolute: BERT's input embeddings. diet_abs: logits += (p_i U_Q^h)(p_j U_K^h)^T / sqrt(rank) with learned
    absolute p (no input positions). diet_rel: logits += r_h[clip(j - i, -K, K)] (no input positions). rotary: q and k
    rotated by their position (RoPE, as ModernBERT; :mod:`model.rotary`), no input positions."""
    rank: int = 128
    """diet_abs: d_p, width of p and of the per-head positional query/key (paper: 64..512, best 128)."""
    sharing: str = "none"
    """none: parameters per layer and head. layer: one set for all layers. head: one bias for all heads of a layer."""
    max_distance: int = 128
    """diet_rel: K, relative distances are clipped to [-K, K] (not given in the paper: our choice)."""
    rope_theta: float = 160000.0
    """rotary: base of the global layers (every layer unless attention.global_every makes some local); ModernBERT:
    160000."""
    rope_theta_local: float = 10000.0
    """rotary: base of the local (sliding-window) layers of attention.global_every; ModernBERT: 10000."""

    def __post_init__(self) -> None:
        if self.type not in POSITION_TYPES:
            raise ValueError(f"position.type must be one of {list(POSITION_TYPES)}, got {self.type!r}")
        if self.sharing not in SHARING:
            raise ValueError(f"position.sharing must be one of {list(SHARING)}, got {self.sharing!r}")
        if self.rank < 1 or self.max_distance < 1:
            raise ValueError(
                f"position.rank and position.max_distance must be >= 1 (got {self.rank}, {self.max_distance})"
            )
        if self.type in ("absolute", "rotary") and self.sharing != "none":
            raise ValueError(f"position.sharing applies to diet_abs / diet_rel only; use 'none' with {self.type!r}")
        if not (self.rope_theta > 0 and self.rope_theta_local > 0):
            raise ValueError(
                f"position.rope_theta and position.rope_theta_local must be > 0 (got {self.rope_theta}, "
                f"{self.rope_theta_local})"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PositionConfig":
        return from_dict(cls, d, "position")


# -- score biases ----------------------------------------------------------------------------------------------------
class DietAbsBias(ScoreBias):
    """(p_i U_Q^h)(p_j U_K^h)^T / sqrt(d_p) from projected positions pq/pk ``[H|1, n, d_p]``."""

    def __init__(self, pq_HND: torch.Tensor, pk_HND: torch.Tensor):
        self.pq, self.pk = pq_HND, pk_HND
        self.scale = pq_HND.shape[-1] ** -0.5

    def dense(self, n: int) -> torch.Tensor:
        return (torch.matmul(self.pq[:, :n], self.pk[:, :n].transpose(-1, -2)) * self.scale).unsqueeze(0)

    def gather(self, head_G, q_index_GQ, k_index_GK):
        h = head_G if self.pq.shape[0] > 1 else torch.zeros_like(head_G)
        q = self.pq[h[:, None], q_index_GQ]  # [G, Q, d]
        k = self.pk[h[:, None], k_index_GK]  # [G, K, d]
        return (torch.bmm(q, k.transpose(1, 2)) * self.scale).unsqueeze(0)

    def split_low_rank(self):
        """The whole bias is ``(pq_i / sqrt(d_p)) . pk_j``: flex folds it into q and k, no ``[H, n, n]`` table."""
        return self.pq * self.scale, self.pk, None

    def score_mod(self) -> Callable:
        table = self.dense(self.pq.shape[1])[0]  # [H|1, n, n]: only if a caller does not use split_low_rank
        hsel = table.shape[0] > 1

        def mod(score, b, h, q, k):
            return score + table[h if hsel else 0, q, k].to(score.dtype)

        return mod

    def padded(self, n_new: int) -> "DietAbsBias":
        p = n_new - self.pq.shape[1]
        return self if p <= 0 else DietAbsBias(F.pad(self.pq, (0, 0, 0, p)), F.pad(self.pk, (0, 0, 0, p)))


class DietRelBias(ScoreBias):
    """r_h[clip(j - i, -K, K)] from a table ``[H|1, 2K+1]``; valid at any length."""

    def __init__(self, table_HR: torch.Tensor):
        self.table = table_HR
        self.K = (table_HR.shape[-1] - 1) // 2

    def _idx(self, q, k):
        return (k - q).clamp(-self.K, self.K) + self.K

    def dense(self, n: int) -> torch.Tensor:
        i = torch.arange(n, device=self.table.device)
        return self.table[:, self._idx(i[:, None], i[None, :])].unsqueeze(0)

    def gather(self, head_G, q_index_GQ, k_index_GK):
        h = head_G if self.table.shape[0] > 1 else torch.zeros_like(head_G)
        return self.table[h[:, None, None], self._idx(q_index_GQ[:, :, None], k_index_GK[:, None, :])].unsqueeze(0)

    def score_mod(self) -> Callable:
        t, K, hsel = self.table, self.K, self.table.shape[0] > 1

        def mod(score, b, h, q, k):
            return score + t[h if hsel else 0, (k - q).clamp(-K, K) + K].to(score.dtype)

        return mod

    def padded(self, n_new: int) -> "DietRelBias":
        return self


class SegmentBias(ScoreBias):
    """s_h[seg_i, seg_j] (DIET's per-head segment attention) from a table ``[H, T, T]`` and segment ids ``[B, n]``."""

    def __init__(self, table_HTT: torch.Tensor, seg_BN: torch.Tensor):
        self.table, self.seg = table_HTT, seg_BN

    def dense(self, n: int) -> torch.Tensor:
        s = self.seg[:, :n]
        return self.table[:, s[:, :, None], s[:, None, :]].permute(1, 0, 2, 3)  # [B, H, n, n]

    def gather(self, head_G, q_index_GQ, k_index_GK):
        sq = self.seg[:, q_index_GQ]  # [B, G, Q]
        sk = self.seg[:, k_index_GK]  # [B, G, K]
        return self.table[head_G[None, :, None, None], sq[..., :, None], sk[..., None, :]]

    def score_mod(self) -> Callable:
        t, s = self.table, self.seg

        def mod(score, b, h, q, k):
            return score + t[h, s[b, q], s[b, k]].to(score.dtype)

        return mod

    def padded(self, n_new: int) -> "SegmentBias":
        p = n_new - self.seg.shape[1]
        return self if p <= 0 else SegmentBias(self.table, F.pad(self.seg, (0, p)))


# -- parameters ------------------------------------------------------------------------------------------------------
class PositionalAttention(nn.Module):
    """DIET-ABS / DIET-REL parameters of all layers (one set when layer-shared) and per-head segment tables.

    ``biases(layer, n, token_type_ids)`` returns the layer's combined :class:`ScoreBias` (or None). Projected
    DIET-ABS positions are computed once per forward and length and reused by every layer that shares them.
    """

    #: position and segment tables (not the U_Q/U_K projections): an optimizer should not weight-decay them
    no_weight_decay = ("abs_pos", "rel", "segment")

    def __init__(
        self,
        pos: PositionConfig,
        segment: str,
        num_layers: int,
        num_heads: int,
        max_positions: int,
        type_vocab_size: int,
        init_std: float = 0.02,
    ):
        super().__init__()
        self.cfg = pos
        self.num_layers = num_layers
        sets = 1 if pos.sharing == "layer" else num_layers
        heads = 1 if pos.sharing == "head" else num_heads
        self.abs_pos = self.abs_uq = self.abs_uk = self.rel = self.segment = None
        if pos.type == "diet_abs":
            d = pos.rank
            self.abs_pos = nn.Parameter(torch.randn(sets, max_positions, d) * init_std)
            self.abs_uq = nn.Parameter(torch.randn(sets, heads, d, d) * d**-0.5)
            self.abs_uk = nn.Parameter(torch.randn(sets, heads, d, d) * d**-0.5)
        elif pos.type == "diet_rel":
            self.rel = nn.Parameter(torch.zeros(sets, heads, 2 * pos.max_distance + 1))
        if segment == "per_head":
            if type_vocab_size < 1:
                raise ValueError("segment 'per_head' needs type_vocab_size >= 1")
            self.segment = nn.Parameter(torch.zeros(num_layers, num_heads, type_vocab_size, type_vocab_size))
        self.max_positions = max_positions

    def forward(self, n: int, token_type_ids: torch.Tensor | None, batch: int) -> tuple[torch.Tensor | None, ...]:
        """The tables every layer's bias reads for a length-n batch, as a tuple of tensors ``(pq, pk, rel, segment,
        segment_ids)`` (None where absent); :meth:`biases` wraps them into one :class:`ScoreBias` per layer.

        The tables are new tensors, never views of the parameters, and they leave this module as its output: a
        wrapper that manages parameters per module (DeepSpeed ZeRO-3 frees them after a module's forward and
        gathers them again for its backward, hooked on the tensors the module returns) sees every tensor that
        depends on them. Bias objects holding parameter views broke exactly there (an empty tensor in backward)."""
        if n > self.max_positions:
            raise ValueError(
                f"sequence length {n} exceeds max_position_embeddings {self.max_positions}; shorten "
                "the inputs or raise max_position_embeddings in the model config"
            )
        pq = pk = rel = segment = seg = None
        if self.abs_pos is not None:
            p = self.abs_pos[:, :n]  # [S, n, d]
            pq = torch.einsum("snd,shde->shne", p, self.abs_uq)
            pk = torch.einsum("snd,shde->shne", p, self.abs_uk)
        elif self.rel is not None:
            rel = self.rel.clone()  # [S, H|1, 2K+1]
        if self.segment is not None:
            segment = self.segment.clone()  # [L, H, T, T]
            seg = (
                token_type_ids
                if token_type_ids is not None
                else torch.zeros(batch, n, dtype=torch.long, device=self.segment.device)
            )
        return pq, pk, rel, segment, seg

    def biases(self, tables: tuple[torch.Tensor | None, ...]) -> list[ScoreBias | None]:
        """One combined bias per layer from :meth:`forward`'s tables."""
        pq, pk, rel, segment, seg = tables
        per_set: list[ScoreBias] = []
        if pq is not None:
            per_set = [DietAbsBias(pq[s], pk[s]) for s in range(pq.shape[0])]
        elif rel is not None:
            per_set = [DietRelBias(rel[s]) for s in range(rel.shape[0])]
        out = []
        for i in range(self.num_layers):
            pos = per_set[0 if len(per_set) == 1 else i] if per_set else None
            out.append(combine_biases(pos, None if segment is None else SegmentBias(segment[i], seg)))
        return out
