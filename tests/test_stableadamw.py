"""--optimizer stableadamw: torch-optimi's StableAdamW against the paper's rule written out here (Wortsman et al.
2023, Algorithm 2: AdamW with debiased betas whose per-tensor step is divided by max(1, RMS(g^2 / max(v, eps^2)))),
through the trainer with an exact resume, and refused where DeepSpeed would hand it flattened shards."""

from __future__ import annotations

import math

import pytest
import torch

from tests import train_utils as tu


def _reference_step(p, g, m, v, t, lr, b1, b2, wd, eps):
    """One StableAdamW step on one tensor (in place), as the paper writes it."""
    b1_hat = b1 * (1 - b1 ** (t - 1)) / (1 - b1**t)
    b2_hat = b2 * (1 - b2 ** (t - 1)) / (1 - b2**t)
    m.mul_(b1_hat).add_((1 - b1_hat) * g)
    v.mul_(b2_hat).add_((1 - b2_hat) * g * g)
    rms = math.sqrt(float((g * g / torch.clamp(v, min=eps * eps)).mean()))
    eta = lr / max(1.0, rms)
    p.mul_(1 - eta * wd)
    p.sub_(eta * m / (v.sqrt() + eps))
    return rms


def test_optimi_stableadamw_follows_the_papers_rule():
    from optimi import StableAdamW

    torch.manual_seed(0)
    shapes = [(16, 8), (8,), (3, 4, 5)]
    params = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    ref = [p.detach().clone() for p in params]
    state = [(torch.zeros_like(r), torch.zeros_like(r)) for r in ref]
    opt = StableAdamW(params, lr=1e-2, betas=(0.9, 0.98), weight_decay=0.1, eps=1e-6, foreach=False)
    clipped = 0
    for t in range(1, 8):
        # a gradient spike at step 5: the RMS exceeds 1 and the step is scaled down
        grads = [torch.randn(s, dtype=torch.float64) * (50.0 if t == 5 else 1.0) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for r, (m, v), g in zip(ref, state, grads):
            clipped += _reference_step(r, g, m, v, t, 1e-2, 0.9, 0.98, 0.1, 1e-6) > 1
        for p, r in zip(params, ref):
            torch.testing.assert_close(p.detach(), r, rtol=1e-12, atol=1e-12)
    assert clipped >= len(shapes)  # the spike's step was clipped for every tensor


@pytest.mark.extended  # ~25 s of launches
@pytest.mark.timeout(600)
def test_trains_and_resumes_exactly_and_is_refused_with_zero(tmp_path):
    tu.prepare(tmp_path, hidden_dropout=0.0, attention_dropout=0.0)
    args = tu.train_args(tmp_path, "zero0_fp32.json", 4, "--optimizer", "stableadamw", global_batch=4)
    p = tu.launch("deepspeed", args + ["--log-json", str(tmp_path / "a.jsonl")])
    assert p.returncode == 0, p.stdout[-4000:]
    assert "StableAdamW" in p.stdout
    ck = str(tmp_path / "ck")
    resumable = args + ["--log-json", str(tmp_path / "b.jsonl"), "--save", ck, "--load", ck]
    assert tu.launch("deepspeed", resumable + ["--exit-interval", "2"]).returncode == 0
    p = tu.launch("deepspeed", resumable)
    assert p.returncode == 0, p.stdout[-4000:]
    a, b = tu.train_records(tmp_path / "a.jsonl"), tu.train_records(tmp_path / "b.jsonl")
    assert [r["iteration"] for r in b] == [1, 2, 3, 4]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    refused = tu.launch("deepspeed", tu.train_args(tmp_path, "zero2_fp32.json", 2, "--optimizer", "stableadamw"))
    assert refused.returncode == 2
    assert "--optimizer stableadamw cannot run with ZeRO stage 2" in refused.stdout
