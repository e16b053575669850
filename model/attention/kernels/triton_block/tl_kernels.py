"""The Triton programs of ``triton_block`` (imported on first use, so that ``TRITON_INTERPRET=1`` set by a CPU test
before the import takes effect, and so that importing the kernel registry never needs Triton).

FlashAttention-2 structure over the visited tiles only: the forward keeps a running max and sum per query row and
stores O and the log-sum-exp (base 2); the backward first computes ``delta = rowsum(dO * O)`` per query tile
(``bwd_preprocess``: fp32 in registers, only ``[B, H, N]`` fp32 stored), then recomputes P per tile: one program per
key tile accumulates dK and dV over the query tiles that visit it, another per query tile accumulates dQ (no atomics).

Scores stay unscaled: ``scale * log2(e)`` multiplies them inside the exp2's argument (``s * qk_scale - m``, one FMA),
not as a separate pass over the tile, and q is not prescaled (a bf16 q times the scale would round once more).
Full tiles (every pair of the tile allowed by the layout, inside N, no padded key, one document) skip the mask; the
others evaluate it (:func:`_allowed`).

Attention dropout is Philox keyed by a seed drawn from torch's generator plus the (batch, head): one Philox call
(``tl.rand4x``) gives the four elements ``(row, 4c .. 4c + 3)`` at counter ``row * ceil(N / 4) + c``, the same in
every tile shape, so the backward regenerates exactly the forward's mask at a quarter of ``tl.rand``'s cost."""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
INTERPRETED = bool(triton.knobs.runtime.interpret)
"""Whether the programs below were decorated for Triton's interpreter (read once, as ``triton.jit`` does)."""


