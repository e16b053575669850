"""Rotary positions (``position.type = "rotary"``) equal Hugging Face ModernBERT's rotary code: the same q/k in give
the same rotated q/k out, per layer type (global theta 160k, local theta 10k, and other bases), in fp32 and bf16."""

from __future__ import annotations

import pytest
import torch

from model.positions import POSITION_TYPES, PositionConfig
from model.rotary import apply_rotary, rotary_cos_sin

hf_mb = pytest.importorskip("transformers.models.modernbert.modeling_modernbert")


def _hf(theta_global: float, theta_local: float, heads: int, head_size: int):
    from transformers import ModernBertConfig

    cfg = ModernBertConfig(
        vocab_size=64,
        hidden_size=heads * head_size,
        num_attention_heads=heads,
        num_hidden_layers=3,
        intermediate_size=32,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": theta_global},
            "sliding_attention": {"rope_type": "default", "rope_theta": theta_local},
        },
    )
    return hf_mb.ModernBertRotaryEmbedding(cfg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("thetas", [(160000.0, 10000.0), (500.0, 77.0)])
def test_rotary_matches_transformers(thetas, dtype):
    B, H, N, D = 2, 4, 37, 16
    hf = _hf(*thetas, H, D)
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(B, H, N, D, generator=g) * 3).to(dtype)
    k = (torch.randn(B, H, N, D, generator=g) * 3).to(dtype)
    pos = torch.arange(N).unsqueeze(0)
    for layer_type, theta in zip(("full_attention", "sliding_attention"), thetas):
        cos, sin = hf(q.transpose(1, 2), pos, layer_type)
        want_q, want_k = hf_mb.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
        got_q, got_k = apply_rotary(q, k, theta)
        assert got_q.dtype == dtype and got_k.dtype == dtype
        tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=0, rtol=0)
        torch.testing.assert_close(got_q, want_q, **tol, msg=lambda m: f"{layer_type} q: {m}")
        torch.testing.assert_close(got_k, want_k, **tol, msg=lambda m: f"{layer_type} k: {m}")
        my_cos, my_sin = rotary_cos_sin(N, D, theta, q.device, dtype)
        torch.testing.assert_close(my_cos, cos[0], atol=0, rtol=0)
        torch.testing.assert_close(my_sin, sin[0], atol=0, rtol=0)


def test_rotary_is_relative():
    """The score of (i, j) depends on i - j only: shifting both by s keeps every score."""
    D, N, s = 8, 20, 5
    g = torch.Generator().manual_seed(1)
    q1 = torch.randn(1, 1, 1, D, generator=g)
    k1 = torch.randn(1, 1, 1, D, generator=g)
    q = q1.expand(1, 1, N, D).contiguous()
    k = k1.expand(1, 1, N, D).contiguous()
    rq, rk = apply_rotary(q, k, 10000.0)
    scores = (rq @ rk.transpose(-1, -2))[0, 0]
    for i in range(N - s):
        for j in range(N - s):
            torch.testing.assert_close(scores[i + s, j + s], scores[i, j], atol=1e-4, rtol=1e-4)


def test_rotary_config_checks():
    assert "rotary" in POSITION_TYPES
    PositionConfig(type="rotary", rope_theta=1e6)
    with pytest.raises(ValueError, match="sharing"):
        PositionConfig(type="rotary", sharing="layer")
    with pytest.raises(ValueError, match="rope_theta"):
        PositionConfig(type="rotary", rope_theta=0.0)
    with pytest.raises(ValueError, match="even head size"):
        apply_rotary(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3), 10.0)
