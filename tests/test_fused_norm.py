"""ModelConfig.residual_norm 'triton' (issue #47 item 6): LayerNorm(dropout(x) + residual) in one Triton kernel each way
(model/fused_norm.py) against the eager reference: forward and gradients at dropout 0, the same under the kernel's own
mask at dropout > 0, the mask's statistics, the seed's replay, a whole post-LN layer, and where the path applies. On
CPU the programs run under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without a GPU)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from model import fused_norm as fn
from model.bert import BertLayer
from model.config import ModelConfig
from pretrain.checkpoint import architecture_differences

pytestmark = [
    pytest.mark.gpu,  # devtools.gpu_check runs the real kernel on CUDA
    pytest.mark.skipif(
        not torch.cuda.is_available() and not fn.interpreting(), reason="Triton runs on CUDA or under its interpreter"
    ),
]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _inputs(shape=(2, 8, 48), dtype=torch.float32, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(DEVICE, dtype).requires_grad_()
    r = torch.randn(shape, generator=g).to(DEVICE, dtype).requires_grad_()
    norm = nn.LayerNorm(shape[-1], eps=1e-12, bias=bias).to(DEVICE, dtype)
    with torch.no_grad():  # not the identity init, so weight and bias matter
        norm.weight.copy_(1 + 0.5 * torch.randn(shape[-1], generator=g))
        if bias:
            norm.bias.copy_(0.5 * torch.randn(shape[-1], generator=g))
    return x, r, norm


def _run(fused: bool, x, r, norm, p, keep=None, seed=None):
    """Forward and the gradients of a fixed projection of the output."""
    for t in (x, r, norm.weight, norm.bias):
        if t is not None:
            t.grad = None
    if fused:
        y = fn.FusedDropoutAddNorm.apply(x, r, norm.weight, norm.bias, p, norm.eps, seed)
    else:
        y = fn.eager_dropout_add_norm(x, r, norm, p, True, keep)
    w = torch.linspace(-1, 1, y.numel(), device=y.device).view(y.shape).to(y.dtype)
    (y * w).sum().backward()
    grads = [t.grad.clone() if t is not None else None for t in (x, r, norm.weight, norm.bias)]
    return y.detach(), grads


def _close(a, b, tol):
    for u, v in zip(a, b):
        if u is None:
            assert v is None
            continue
        torch.testing.assert_close(u.float(), v.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("D", [48, 64])  # a width that is not a power of two: the masked columns
def test_dropout0_matches_eager(D, bias):
    x, r, norm = _inputs((2, 8, D), bias=bias)
    y_ref, g_ref = _run(False, x, r, norm, 0.0)
    y, g = _run(True, x, r, norm, 0.0)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    _close(g, g_ref, 1e-4)


def test_bf16_is_as_close_to_fp32_as_eager_bf16():
    x, r, norm = _inputs((2, 16, 64), dtype=torch.bfloat16)
    y_e, g_e = _run(False, x, r, norm, 0.0)
    y_f, g_f = _run(True, x, r, norm, 0.0)
    # the fp32 reference on the same (bf16) values
    x32, r32 = x.detach().float().requires_grad_(), r.detach().float().requires_grad_()
    norm32 = nn.LayerNorm(64, eps=norm.eps).to(DEVICE)
    norm32.load_state_dict({k: v.float() for k, v in norm.state_dict().items()})
    y_32, g_32 = _run(False, x32, r32, norm32, 0.0)
    for fused, eager, ref in zip([y_f, *g_f], [y_e, *g_e], [y_32, *g_32]):
        err_f = (fused.float() - ref).abs().max().item()
        err_e = (eager.float() - ref).abs().max().item()
        assert err_f <= 2 * err_e + 1e-2 * ref.abs().max().item(), (err_f, err_e)


def test_dropout_matches_eager_under_the_same_mask():
    p = 0.25
    x, r, norm = _inputs((2, 8, 48))
    seed = torch.tensor([1234], dtype=torch.int64, device=DEVICE)
    keep = fn.keep_mask(seed, x.shape, p, DEVICE)
    assert 0 < keep.float().mean() < 1
    y_ref, g_ref = _run(False, x, r, norm, p, keep=keep)
    y, g = _run(True, x, r, norm, p, seed=seed)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    _close(g, g_ref, 1e-4)
    # the input's gradient is zero exactly where the mask drops, the residual's is not
    assert torch.all(g[0][keep == 0] == 0) and torch.all(g[0][keep == 1] != 0)
    assert torch.all(g[1] != 0)


def test_mask_statistics_and_replay():
    p, shape = 0.1, (2, 16, 256)
    n = math.prod(shape)
    a = fn.keep_mask(torch.tensor([7], device=DEVICE), shape, p, DEVICE).float()
    b = fn.keep_mask(torch.tensor([7], device=DEVICE), shape, p, DEVICE).float()
    c = fn.keep_mask(torch.tensor([8], device=DEVICE), shape, p, DEVICE).float()
    assert torch.equal(a, b)  # a seed replays its mask
    # the kept fraction within 6 binomial standard deviations of 1 - p; another seed, another (independent) mask
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(a.mean().item() - (1 - p)) < 6 * sd
    agree = (a == c).float().mean().item()
    expected = (1 - p) ** 2 + p**2
    assert abs(agree - expected) < 6 * math.sqrt(expected * (1 - expected) / n)
    # rows are not copies of each other (the offset covers the row, not only the column)
    assert not torch.equal(a[0, 0], a[0, 1])
    # the expectation is kept: mean over many masks of keep / (1 - p) is 1
    assert abs((a / (1 - p)).mean().item() - 1) < 6 * sd / (1 - p)


def test_mask_is_four_philox_lanes_per_call():
    """Four uniforms per Philox call (``tl.rand4x``, as triton_block's mask; issue #56): element (row, col) is lane
    ``col % 4`` of counter ``row * ceil(D / 4) + col // 4`` (a probe stores each lane at its own column, not through
    the kernels' interleave); each lane keeps 1 - p of its elements and two lanes of one call are kept together
    (1 - p)^2 of the time (within 5 sigma: independent outputs, not copies). D = 50 is not a multiple of 4."""
    import triton
    import triton.language as tl

    @triton.jit
    def lanes_probe(out_ptr, seed_ptr, D, Q: tl.constexpr, P: tl.constexpr):
        row = tl.program_id(0)
        c = tl.arange(0, Q)
        u = tl.rand4x(tl.load(seed_ptr), row.to(tl.int64) * ((D + 3) // 4) + c)
        for i in tl.static_range(4):
            col = 4 * c + i
            tl.store(out_ptr + row * D + col, (u[i] >= P).to(tl.uint8), mask=col < D)

    p, M, D = 0.25, 16, 50
    seed = torch.tensor([99], dtype=torch.int64, device=DEVICE)
    want = torch.zeros(M, D, dtype=torch.uint8, device=DEVICE)
    lanes_probe[(M,)](want, seed, D, Q=16, P=p)
    assert torch.equal(fn.keep_mask(seed, (M, D), p, DEVICE), want)
    big = fn.keep_mask(seed, (32, 512), p, DEVICE).view(32, 128, 4).cpu().float()
    count = big[..., 0].numel()
    sigma = math.sqrt(p * (1 - p) / count)
    for i in range(4):
        assert abs(big[..., i].mean().item() - (1 - p)) < 5 * sigma, i
    both = (1 - p) ** 2
    sigma2 = math.sqrt(both * (1 - both) / count)
    for i, j in ((0, 1), (1, 2), (2, 3), (0, 3)):
        assert abs((big[..., i] * big[..., j]).mean().item() - both) < 5 * sigma2, (i, j)


@pytest.mark.parametrize("p", [0.0, 0.2])
def test_autocast_keeps_the_residual_stream_in_fp32_as_eager(p):
    """Under autocast a sublayer's output is bf16 and the residual stream fp32 (a LayerNorm's output): eager's add
    promotes to fp32 and LayerNorm normalises the fp32 sum; the kernel stores z and y in eager's dtypes
    (fn.eager_dtypes) and returns each input's gradient in that input's dtype (issue #56: it kept z and y in bf16)."""
    x, r, norm = _inputs((2, 8, 64))
    x = x.detach().bfloat16().requires_grad_()
    seed = torch.tensor([5], dtype=torch.int64, device=DEVICE)
    keep = fn.keep_mask(seed, x.shape, p, DEVICE) if p else None
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        y_ref, g_ref = _run(False, x, r, norm, p, keep=keep)
        y, g = _run(True, x, r, norm, p, seed=seed)
    assert y.dtype == y_ref.dtype == torch.float32
    assert [t.dtype for t in g] == [t.dtype for t in g_ref] == [torch.bfloat16] + [torch.float32] * 3
    assert fn.eager_dtypes(x, r) == (torch.float32, torch.float32)
    tol = 1e-5 if p == 0 else 1e-2  # eager rounds x / (1 - p) to bf16 before the add, the kernel does not
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    _close(g[:1], g_ref[:1], 1e-2)  # x's gradient is bf16: an ulp of rounding apart
    _close(g[1:], g_ref[1:], 1e-4 if p == 0 else 1e-2)


def test_post_ln_layer_under_autocast_matches_eager():
    """A whole post-LN layer under bf16 autocast: the fused layer returns eager's dtype (fp32: the residual stream)
    and eager's values and gradients at bf16 tolerance."""
    eager, fused = _layer_pair(hidden_dropout=0.0, attention_dropout=0.0)
    x = torch.randn(2, 16, eager.ffn_layer_norm.normalized_shape[0], device=DEVICE)
    outs = []
    for layer in (eager, fused):
        layer.train()
        xi = x.clone().requires_grad_()
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            y = layer(xi)
        y.float().square().sum().backward()
        outs.append((y.detach(), xi.grad, [q.grad.clone() for q in layer.parameters()]))
    assert outs[1][0].dtype == outs[0][0].dtype == torch.float32
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=5e-2, atol=5e-2)


