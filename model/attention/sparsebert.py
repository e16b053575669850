"""SparseBERT's Differentiable Attention Mask (DAM, Algorithm 1) with export to a fixed mask, registered as the
token pattern ``dam``. The fixed patterns (paper Table 3), no-diagonal and masks from files are registered in
:mod:`model.attention.token_patterns` (re-exported here).

DAM gates the attention *probabilities* (``(softmax(QK^T) * M) V``, paper Eq. 4/5, no renormalisation), which is
not an additive score bias; the search therefore runs the O(n^2) :func:`gated_attention` (a search over all n^2
positions is dense anyway). Its exported binary mask then runs on every kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.strict_config import from_dict
from model.attention.token_patterns import (  # noqa: F401  (re-exported: the SparseBERT API in one place)
    MASK_FILE_FORMAT,
    TABLE3,
    TOKEN_MASKS,
    TokenMaskConfig,
    _offsets,
    block_layout_from_mask,
    build_layer_mask,
    build_token_mask,
    load_mask,
    make_pattern,
    pattern_names,
    register_pattern,
    save_masks,
    sparsity,
    sparsity_table,
)


# -- DAM ---------------------------------------------------------------------------------------------------------------
@dataclass
class DAMConfig:
    """Differentiable Attention Mask search (SparseBERT Algorithm 1 / Section 3.4's two-stage variant)."""

    structured: bool = False
    """False: DAM_u, one alpha per (head, i, j), symmetric. True: DAM_s, one alpha per (head, |i-j|) with shared
    Gumbel noise along each diagonal; first and last row and column always on."""
    mode: str = "gumbel"
    """gumbel: M = sigmoid((alpha + G1 - G2) / tau) (one-stage DAM). soft: P = sigmoid(alpha) (Eq. 3; the two-stage
    variant: train P, then export with prune_fraction)."""
    lam: float = 1e-3
    """lambda of the loss term lambda * ||M||_1 (sum over heads, positions and searched layers; Eq. 5)."""
    reduction: str = "sum"
    """sum: lambda * ||M||_1 exactly as Eq. 5 (its scale grows with n^2, heads and searched layers). mean: divided
    by the number of mask entries, so one lambda means the same at any n / heads / layers."""
    tau: float = 0.5
    """Gumbel-sigmoid temperature (not given in the paper: our choice)."""
    init: float = 3.0
    """Initial alpha (not given in the paper): P(M > 0.5) = sigmoid(init) = 95% of positions on at the start."""
    share_layers: bool = True
    """One alpha set for all layers (paper Section 3.1.1: "the parameters of P are shared among blocks")."""
    prune_fraction: float | None = None
    """Export: None = keep M > 0.5 (alpha > 0); x = drop the x smallest fraction of each head's entries."""

    def __post_init__(self) -> None:
        if self.mode not in ("gumbel", "soft"):
            raise ValueError(f"attention.token_mask.dam.mode must be 'gumbel' or 'soft', got {self.mode!r}")
        if self.reduction not in ("sum", "mean"):
            raise ValueError(f"attention.token_mask.dam.reduction must be 'sum' or 'mean', got {self.reduction!r}")
        if self.lam < 0 or self.tau <= 0:
            raise ValueError(f"attention.token_mask.dam: lam must be >= 0 and tau > 0 (got {self.lam}, {self.tau})")
        if self.prune_fraction is not None and not 0.0 <= self.prune_fraction < 1.0:
            raise ValueError(f"attention.token_mask.dam.prune_fraction must be in [0, 1), got {self.prune_fraction}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DAMConfig":
        return from_dict(cls, d, "attention.token_mask.dam")


@dataclass
class DamParams:
    dam: dict[str, Any] = field(default_factory=dict)
    """Settings of :class:`DAMConfig` (the search)."""

    def __post_init__(self) -> None:
        DAMConfig.from_dict(self.dam)


@register_pattern("dam", DamParams, kind="learned")
def dam(p: DamParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> None:
    """SparseBERT's DAM: the mask is learned (no fixed mask); it cannot be combined with a block layout."""
    return None


def _logistic_noise(shape: torch.Size, device: torch.device) -> torch.Tensor:
    """G1 - G2 for two independent Gumbel(0, 1) draws, in fp32 whatever the model's dtype: in fp16 the clamp
    bounds round to 0 and 1 (infinite noise, NaN when both draws hit a bound)."""
    u1, u2 = (torch.rand(shape, device=device, dtype=torch.float32).clamp_(1e-10, 1 - 1e-7) for _ in range(2))
    return -torch.log(-torch.log(u1)) + torch.log(-torch.log(u2))


class DAMMask(nn.Module):
    """Learnable attention mask of ``num_sets`` layers (1 when shared) x heads at length n."""

    #: the mask logits: weight decay would pull them to 0 (a half-open mask) against the L1 term's pull
    no_weight_decay = ("alpha",)

    def __init__(self, cfg: DAMConfig, num_sets: int, num_heads: int, n: int):
        super().__init__()
        self.cfg = cfg
        self.n = n
        shape = (num_sets, num_heads, n) if cfg.structured else (num_sets, num_heads, n, n)
        self.alpha = nn.Parameter(torch.full(shape, float(cfg.init)))
        self._last: torch.Tensor | None = None

    def _full(self, x: torch.Tensor) -> torch.Tensor:
        """Per-offset or triangle parameters -> symmetric [S, H, n, n]."""
        if self.cfg.structured:
            return x[..., _offsets(self.n).abs().to(x.device)]
        up = torch.triu(x)
        return up + torch.triu(x, 1).transpose(-1, -2)

    def _force(self, m: torch.Tensor) -> torch.Tensor:
        if not self.cfg.structured:
            return m
        edge = torch.zeros(self.n, self.n, dtype=torch.bool, device=m.device)
        edge[[0, -1], :] = True
        edge[:, [0, -1]] = True
        return torch.where(edge, torch.ones_like(m), m)

    def forward(self) -> torch.Tensor:
        """Mask values [S, H, n, n] in [0, 1] for this step (sampled in training, noise-free in eval), in fp32: the
        noise and the L1 term need it in fp16/bf16 runs (attention casts the mask to its own dtype)."""
        a = self.alpha.float()
        if self.cfg.mode == "soft":
            m = torch.sigmoid(a)
        elif self.training:
            m = torch.sigmoid((a + _logistic_noise(a.shape, a.device)) / self.cfg.tau)
        else:
            m = torch.sigmoid(a / self.cfg.tau)
        m = self._force(self._full(m))
        self._last = m if self.training else None
        return m

    def auxiliary_loss(self) -> torch.Tensor | None:
        """lambda * ||M||_1 of the mask the last training forward used (the same sample the loss saw), in fp32 (in
        fp16 the sum overflows: 12 heads x 128^2 entries already exceed 65504)."""
        if self.cfg.lam == 0:
            return None
        m = (
            self._last
            if self._last is not None
            else self._force(self._full(torch.sigmoid(self.alpha.float() / self.cfg.tau)))
        )
        return self.cfg.lam * (m.sum() if self.cfg.reduction == "sum" else m.mean())

    @torch.no_grad()
    def binarize(self) -> torch.Tensor:
        """bool [S, H, n, n]: alpha > 0 (M > 0.5 at zero noise), or the prune_fraction smallest entries dropped."""
        score = self._full(self.alpha.detach().float())
        if self.cfg.prune_fraction is None:
            keep = score > 0
        else:
            flat = score.flatten(2)
            k = int(round(self.cfg.prune_fraction * flat.shape[-1]))
            keep = torch.ones_like(flat, dtype=torch.bool)
            if k:
                idx = flat.argsort(dim=-1, stable=True)[..., :k]
                keep.scatter_(-1, idx, False)
            keep = keep.view_as(score)
        return self._force(keep.float()).bool()

    def stats(self) -> dict[str, float]:
        keep = self.binarize()
        with torch.no_grad():
            cur = self._full(
                torch.sigmoid(self.alpha.detach().float() / (1.0 if self.cfg.mode == "soft" else self.cfg.tau))
            )
        out = {"dam/sparsity": sparsity(keep), "dam/mean_mask": float(cur.mean())}
        for h in range(keep.shape[1]):
            out[f"dam/sparsity_head{h}"] = sparsity(keep[:, h])
        return out


def gated_attention(
    q_BHND: torch.Tensor,
    k_BHND: torch.Tensor,
    v_BHND: torch.Tensor,
    gate_HNN: torch.Tensor,
    key_padding_mask_BN: torch.Tensor | None,
    dropout_p: float,
    scale: float | None,
    score_bias=None,
) -> torch.Tensor:
    """(softmax(q k^T * scale + bias, masked) * gate) v: SparseBERT Eq. 4/5 (probabilities gated, not renormalised)."""
    N = q_BHND.shape[2]
    s = scale if scale is not None else q_BHND.shape[-1] ** -0.5
    # q scaled before the matmul, as SDPA does: q.k of size-64 fp16 heads passes 65504 long before q.k * s would
    scores = torch.matmul(q_BHND * s, k_BHND.transpose(-1, -2))
    if score_bias is not None:
        scores = scores + score_bias.dense(N)
    if key_padding_mask_BN is not None:
        scores = scores.masked_fill(~key_padding_mask_BN[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), -1).nan_to_num(0.0).to(q_BHND.dtype)
    probs = probs * gate_HNN[:, :N, :N].to(probs.dtype)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    return torch.matmul(probs, v_BHND)
