"""Triton programs of :mod:`model.fused_norm`: ``y = LayerNorm(dropout(x) + residual)`` forward and backward, one row
of the hidden dimension per program instance in the forward, a run of rows per instance in the backward (the
LayerNorm weight and bias gradients summed per instance, then over instances by torch).

Dropout is Philox keyed by a seed drawn from torch's generator, four uniforms per call (``tl.rand4x``, as triton_block's
mask): element (row, col) is lane ``col % 4`` of counter ``row * ceil(D / 4) + col // 4``, a quarter of the Philox
rounds of one call per element. The backward regenerates the mask instead of storing it, and a seed replays the same
mask (the tests compare with the eager reference under that mask, :func:`keep_kernel`). Imported by name on first use
(model/fused_norm.py), so a Hugging Face export that copies the model's static imports needs torch only."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _keep(seed_ptr, row, D, BLOCK_D: tl.constexpr, DROPOUT_P: tl.constexpr):
    """bool [BLOCK_D]: the keep mask of one row (uniform >= p), four uniforms per Philox call; the same in forward
    and backward."""
    quads = tl.arange(0, BLOCK_D // 4)
    u0, u1, u2, u3 = tl.rand4x(tl.load(seed_ptr), row.to(tl.int64) * ((D + 3) // 4) + quads)
    u = tl.interleave(tl.interleave(u0, u2), tl.interleave(u1, u3))  # columns 4c + i = u_i[c]
    return u >= DROPOUT_P


@triton.jit
def keep_kernel(keep_ptr, seed_ptr, D, BLOCK_D: tl.constexpr, DROPOUT_P: tl.constexpr):
    """The mask the forward and backward draw, written out (uint8): what the tests hand the eager reference."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    off = row.to(tl.int64) * D + cols
    tl.store(keep_ptr + off, _keep(seed_ptr, row, D, BLOCK_D, DROPOUT_P).to(tl.uint8), mask=ok)


@triton.jit
def fwd_kernel(
    x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, z_ptr, mean_ptr, rstd_ptr, seed_ptr,
    D, eps, scale,
    BLOCK_D: tl.constexpr, DROPOUT_P: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """z = dropout(x) * scale + r (stored in z's dtype: eager's add promotes x and r), y = LayerNorm(z) of the stored
    z (in y's dtype: fp32 under CUDA autocast, as eager's layer_norm)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    off = row.to(tl.int64) * D + cols
    x = tl.load(x_ptr + off, mask=ok, other=0.0).to(tl.float32)
    if DROPOUT_P > 0:
        x = tl.where(_keep(seed_ptr, row, D, BLOCK_D, DROPOUT_P), x * scale, 0.0)
    z = x + tl.load(r_ptr + off, mask=ok, other=0.0).to(tl.float32)
    z = z.to(z_ptr.dtype.element_ty)
    tl.store(z_ptr + off, z, mask=ok)
    z = z.to(tl.float32)  # normalise what was stored, as eager's LayerNorm reads the rounded sum
    mean = tl.sum(z, axis=0) / D
    zc = tl.where(ok, z - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, axis=0) / D + eps)
    y = zc * rstd * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def bwd_kernel(
    dy_ptr, z_ptr, w_ptr, mean_ptr, rstd_ptr, seed_ptr, dx_ptr, dr_ptr, dw_ptr, db_ptr,
    M, D, scale,
    BLOCK_D: tl.constexpr, DROPOUT_P: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """dz = LayerNorm's input gradient; dr = dz, dx = dz * mask * scale; per-program partial sums of dy * xhat (the
    weight's gradient) and dy (the bias's) into row ``program_id`` of dw / db (fp32)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_D], dtype=tl.float32)
    db = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(0, ROWS):
        row = pid * ROWS + i
        live = ok & (row < M)  # the last program's rows past M: nothing loaded, nothing stored
        off = row.to(tl.int64) * D + cols
        dy = tl.load(dy_ptr + off, mask=live, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + off, mask=live, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row, mask=row < M, other=0.0)
        rstd = tl.load(rstd_ptr + row, mask=row < M, other=0.0)
        xhat = tl.where(live, (z - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / D
        c2 = tl.sum(wdy, axis=0) / D
        dz = (wdy - (xhat * c1 + c2)) * rstd
        dw += dy * xhat
        db += dy
        tl.store(dr_ptr + off, dz.to(dr_ptr.dtype.element_ty), mask=live)
        if DROPOUT_P > 0:
            dz = tl.where(_keep(seed_ptr, row, D, BLOCK_D, DROPOUT_P), dz * scale, 0.0)
        tl.store(dx_ptr + off, dz.to(dx_ptr.dtype.element_ty), mask=live)
    tl.store(dw_ptr + pid.to(tl.int64) * D + cols, dw, mask=ok)
    tl.store(db_ptr + pid.to(tl.int64) * D + cols, db, mask=ok)
