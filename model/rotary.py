"""Rotary position embeddings (RoPE, Su et al. 2021) as ModernBERT applies them (``position.type = "rotary"``).

Query and key of every head are rotated by their absolute position before the attention kernel, so the score of
(i, j) depends on i - j only and nothing is added to the input or to the scores: every kernel and layout runs
unchanged. The arithmetic follows Hugging Face's ``ModernBertRotaryEmbedding`` + ``apply_rotary_pos_emb`` (non
interleaved halves, cos/sin made in fp32 then cast to the activations' dtype, the rotation done in fp32), so a
stock ``ModernBertForMaskedLM`` export computes the same logits. The base (theta) is per layer: ModernBERT uses
160k on its global layers and 10k on its sliding-window ones (``position.rope_theta`` / ``rope_theta_local``).

Nothing is stored: cos/sin are computed per call from the position index (n x head_size/2 values, negligible
next to the attention), so state dicts, ZeRO partitioning and meta-device construction are unaffected.
"""

from __future__ import annotations

import torch


def inverse_frequencies(head_size: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """fp32 ``[head_size / 2]``: theta^(-2k / head_size), k = 0 .. head_size/2 - 1."""
    if head_size % 2:
        raise ValueError(f"rotary positions need an even head size, got {head_size}")
    exponent = torch.arange(0, head_size, 2, dtype=torch.float, device=device) / head_size
    return 1.0 / (float(theta) ** exponent)


def rotary_cos_sin(
    n: int, head_size: int, theta: float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each ``[n, head_size]`` in ``dtype``, for positions 0 .. n-1 (the two halves repeat)."""
    freqs_NF = torch.arange(n, device=device).float()[:, None] * inverse_frequencies(head_size, theta, device)
    emb_ND = torch.cat((freqs_NF, freqs_NF), dim=-1)
    return emb_ND.cos().to(dtype), emb_ND.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(
    q_BHND: torch.Tensor, k_BHND: torch.Tensor, theta: float, positions_BN: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated by their positions (the sequence axis is dim 2): 0 .. N-1, or ``positions_BN`` per row (packed
    sequences restart at every document, as Hugging Face's ``position_ids``); same dtype as given."""
    n, d = q_BHND.shape[-2], q_BHND.shape[-1]
    if positions_BN is None:
        cos_ND, sin_ND = rotary_cos_sin(n, d, theta, q_BHND.device, q_BHND.dtype)
    else:
        freqs = positions_BN.float()[:, None, :, None] * inverse_frequencies(d, theta, q_BHND.device)
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, 1, N, D]
        cos_ND, sin_ND = emb.cos().to(q_BHND.dtype), emb.sin().to(q_BHND.dtype)
    out = []
    for x in (q_BHND, k_BHND):
        xf = x.float()
        out.append((xf * cos_ND + _rotate_half(xf) * sin_ND).to(x.dtype))
    return out[0], out[1]
