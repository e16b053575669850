"""SparseBERT token-level attention masks: fixed patterns (paper Table 3), no-diagonal, masks from file, and the
Differentiable Attention Mask (DAM, Algorithm 1) with export to a fixed mask.

A fixed mask is a bool ``[H, n, n]`` tensor (True = query i may attend key j) made once at ``seq_len`` and cropped
(top-left) for shorter sequences, like the block layouts. The attention module ANDs it with the block layout and
derives the block layout from it (a block is on iff any of its elements is allowed), so ``block_gather``/``flex``
skip fully masked blocks while partial blocks carry the element mask.

DAM gates the attention *probabilities* (``(softmax(QK^T) * M) V``, paper Eq. 4/5, no renormalisation), which is
not an additive score bias; the search therefore runs the O(n^2) :func:`gated_attention` (a search over all n^2
positions is dense anyway). Its exported binary mask then runs on every kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

PATTERNS = ("no_diagonal", "strided", "fixed", "longformer", "logsparse", "bigbird", "star", "dam", "file")
MASK_FILE_FORMAT = "sparsebert-token-masks/1"


@dataclass
class TokenMaskConfig:
    """One token-level mask family and its settings (JSON: ``attention.token_mask``)."""

    pattern: str
    """no_diagonal | strided | fixed | longformer | logsparse | bigbird | star | dam | file."""
    seq_len: int | None = None
    """Length the mask is built for (None = max_position_embeddings); shorter inputs use the top-left crop. Set it
    to the training length: Strided/Fixed/Star depend on n (paper: n = 128)."""
    block: int = 16
    """Block size of the block layout derived from the mask when ``attention.sparsity`` is null."""
    drop_diagonal: bool = False
    """Also set M_ii = 0 (combine any pattern with the no-diagonal finding)."""
    stride: int = 16
    """strided: local band |i-j| < stride plus every stride-th offset ((i-j) % stride == 0)."""
    block_len: int = 32
    """fixed: tokens attend within their block of block_len tokens ..."""
    num_summary: int = 1
    """fixed: ... and to the last num_summary tokens of every block (Child et al.'s c)."""
    window: int | None = None
    """longformer / bigbird: band |i-j| <= window (paper: Longformer 2, BigBird 1; None = those)."""
    num_global: int = 2
    """longformer / bigbird: global tokens (attend everywhere and are attended by all); paper: 2."""
    global_positions: list[int] | None = None
    """Global token positions; None = longformer: random (paper: "randomly selected"), bigbird: first and last."""
    num_random: int = 2
    """bigbird: random keys per query row (drawn per head)."""
    relay: int = 0
    """star: the relay token (attends and is attended by all); the others see a ring |i-j| <= 1 (wrapping)."""
    seed: int = 0
    """Seed of every random choice (same mask on every rank and every rebuild)."""
    path: str | None = None
    """file: a mask file written by :func:`save_masks` (e.g. DAM's export); layer i uses its ``layer{i}`` mask."""
    dam: dict[str, Any] = field(default_factory=dict)
    """dam: settings of :class:`DAMConfig`."""

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise ValueError(f"attention.token_mask.pattern {self.pattern!r} unknown; choose one of {list(PATTERNS)}")
        for name in ("block", "stride", "block_len", "num_summary"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"attention.token_mask.{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len is not None and self.seq_len < 2:
            raise ValueError(f"attention.token_mask.seq_len must be >= 2 or null, got {self.seq_len}")
        if self.num_summary > self.block_len:
            raise ValueError("attention.token_mask.num_summary must be <= block_len")
        if self.window is not None and self.window < 0:
            raise ValueError(f"attention.token_mask.window must be >= 0, got {self.window}")
        if self.num_global < 0 or self.num_random < 0:
            raise ValueError("attention.token_mask.num_global and num_random must be >= 0")
        if self.pattern == "file" and not self.path:
            raise ValueError("attention.token_mask.pattern 'file' needs 'path' (a mask file from DAM export)")
        if self.pattern == "dam":
            DAMConfig.from_dict(self.dam)
        elif self.dam:
            raise ValueError("attention.token_mask.dam is only valid with pattern 'dam'")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "attention.token_mask") -> "TokenMaskConfig":
        if not isinstance(d, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in {where}; allowed: {sorted(f.name for f in fields(cls))}")
        if "pattern" not in d:
            raise ValueError(f"{where} needs a 'pattern': one of {list(PATTERNS)}")
        return cls(**d)


# -- fixed patterns (all bidirectional, as BERT is) ------------------------------------------------------------------
def _offsets(n: int) -> torch.Tensor:
    i = torch.arange(n)
    return i[None, :] - i[:, None]  # [i, j] = j - i


def _globals(m: torch.Tensor, positions: list[int]) -> torch.Tensor:
    n = m.shape[-1]
    bad = [p for p in positions if not -n <= p < n]
    if bad:
        raise ValueError(f"attention.token_mask.global_positions {bad} out of range for seq_len {n}")
    for p in positions:
        m[..., p, :] = True
        m[..., :, p] = True
    return m


def make_pattern(cfg: TokenMaskConfig, num_heads: int, n: int) -> torch.Tensor:
    """Bool ``[H, n, n]`` mask of a fixed pattern (not dam/file)."""
    off = _offsets(n)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    p = cfg.pattern
    if p == "no_diagonal":
        m = off != 0
    elif p == "strided":  # Child et al. 2019, both directions
        m = (off.abs() < cfg.stride) | (off % cfg.stride == 0)
    elif p == "fixed":  # Child et al. 2019: own block + summary columns of every block
        i = torch.arange(n)
        m = (i[:, None] // cfg.block_len == i[None, :] // cfg.block_len) | (
            (i[None, :] % cfg.block_len >= cfg.block_len - cfg.num_summary).expand(n, n))
    elif p == "longformer":
        w = 2 if cfg.window is None else cfg.window
        pos = cfg.global_positions
        if pos is None:
            pos = torch.randperm(n, generator=gen)[: cfg.num_global].tolist()
        m = _globals(off.abs() <= w, list(pos))
    elif p == "logsparse":  # Li et al. 2019: self and offsets +-2^k, both directions
        a = off.abs()
        m = (a == 0) | ((a & (a - 1)) == 0)
    elif p == "bigbird":  # Zaheer et al. 2020 at token level (the paper drops the block structure)
        w = 1 if cfg.window is None else cfg.window
        pos = cfg.global_positions
        if pos is None:
            pos = [0, n - 1][: cfg.num_global] + list(range(1, max(0, cfg.num_global - 2) + 1))
        base = off.abs() <= w
        heads = []
        for _ in range(num_heads):
            r = torch.rand(n, n, generator=gen).argsort(-1)[:, : cfg.num_random]
            mh = base.clone()
            mh.scatter_(1, r, True)
            heads.append(_globals(mh, list(pos)))
        m = torch.stack(heads)
    elif p == "star":  # Guo et al. 2019: ring of neighbours (wrapping) + one relay token
        a = off.abs()
        m = _globals((a <= 1) | (a == n - 1), [cfg.relay])
    else:
        raise ValueError(f"make_pattern: pattern {p!r} is not a fixed pattern")
    m = m.expand(num_heads, n, n).clone() if m.dim() == 2 else m
    if cfg.drop_diagonal:
        m &= ~torch.eye(n, dtype=torch.bool)
    return m


def block_layout_from_mask(mask_HNN: torch.Tensor, block: int) -> torch.Tensor:
    """int64 ``[H, M, M]``: a block is on iff any of its elements is allowed (mask padded with False to a multiple)."""
    H, n, _ = mask_HNN.shape
    nb = math.ceil(n / block)
    p = nb * block - n
    m = F.pad(mask_HNN, (0, p, 0, p), value=False) if p else mask_HNN
    return m.view(H, nb, block, nb, block).any(4).any(2).to(torch.int64)


def sparsity(mask: torch.Tensor) -> float:
    """The paper's rho = 1 - |M| / n^2 (over all heads given)."""
    return 1.0 - float(mask.float().mean())


TABLE3 = {"strided": 70.4, "fixed": 72.7, "longformer": 88.7, "logsparse": 89.8, "bigbird": 93.2, "star": 96.1}
"""SparseBERT Table 3 sparsity (%) at n = 128."""


def sparsity_table(n: int = 128, num_heads: int = 12) -> dict[str, dict[str, float]]:
    """Our sparsity for each Table 3 pattern (default settings) next to the paper's."""
    out = {}
    for name in ("no_diagonal", *TABLE3):
        m = make_pattern(TokenMaskConfig(pattern=name), num_heads, n)
        out[name] = {"ours": round(100 * sparsity(m), 2), "paper": TABLE3.get(name, round(100 / n, 2))}
    return out


# -- mask files ------------------------------------------------------------------------------------------------------
def save_masks(path: str, masks: dict[str, torch.Tensor]) -> None:
    """Write ``{"layer{i}": bool [H, n, n]}`` (e.g. :meth:`BertForPreTraining.export_learned_masks`) for
    ``{"pattern": "file", "path": ...}``; written to a temporary name first, so a crash leaves no half file."""
    import os

    shapes = {tuple(m.shape) for m in masks.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 3:
        raise ValueError(f"masks must all be bool [H, n, n] of one shape, got shapes {sorted(shapes)}")
    H, n, _ = next(iter(shapes))
    tmp = f"{path}.tmp"
    torch.save({"format": MASK_FILE_FORMAT, "num_heads": H, "seq_len": n,
                "masks": {k: v.detach().cpu().bool() for k, v in masks.items()}}, tmp)
    os.replace(tmp, path)


def load_mask(path: str, layer: int, num_heads: int) -> torch.Tensor:
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"attention.token_mask.path: mask file {path} not found") from None
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ValueError(f"attention.token_mask.path: {path} is not a mask file written by save_masks ({e})") from e
    if not isinstance(d, dict) or d.get("format") != MASK_FILE_FORMAT:
        raise ValueError(f"{path}: not a {MASK_FILE_FORMAT} file (write it with model.attention.sparsebert.save_masks)")
    key = f"layer{layer}"
    if key not in d["masks"]:
        raise ValueError(f"{path}: has masks for {sorted(d['masks'])}, the model needs {key!r}")
    m = d["masks"][key].bool()
    if m.shape[0] != num_heads:
        raise ValueError(f"{path}: {key} has {m.shape[0]} heads, the model has {num_heads}")
    return m


def build_token_mask(cfg: TokenMaskConfig | None, num_heads: int, n: int, layer: int) -> torch.Tensor | None:
    """The fixed bool [H, n, n] mask of a layer (None for no mask or for DAM, whose mask is learned)."""
    if cfg is None or cfg.pattern == "dam":
        return None
    if cfg.pattern == "file":
        m = load_mask(cfg.path, layer, num_heads)
        if cfg.drop_diagonal:
            m = m & ~torch.eye(m.shape[-1], dtype=torch.bool)
        return m
    return make_pattern(cfg, num_heads, n)


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
        if not isinstance(d, dict):
            raise ValueError("attention.token_mask.dam must be a JSON object")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in attention.token_mask.dam; allowed: "
                             f"{sorted(f.name for f in fields(cls))}")
        return cls(**d)


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
        m = self._last if self._last is not None else self._force(self._full(torch.sigmoid(self.alpha.float()
                                                                                          / self.cfg.tau)))
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
            cur = self._full(torch.sigmoid(self.alpha.detach().float() / (1.0 if self.cfg.mode == "soft"
                                                                           else self.cfg.tau)))
        out = {"dam/sparsity": sparsity(keep), "dam/mean_mask": float(cur.mean())}
        for h in range(keep.shape[1]):
            out[f"dam/sparsity_head{h}"] = sparsity(keep[:, h])
        return out


def gated_attention(q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, gate_HNN: torch.Tensor,
                    key_padding_mask_BN: torch.Tensor | None, dropout_p: float, scale: float | None,
                    score_bias=None) -> torch.Tensor:
    """(softmax(q k^T * scale + bias, masked) * gate) v: SparseBERT Eq. 4/5 (probabilities gated, not renormalised)."""
    N = q_BHND.shape[2]
    s = scale if scale is not None else q_BHND.shape[-1] ** -0.5
    scores = torch.matmul(q_BHND, k_BHND.transpose(-1, -2)) * s
    if score_bias is not None:
        scores = scores + score_bias.dense(N)
    if key_padding_mask_BN is not None:
        scores = scores.masked_fill(~key_padding_mask_BN[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), -1).nan_to_num(0.0).to(q_BHND.dtype)
    probs = probs * gate_HNN[:, :N, :N].to(probs.dtype)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    return torch.matmul(probs, v_BHND)
