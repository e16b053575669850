"""BlockBERT at a length its chunks do not divide runs unpadded (issue #48 item 3): the chunks of the padded grid
(so a trained model sees the pattern it trained with), the last ones cut to their real length; no padded q/k/v copy,
no key mask. Parity with the dense reference (the layout as a mask), with today's padded computation, and the CPU
contract: no tensor of the padded length and no SDPA mask for n=3 at N=8192."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from model.attention import BlockBERTSparsityConfig, BlockSparseAttention
from model.attention.kernels import get_kernel

CASES = [  # (N, n, head split): N not divisible by n x block (16)
    (200, 3, "2:1:1"),  # chunks of 80: the last holds 40 real tokens
    (20, 3, "2:1:1"),  # chunks of 16: the second holds 4, the third none (its rows' keys: none -> zeros)
    (100, 2, "3:1"),  # chunks of 64: the last holds 36
]


def _qkv(B: int, N: int, H: int, D: int, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    """q/k/v as the encoder makes them: slices of one ``[B, N, 3, H, D]`` projection."""
    return torch.randn(B, N, 3, H, D, generator=torch.Generator().manual_seed(seed), dtype=dtype).requires_grad_()


def _layout_reference(cfg, qkv, kpm=None, docs=None):
    """SDPA with the layout (made on the padded grid) as a token mask cut to the real length: what the real tokens
    attended when the sequence was padded."""
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    N = q.shape[2]
    n_pad = cfg.padded_length(N)
    lay = cfg.make_layout(n_pad).bool()
    allow = lay.repeat_interleave(cfg.block, 1).repeat_interleave(cfg.block, 2)[:, :N, :N].unsqueeze(0)
    if kpm is not None:
        allow = allow & kpm[:, None, None, :]
    if docs is not None:
        allow = allow & (docs[:, :, None] == docs[:, None, :]).unsqueeze(1)
    row_any = allow.any(-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allow | ~row_any) * row_any
    return out


def _padded_today(cfg, kernel: str, qkv, kpm=None):
    """The computation the module did before: q/k/v padded to the grid, the padded keys masked, rows cut."""
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    B, H, N, _ = q.shape
    n_pad = cfg.padded_length(N)
    p = n_pad - N
    kern = get_kernel(kernel)
    plan = kern.make_plan(cfg.make_layout(n_pad), cfg.block, n_pad, torch.device("cpu"), family=cfg.family())
    kpm = torch.ones(B, N, dtype=torch.bool) if kpm is None else kpm
    out = kern(*(F.pad(t, (0, 0, 0, p)) for t in (q, k, v)), plan=plan, key_padding_mask_BN=F.pad(kpm, (0, p)))
    return out[:, :, :N]


@pytest.mark.parametrize("N,n,split", CASES)
@pytest.mark.parametrize("extra", ["plain", "padding", "documents"])
def test_unpadded_blockbert_matches_the_layout_as_a_mask(N: int, n: int, split: str, extra: str) -> None:
    """Output and q/k/v gradients of block_gather (unpadded) equal SDPA with the padded grid's layout as a mask."""
    H = len(split.split(":")) and sum(int(c) for c in split.split(":"))
    cfg = BlockBERTSparsityConfig(H, num_blocks=n, head_assignment=split, block=16)
    qkv = _qkv(2, N, H, 8)
    kw: dict = {}
    if extra == "padding":
        kw["kpm"] = torch.ones(2, N, dtype=torch.bool)
        kw["kpm"][1, N - 7 :] = False
    if extra == "documents":
        kw["docs"] = (torch.arange(N) * 3 // N).expand(2, N).contiguous()
    mod = BlockSparseAttention(cfg, "block_gather", 256)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    out = mod(q, k, v, key_padding_mask_BN=kw.get("kpm"), doc_ids_BN=kw.get("docs"))
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    (g,) = torch.autograd.grad(out, qkv, go)
    ref = _layout_reference(cfg, qkv, **kw)
    (g_ref,) = torch.autograd.grad(ref, qkv, go)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("N,n,split", CASES + [(8192 // 64, 3, "1:1:1")])
def test_unpadded_output_equals_the_padded_computation(N: int, n: int, split: str) -> None:
    """fp32: the real tokens' output is the one the padded computation gave (same chunks, same keys)."""
    H = sum(int(c) for c in split.split(":"))
    cfg = BlockBERTSparsityConfig(H, num_blocks=n, head_assignment=split, block=16)
    qkv = _qkv(2, N, H, 16, dtype=torch.float32, seed=1)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    with torch.no_grad():
        out = BlockSparseAttention(cfg, "block_gather", 256)(q, k, v)
        before = _padded_today(cfg, "block_gather", qkv)
    torch.testing.assert_close(out, before, atol=2e-6, rtol=1e-5)


class _Watch(TorchDispatchMode):
    """Every op output with a dimension of the padded length."""

    def __init__(self, n_pad: int):
        super().__init__()
        self.n_pad, self.padded = n_pad, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and self.n_pad in t.shape:
                self.padded.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("kernel", ["block_gather", "auto"])
def test_no_pad_and_no_mask_for_n3_at_8192(kernel: str, monkeypatch) -> None:
    """The CPU contract: BlockBERT n=3 at N=8192 (grid 8208) runs its training forward with no tensor of 8208 tokens
    (no padded q/k/v, no padded key mask) and every SDPA call without a mask (fused kernels; cuDNN/flash on a GPU).
    Forward only: CPU SDPA's backward of 2736-row tiles takes a minute on the dev box, and the backward makes no
    tensor the forward did not (the gradients of the pieces go into q/k/v-sized buffers)."""
    N, H = 8192, 3
    cfg = BlockBERTSparsityConfig(H, num_blocks=3, head_assignment="1:1:1", block=16)
    assert cfg.padded_length(N) == 8208
    masks = []
    real_sdpa = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, *args, **kw):
        masks.append(attn_mask is not None)
        return real_sdpa(q, k, v, attn_mask, *args, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    mod = BlockSparseAttention(cfg, kernel, N)
    qkv = _qkv(1, N, H, 8, dtype=torch.float32)
    with _Watch(8208) as watch:
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        out = mod(q, k, v)
    assert out.requires_grad and out.shape[2] == N
    assert not watch.padded, f"tensors of the padded length: {watch.padded[:5]}"
    assert masks and not any(masks), f"SDPA calls with a mask: {sum(masks)} of {len(masks)}"