@triton.jit
def _allowed(
    offs_m,
    offs_n,
    b,
    hl,
    partial,
    N,
    kpm_ptr,
    doc_ptr,
    lay_ptr,
    M_BLOCKS,
    LAY_BLOCK,
    BAND_R,
    BAND_LEN,
    HAS_KPM: tl.constexpr,
    HAS_DOC: tl.constexpr,
    HAS_BAND: tl.constexpr,
):
    """bool [BM, BN]: which (query, key) pairs of this tile attend (inside N, key padding, same document, layout, and
    on partial tiles a sliding window ``|i - j| <= BAND_R`` over the first ``BAND_LEN`` tokens)."""
    in_n = offs_n < N
    ok = (offs_m[:, None] >= 0) & in_n[None, :]
    if HAS_KPM:
        kp = tl.load(kpm_ptr + b * N + offs_n, mask=in_n, other=0)
        ok = ok & (kp != 0)[None, :]
    if HAS_DOC:
        dq = tl.load(doc_ptr + b * N + offs_m, mask=offs_m < N, other=-2)
        dk = tl.load(doc_ptr + b * N + offs_n, mask=in_n, other=-3)
        ok = ok & (dq[:, None] == dk[None, :])
    if partial != 0:
        bm = tl.minimum(offs_m // LAY_BLOCK, M_BLOCKS - 1)
        bn = tl.minimum(offs_n // LAY_BLOCK, M_BLOCKS - 1)
        bits = tl.load(lay_ptr + hl * M_BLOCKS * M_BLOCKS + bm[:, None] * M_BLOCKS + bn[None, :])
        ok = ok & (bits != 0)
        if HAS_BAND:
            dist = offs_m[:, None] - offs_n[None, :]
            inside = (offs_m < BAND_LEN)[:, None] & (offs_n < BAND_LEN)[None, :]
            ok = ok & inside & (dist <= BAND_R) & (dist >= -BAND_R)
    return ok


@triton.jit
def _keep(seed_ptr, bh, offs_m, n0, N, DROPOUT_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """bool [BM, BLOCK_N]: the dropout keep mask of the key tile starting at ``n0`` (a multiple of 4), the same in
    forward and backward: four uniforms per Philox call, element (row, col) the ``col % 4``-th of counter
    ``row * ceil(N / 4) + col // 4``."""
    seed = tl.load(seed_ptr) + bh
    cols = n0 // 4 + tl.arange(0, BLOCK_N // 4)
    u0, u1, u2, u3 = tl.rand4x(seed, offs_m[:, None] * ((N + 3) // 4) + cols[None, :])
    u = tl.interleave(tl.interleave(u0, u2), tl.interleave(u1, u3))  # columns 4c + i = u_i[c]
    return u >= DROPOUT_P


@triton.jit
def _masked(s, offs_m, offs_n, n0, b, hl, partial, N, kpm_ptr, doc_ptr, lay_ptr, M_BLOCKS, LAY_BLOCK, BAND_R,
            BAND_LEN, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, HAS_BAND: tl.constexpr,
            BLOCK_N: tl.constexpr):  # fmt: skip
    """``s`` with -inf where a pair does not attend. A full tile is returned as it is, without evaluating the mask:
    every pair allowed by the layout and the window (``partial == 0``), the key tile inside N, none of its keys
    padding, and its queries and keys all of one document (a row of the key padding mask and of the document ids is
    checked per tile: a few loads and a reduction instead of the ``[BM, BN]`` mask)."""
    needs = (partial != 0) | (n0 + BLOCK_N > N)
    if HAS_KPM:
        kp = tl.load(kpm_ptr + b * N + offs_n, mask=offs_n < N, other=0)
        needs = needs | (tl.min(kp, 0) == 0)
    if HAS_DOC:
        dq = tl.load(doc_ptr + b * N + offs_m, mask=offs_m < N, other=-2)
        dk = tl.load(doc_ptr + b * N + offs_n, mask=offs_n < N, other=-3)
        d0 = tl.min(dq, 0)
        needs = needs | (tl.max(dq, 0) != d0) | (tl.min(dk, 0) != d0) | (tl.max(dk, 0) != d0)
    if needs:
        ok = _allowed(offs_m, offs_n, b, hl, partial, N, kpm_ptr, doc_ptr, lay_ptr, M_BLOCKS, LAY_BLOCK, BAND_R,
                      BAND_LEN, HAS_KPM, HAS_DOC, HAS_BAND)  # fmt: skip
        s = tl.where(ok, s, float("-inf"))
    return s


@triton.jit
def _key_scores(
    i, q, ctx, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, HAS_BAND: tl.constexpr, DROPOUT_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """The i-th key tile a query tile visits: K, V, the unscaled scores (-inf where not allowed; ``s * qk_scale`` is
    base 2), the dropout keep mask (None without dropout) and ``qk_scale``."""
    (
        k_ptr, v_ptr, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, index_ptr, partial_ptr, lay_ptr, kpm_ptr, doc_ptr, seed_ptr,
        b, h, hl, bh, offs_m, offs_d, d_ok, N, M_BLOCKS, LAY_BLOCK, BAND_R, BAND_LEN, qk_scale
    ) = ctx  # fmt: skip
    kt = tl.load(index_ptr + i)
    partial = tl.load(partial_ptr + i)
    n0 = kt * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    kv_mask = (offs_n < N)[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + b * s_kb + h * s_kh + offs_n[:, None] * s_kn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + b * s_vb + h * s_vh + offs_n[:, None] * s_vn + offs_d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    s = _masked(s, offs_m, offs_n, n0, b, hl, partial, N, kpm_ptr, doc_ptr, lay_ptr, M_BLOCKS, LAY_BLOCK, BAND_R,
                BAND_LEN, HAS_KPM, HAS_DOC, HAS_BAND, BLOCK_N)  # fmt: skip
    if DROPOUT_P > 0.0:
        keep = _keep(seed_ptr, bh, offs_m, n0, N, DROPOUT_P, BLOCK_N)
    else:
        keep = None
    return k, v, s, keep, qk_scale


@triton.jit
def _fwd_step(
    i, q, acc, m_i, l_i, ctx, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, HAS_BAND: tl.constexpr,
    DROPOUT_P: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One visited key tile of the forward: the online-softmax update of (acc, m_i, l_i)."""
    k, v, s, keep, qk_scale = _key_scores(i, q, ctx, HAS_KPM, HAS_DOC, HAS_BAND, DROPOUT_P, BLOCK_N, PRECISION)
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s * qk_scale - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT_P > 0.0:
        p = tl.where(keep, p / (1.0 - DROPOUT_P), 0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_on,
    offsets_ptr, index_ptr, partial_ptr, lay_ptr, kpm_ptr, doc_ptr, seed_ptr,
    H, N, M_BLOCKS, LAY_BLOCK, BAND_R, BAND_LEN, TQ, qk_scale,
    HEAD_STRIDE: tl.constexpr, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, HAS_BAND: tl.constexpr,
    DROPOUT_P: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    LOOP_WHILE: tl.constexpr,
):  # fmt: skip
    qt = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hl = h * HEAD_STRIDE
    offs_m = qt * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(
        q_ptr + b * s_qb + h * s_qh + offs_m[:, None] * s_qn + offs_d[None, :],
        mask=(offs_m < N)[:, None] & d_ok[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    start = tl.load(offsets_ptr + hl * (TQ + 1) + qt)
    end = tl.load(offsets_ptr + hl * (TQ + 1) + qt + 1)
    ctx = (  # what every visited tile reads
        k_ptr, v_ptr, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, index_ptr, partial_ptr, lay_ptr, kpm_ptr, doc_ptr, seed_ptr,
        b, h, hl, bh, offs_m, offs_d, d_ok, N, M_BLOCKS, LAY_BLOCK, BAND_R, BAND_LEN, qk_scale
    )  # fmt: skip
    if LOOP_WHILE:  # the interpreter cannot take loaded loop bounds in range(); a GPU pipelines the for loop
        i = start
        while i < end:
            acc, m_i, l_i = _fwd_step(
                i, q, acc, m_i, l_i, ctx, HAS_KPM, HAS_DOC, HAS_BAND, DROPOUT_P, BLOCK_N, PRECISION
            )
            i += 1
    else:
        for i in range(start, end):
            acc, m_i, l_i = _fwd_step(
                i, q, acc, m_i, l_i, ctx, HAS_KPM, HAS_DOC, HAS_BAND, DROPOUT_P, BLOCK_N, PRECISION
            )
    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    row_ok = offs_m < N
    tl.store(
        o_ptr + b * s_ob + h * s_oh + offs_m[:, None] * s_on + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))
    tl.store(lse_ptr + bh * N + offs_m, lse, mask=row_ok)


@triton.jit
def _probs(q, k, lse, offs_m, offs_n, n0, b, hl, partial, N, kpm_ptr, doc_ptr, lay_ptr, M_BLOCKS, LAY_BLOCK, BAND_R,
           BAND_LEN,
           qk_scale, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, HAS_BAND: tl.constexpr, BLOCK_N: tl.constexpr,
           PRECISION: tl.constexpr):  # fmt: skip
    """fp32 [BM, BN]: the forward's softmax probabilities of this tile, recomputed from the saved log-sum-exp (0
    where not allowed, and in rows past N or with no key: their log-sum-exp is +inf)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    s = _masked(s, offs_m, offs_n, n0, b, hl, partial, N, kpm_ptr, doc_ptr, lay_ptr, M_BLOCKS, LAY_BLOCK, BAND_R,
                BAND_LEN, HAS_KPM, HAS_DOC, HAS_BAND, BLOCK_N)  # fmt: skip
    return tl.exp2(s * qk_scale - lse[:, None])


@triton.jit
def _query_rows(
    qt, q_ptr, do_ptr, lse_ptr, delta_ptr, s_qb, s_qh, s_qn, s_db, s_dh, s_dn, b, h, bh, offs_d, d_ok, N,
    BLOCK_M: tl.constexpr,
):  # fmt: skip
    """Query tile ``qt``'s rows for the backward: positions, row mask, Q, dO, log-sum-exp (+inf past N) and delta."""
    offs_m = qt * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < N
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + b * s_qb + h * s_qh + offs_m[:, None] * s_qn + offs_d[None, :], mask=q_mask, other=0.0)
    do = tl.load(do_ptr + b * s_db + h * s_dh + offs_m[:, None] * s_dn + offs_d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(lse_ptr + bh * N + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(delta_ptr + bh * N + offs_m, mask=row_ok, other=0.0)
    return offs_m, q_mask, q, do, lse, delta


@triton.jit
def _dkdv_step(
    i, k, v, dk, dv, ctx, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, HAS_BAND: tl.constexpr,
    DROPOUT_P: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One query tile visiting this key tile: its share of dK and dV."""
    (
        q_ptr, do_ptr, lse_ptr, delta_ptr, s_qb, s_qh, s_qn, s_db, s_dh, s_dn, index_ptr, partial_ptr, lay_ptr,
        kpm_ptr, doc_ptr, seed_ptr, b, h, hl, bh, offs_n, n0, offs_d, d_ok, N, M_BLOCKS, LAY_BLOCK, BAND_R, BAND_LEN,
        qk_scale
    ) = ctx  # fmt: skip
    qt = tl.load(index_ptr + i)
    partial = tl.load(partial_ptr + i)
    offs_m, q_mask, q, do, lse, delta = _query_rows(
        qt, q_ptr, do_ptr, lse_ptr, delta_ptr, s_qb, s_qh, s_qn, s_db, s_dh, s_dn, b, h, bh, offs_d, d_ok, N, BLOCK_M
    )  # fmt: skip
    p = _probs(q, k, lse, offs_m, offs_n, n0, b, hl, partial, N, kpm_ptr, doc_ptr, lay_ptr, M_BLOCKS, LAY_BLOCK,
               BAND_R, BAND_LEN,
               qk_scale, HAS_KPM, HAS_DOC, HAS_BAND, BLOCK_N, PRECISION)  # fmt: skip
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    if DROPOUT_P > 0.0:
        keep = _keep(seed_ptr, bh, offs_m, n0, N, DROPOUT_P, BLOCK_N)
        pd = tl.where(keep, p / (1.0 - DROPOUT_P), 0.0)
        dp = tl.where(keep, dp / (1.0 - DROPOUT_P), 0.0)
    else:
        pd = p
    dv += tl.dot(tl.trans(pd.to(do.dtype)), do, input_precision=PRECISION)
    ds = p * (dp - delta[:, None])
    dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _dq_step(
    i, q, do, lse, delta, dq, ctx, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, HAS_BAND: tl.constexpr,
    DROPOUT_P: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One visited key tile: its share of dQ."""
    k, v, s, keep, qk_scale = _key_scores(i, q, ctx, HAS_KPM, HAS_DOC, HAS_BAND, DROPOUT_P, BLOCK_N, PRECISION)
    p = tl.exp2(s * qk_scale - lse[:, None])  # the forward's probabilities (0 where not allowed or the row is empty)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    if DROPOUT_P > 0.0:
        dp = tl.where(keep, dp / (1.0 - DROPOUT_P), 0.0)
    ds = p * (dp - delta[:, None])
    return dq + tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)


@triton.jit
def bwd_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr,
    s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_db, s_dh, s_dn,
    offsets_ptr, index_ptr, partial_ptr, lay_ptr, kpm_ptr, doc_ptr, seed_ptr,
    H, N, M_BLOCKS, LAY_BLOCK, BAND_R, BAND_LEN, T, qk_scale, sm_scale,
    HEAD_STRIDE: tl.constexpr, HAS_KPM: tl.constexpr, HAS_DOC: tl.constexpr, HAS_BAND: tl.constexpr,
    DROPOUT_P: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    LOOP_WHILE: tl.constexpr, DQ_PASS: tl.constexpr,
):  # fmt: skip
    """The backward, one program per tile: ``DQ_PASS`` a query tile accumulating dQ over the key tiles it visits
    (the forward's CSR lists), else a key tile accumulating dK and dV over the query tiles that visit it (the
    transposed lists; ``T`` is the number of tiles of the program's kind)."""
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hl = h * HEAD_STRIDE
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    start = tl.load(offsets_ptr + hl * (T + 1) + t)
    end = tl.load(offsets_ptr + hl * (T + 1) + t + 1)
    if DQ_PASS:
        offs_m, q_mask, q, do, lse, delta = _query_rows(
            t, q_ptr, do_ptr, lse_ptr, delta_ptr, s_qb, s_qh, s_qn, s_db, s_dh, s_dn, b, h, bh, offs_d, d_ok, N, BLOCK_M
        )  # fmt: skip
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        ctx = (  # what every visited key tile reads
            k_ptr, v_ptr, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, index_ptr, partial_ptr, lay_ptr, kpm_ptr, doc_ptr,
            seed_ptr, b, h, hl, bh, offs_m, offs_d, d_ok, N, M_BLOCKS, LAY_BLOCK, BAND_R, BAND_LEN, qk_scale
        )  # fmt: skip
        if LOOP_WHILE:  # the interpreter cannot take loaded loop bounds in range(); a GPU pipelines the for loop
            i = start
            while i < end:
                dq = _dq_step(i, q, do, lse, delta, dq, ctx, HAS_KPM, HAS_DOC, HAS_BAND, DROPOUT_P, BLOCK_N, PRECISION)
                i += 1
        else:
            for i in range(start, end):
                dq = _dq_step(i, q, do, lse, delta, dq, ctx, HAS_KPM, HAS_DOC, HAS_BAND, DROPOUT_P, BLOCK_N, PRECISION)
        dq_ptrs = dq_ptr + bh * N * D + offs_m[:, None] * D + offs_d[None, :]
        tl.store(dq_ptrs, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=q_mask)
    else:
        n0 = t * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < N)[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + b * s_kb + h * s_kh + offs_n[:, None] * s_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + b * s_vb + h * s_vh + offs_n[:, None] * s_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        ctx = (  # what every visiting query tile reads
            q_ptr, do_ptr, lse_ptr, delta_ptr, s_qb, s_qh, s_qn, s_db, s_dh, s_dn, index_ptr, partial_ptr, lay_ptr,
            kpm_ptr, doc_ptr, seed_ptr, b, h, hl, bh, offs_n, n0, offs_d, d_ok, N, M_BLOCKS, LAY_BLOCK, BAND_R,
            BAND_LEN, qk_scale
        )  # fmt: skip
        if LOOP_WHILE:
            i = start
            while i < end:
                dk, dv = _dkdv_step(
                    i, k, v, dk, dv, ctx, HAS_KPM, HAS_DOC, HAS_BAND, DROPOUT_P, BLOCK_M, BLOCK_N, PRECISION
                )
                i += 1
        else:
            for i in range(start, end):
                dk, dv = _dkdv_step(
                    i, k, v, dk, dv, ctx, HAS_KPM, HAS_DOC, HAS_BAND, DROPOUT_P, BLOCK_M, BLOCK_N, PRECISION
                )
        kv_ptrs = bh * N * D + offs_n[:, None] * D + offs_d[None, :]
        tl.store(dk_ptr + kv_ptrs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(dv_ptr + kv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def bwd_preprocess(
    o_ptr, do_ptr, delta_ptr, s_ob, s_oh, s_on, s_db, s_dh, s_dn, H, N,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """``delta[b, h, n] = sum_d dO * O`` in fp32, one program per query tile: the backward's only temporary is this
    ``[B, H, N]`` fp32 (torch's ``(do.float() * o.float()).sum(-1)`` made three ``[B, H, N, D]`` fp32 ones)."""
    qt = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = qt * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < N
    mask = row_ok[:, None] & (offs_d < D)[None, :]
    o = tl.load(o_ptr + b * s_ob + h * s_oh + offs_m[:, None] * s_on + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(do_ptr + b * s_db + h * s_dh + offs_m[:, None] * s_dn + offs_d[None, :], mask=mask, other=0.0)
    tl.store(delta_ptr + bh * N + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=row_ok)
