"""The autograd function around the Triton launches: forward (O and the log-sum-exp), backward (delta = rowsum(dO *
O) by a Triton program, then the dK/dV and dQ programs). No host sync: the dropout seed stays on the device, every
shape comes from the inputs and the plan."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from model.attention.kernels.triton_block.tables import TileTables


def programs() -> ModuleType:
    """The Triton programs (:mod:`.tl_kernels`), imported on first use. By module name, not an import statement: a
    Hugging Face export (tools/hf_export) copies what is imported statically and may depend on torch only, so the
    programs stay out of it and this kernel says so there."""
    try:
        return importlib.import_module(".tl_kernels", __package__)
    except ModuleNotFoundError as e:
        raise RuntimeError(
            f"--attention-kernel triton_block: its Triton programs are not here ({e}); an exported model runs dense, "
            "block_gather or flex"
        ) from e


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a unit stride in the head dimension (what the programs index)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _mask_args(kpm_BN: torch.Tensor | None, doc_BN: torch.Tensor | None, q: torch.Tensor):
    kpm = q if kpm_BN is None else kpm_BN.contiguous().view(torch.uint8)
    doc = q if doc_BN is None else doc_BN.contiguous()
    return kpm, doc


class TritonBlockAttention(torch.autograd.Function):
    """``o = softmax(scale * q k^T, masked) @ v`` over the plan's tiles, with attention dropout."""

    @staticmethod
    def forward(ctx, q, k, v, kpm_BN, doc_BN, plan, dropout_p: float, scale: float):
        tl_k = programs()
        q, k, v = _rows(q), _rows(k), _rows(v)
        B, H, N, D = q.shape
        cfg = plan.config(D, q.dtype)
        t: TileTables = plan.tables
        o = torch.empty(B, H, N, D, device=q.device, dtype=q.dtype)
        lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
        seed = torch.randint(0, 2**31 - 1, (1,), device=q.device, dtype=torch.int64) if dropout_p > 0 else plan.no_seed
        kpm, doc = _mask_args(kpm_BN, doc_BN, q)
        grid = (plan.tq, B * H)
        tl_k.fwd_kernel[grid](
            q, k, v, o, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
            t.fwd_offsets_HT, t.fwd_index, t.fwd_partial, plan.layout_u8, kpm, doc, seed,
            H, N, plan.m_blocks, plan.block, plan.band_radius, plan.band_len, plan.tq, scale * tl_k.LOG2E,
            HEAD_STRIDE=plan.head_stride, HAS_KPM=kpm_BN is not None, HAS_DOC=doc_BN is not None,
            HAS_BAND=plan.band_radius >= 0,
            DROPOUT_P=float(dropout_p), D=D, BLOCK_D=cfg.block_d, BLOCK_M=plan.tile_m, BLOCK_N=plan.tile_n,
            PRECISION=dot_precision(q.dtype), LOOP_WHILE=tl_k.INTERPRETED, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, o, lse, seed, *(x for x in (kpm_BN, doc_BN) if x is not None))
        ctx.has = (kpm_BN is not None, doc_BN is not None)
        ctx.plan, ctx.dropout_p, ctx.scale = plan, dropout_p, scale
        return o

    @staticmethod
    def backward(ctx, do):
        tl_k = programs()
        q, k, v, o, lse, seed, *rest = ctx.saved_tensors
        kpm_BN = rest.pop(0) if ctx.has[0] else None
        doc_BN = rest.pop(0) if ctx.has[1] else None
        plan = ctx.plan
        do = _rows(do)
        B, H, N, D = q.shape
        cfg = plan.config(D, q.dtype)
        t: TileTables = plan.tables
        delta = torch.empty(B, H, N, device=q.device, dtype=torch.float32)  # the only fp32 temporary
        tl_k.bwd_preprocess[(plan.tq, B * H)](
            o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2), H, N,
            D=D, BLOCK_D=cfg.block_d, BLOCK_M=plan.tile_m, num_warps=cfg.num_warps,
        )  # fmt: skip
        dq, dk, dv = (torch.empty(B, H, N, D, device=q.device, dtype=q.dtype) for _ in range(3))
        kpm, doc = _mask_args(kpm_BN, doc_BN, q)
        common = dict(
            HEAD_STRIDE=plan.head_stride, HAS_KPM=kpm_BN is not None, HAS_DOC=doc_BN is not None,
            HAS_BAND=plan.band_radius >= 0, DROPOUT_P=float(ctx.dropout_p), D=D, BLOCK_D=cfg.block_d,
            BLOCK_M=plan.tile_m, BLOCK_N=plan.tile_n,
            PRECISION=dot_precision(q.dtype), LOOP_WHILE=tl_k.INTERPRETED, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )  # fmt: skip
        strides = (
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        )  # fmt: skip
        masks = (plan.layout_u8, kpm, doc, seed)
        qk_scale = ctx.scale * tl_k.LOG2E
        t_fwd = (t.fwd_offsets_HT, t.fwd_index, t.fwd_partial)
        t_bwd = (t.bwd_offsets_HT, t.bwd_index, t.bwd_partial)
        for dq_pass, lists, n_tiles in ((False, t_bwd, plan.tk), (True, t_fwd, plan.tq)):
            tl_k.bwd_kernel[(n_tiles, B * H)](
                q, k, v, do, lse, delta, dq, dk, dv, *strides, *lists, *masks,
                H, N, plan.m_blocks, plan.block, plan.band_radius, plan.band_len, n_tiles, qk_scale, ctx.scale,
                DQ_PASS=dq_pass, **common,
            )  # fmt: skip
        return dq, dk, dv, None, None, None, None, None


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs multiply as three TF32 products (``tf32x3``: about fp32's accuracy, for parity with the fp32
    reference; ``ieee`` does not compile in Triton 3.6: an assertion in ConvertTritonGPUToLLVM for sm80 and sm90,
    found compiling without a GPU); fp16/bf16 on the tensor cores."""
    return "tf32x3" if dtype == torch.float32 else "tf32"