def test_seed_comes_from_torch_generator():
    x, r, norm = _inputs((2, 8, 48))
    torch.manual_seed(3)
    y1 = fn.FusedDropoutAddNorm.apply(x, r, norm.weight, norm.bias, 0.5, norm.eps)
    torch.manual_seed(3)
    y2 = fn.FusedDropoutAddNorm.apply(x, r, norm.weight, norm.bias, 0.5, norm.eps)
    y3 = fn.FusedDropoutAddNorm.apply(x, r, norm.weight, norm.bias, 0.5, norm.eps)
    assert torch.equal(y1, y2) and not torch.equal(y2, y3)


def _layer_pair(**over):
    cfg = ModelConfig.preset("tiny", vocab_size=64, **over)
    torch.manual_seed(0)
    eager = BertLayer(cfg, 0).to(DEVICE)
    fused = BertLayer(ModelConfig.preset("tiny", vocab_size=64, residual_norm="triton", **over), 0).to(DEVICE)
    fused.load_state_dict(eager.state_dict())
    return eager, fused


@pytest.mark.parametrize("train", [False, True])
def test_post_ln_layer_matches_eager(train):
    eager, fused = _layer_pair(hidden_dropout=0.0, attention_dropout=0.0)
    eager.train(train)
    fused.train(train)
    x = torch.randn(2, 16, eager.ffn_layer_norm.normalized_shape[0], device=DEVICE)
    outs = []
    for layer in (eager, fused):
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.square().sum().backward()
        outs.append((y.detach(), xi.grad, [p.grad.clone() for p in layer.parameters()]))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-4, atol=1e-4)
    for a, b in zip(outs[1][2], outs[0][2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_where_the_fused_path_applies(monkeypatch):
    x, r, norm = _inputs()
    calls = []
    real = fn.FusedDropoutAddNorm.apply
    monkeypatch.setattr(fn.FusedDropoutAddNorm, "apply", lambda *a: calls.append(1) or real(*a))
    fn.dropout_add_norm(x, r, norm, 0.1, True, fused=True)
    assert calls == [1]
    fn.dropout_add_norm(x, r, norm, 0.1, True, fused=False)  # the setting off: eager
    assert calls == [1]
    fn.dropout_add_norm(x, r, nn.Identity(), 0.1, True, fused=True)  # no LayerNorm there
    assert calls == [1]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # traced by torch.compile: eager ops
    fn.dropout_add_norm(x, r, norm, 0.1, True, fused=True)
    assert calls == [1]
    if not torch.cuda.is_available():  # a CPU tensor without the interpreter: eager
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        fn.dropout_add_norm(x, r, norm, 0.1, True, fused=True)
        assert calls == [1]


def test_the_start_up_line_says_where_the_setting_runs_eager(monkeypatch):
    """residual_norm 'triton' is never dropped silently: the trainer's start-up line says the kernel runs, or why the
    eager ops run instead (compiled, a CPU without the interpreter, Triton missing); the same rule as each call's."""
    assert "one Triton kernel" in fn.route_line("cuda", compiled=False) and fn.refusal("cuda", False) is None
    assert "eager" in fn.route_line("cuda", compiled=True) and "Inductor" in fn.route_line("cuda", compiled=True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "runs on CUDA" in fn.route_line("cpu", compiled=False)
    x, r, norm = _inputs()
    assert not fn.fused_applies(x, norm)  # what a call does agrees
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(fn, "programs", lambda: None)
    assert "not here" in fn.route_line("cuda", compiled=False)


def test_setting_is_checked_and_not_architecture():
    with pytest.raises(ValueError, match="residual_norm .*--residual-norm.*one of"):
        ModelConfig.preset("tiny", residual_norm="fast")
    with pytest.raises(ValueError, match="pre-LN"):
        ModelConfig.preset("modernbert-tiny", residual_norm="triton")
    a = ModelConfig.preset("bert-base").to_dict()
    b = ModelConfig.preset("bert-base", residual_norm="triton").to_dict()
    assert architecture_differences(a, b) == []  # a checkpoint resumes under either
    legacy = dict(a)
    del legacy["residual_norm"]  # written before the setting existed
    assert architecture_differences(legacy, b) == []


def test_activation_checkpointing_recomputes_the_same_mask():
    """--checkpoint-activations recomputes a layer in the backward: the seed comes from torch's generator, whose state
    torch.utils.checkpoint restores, so the recomputed forward draws the same mask and the gradients are the same."""
    from torch.utils.checkpoint import checkpoint

    _, fused = _layer_pair(hidden_dropout=0.3, attention_dropout=0.0)
    fused.train()
    x = torch.randn(1, 8, fused.ffn_layer_norm.normalized_shape[0], device=DEVICE)
    grads = []
    for recompute in (False, True):
        torch.manual_seed(11)
        xi = x.clone().requires_grad_()
        y = checkpoint(fused, xi, use_reentrant=False) if recompute else fused(xi)
        y.square().sum().backward()
        grads.append((y.detach(), xi.grad.clone()))
        fused.zero_grad()
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=0, atol=0)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-6, atol=1e-6)
