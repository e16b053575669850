"""block_gather's split plan, a CPU optimisation: a layout cut into up to three pieces, each computed the cheap
way, merged exactly.

The general gather path hands every query tile its own gathered copy of every key block it attends: key blocks
that all rows attend (global columns of Fixed, BigBird, BSLongformer, Variable) are copied once per tile (Fixed,
block 16, N=4096: 13x the K/V), and sliding windows are gathered token by token for short 1-block tiles. Here the
plan (made once per layout, length and device) splits the layout into

- piece A, *shared* key blocks (attended by every row of a head): all N queries against them in one SDPA call; q
  is the input itself, K/V of those blocks one small gather;
- piece W, a *window* around the diagonal: query tiles of r blocks (r picked by an estimated cost), each against the
  key blocks ``[t*r - a, (t+1)*r + b)``. q, k and v are *views* (overlapping strided windows for k/v, no copy); the
  layout's holes inside the windows (and a fixed token mask) are an element mask, so taller tiles trade some
  masked compute for fewer, larger SDPA problems. Tiles whose window would leave the sequence are left to piece R;
- piece R, the *rest* (random blocks, global rows, edge tiles): the general gather plan, without the tiles that
  have nothing left.

The partial softmaxes are merged with their logsumexps (torch's CPU flash kernel returns them):
``lse = logaddexp(lse_A, lse_W, lse_R)``, ``out = sum_i out_i exp(lse_i - lse)``. Backward, as ring attention does
it: each piece's flash backward is called with the MERGED output and logsumexp and the global ``grad_out``; that
is the exact gradient of that piece's q/k/v, because the backward only uses them through ``P = exp(S - lse)`` (the
merged probabilities of the piece's keys) and ``D = rowsum(dO * O)`` (the merged output). Rows with no allowed key
in a piece get ``lse = -inf`` there (the CPU kernel itself reports 0 for them); rows with no key in any piece give
zeros and zero gradients.

Scope: CPU, no attention dropout, no score bias, no document mask (packed sequences): those calls use the plan's
``fallback`` (the ordinary gather plan
of the whole layout). Key padding, per-call token masks and the plan's fixed token mask work. It relies on private
aten ops (torch's CPU flash forward/backward with logsumexp) and on cost constants measured on one machine (see
docs/model.md), so it can be turned off: ``SPARSEBERT_CPU_SPLIT=0`` makes block_gather use the general gather plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from model.attention.band import BandMask, tile_mask
from model.attention.kernels.block_gather.gather import make_gather_plan
from model.attention.kernels.block_gather.tiles import host_mask, query_tile_factor, tile_allow
from model.attention.kernels.registry import Call
from model.cpu_shortcuts import takes_cpu_path

SWITCH = "SPARSEBERT_CPU_SPLIT"
"""Environment variable: ``0`` turns the split plan off (block_gather then uses the general gather plan)."""


def cpu_split_enabled() -> bool:
    """Whether block_gather may pick the split plan: the private aten ops exist and the switch is not off."""
    value = os.environ.get(SWITCH, "1").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on"):
        raise ValueError(f"{SWITCH}={value!r}: use 1 (split plan allowed, the default) or 0 (general gather plan)")
    return _HAVE_CPU_FLASH and value in ("1", "true", "on")


# torch's CPU flash kernel with its logsumexp (internal aten ops; present in the pinned torch): without them, no split
_HAVE_CPU_FLASH = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")
_flash_fwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_flash_bwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)

# cost model for picking the window tile height (score elements; measured on the 2-core box: CPU flash runs
# 64-row tiles ~1.6x slower per score than 128+-row tiles, and a gathered key row costs about as much as scoring
# it against 32 more query rows: copy + index_add backward)
_TILE_OVERHEAD_ROWS = 48
_GATHER_ROWS = 128
# every piece also costs a pass over its rows (logsumexp, D = rowsum(dO * O), the merge): about as much as scoring
# this many more keys per row (measured: Fixed, block 64, N=1024 runs faster unsplit, N=2048 faster split)
_PIECE_ROW_KEYS = 192
_MAX_TILE = 512


@dataclass
class WindowPiece:
    """Query tiles t0 .. t0+nt-1 of ``tile`` rows; tile t attends tokens ``[k_start + t'*tile, + width)``,
    t' = t - t0, minus ``mask`` (bool ``[H|1, nt|1, tile, width]``, None = all allowed)."""

    r: int  # query blocks per tile
    tile: int
    t0: int
    nt: int
    k_start: int  # first key token of tile t0's window
    width: int  # key tokens per window
    nblocks: int  # key blocks per window
    block: int
    mask: torch.Tensor | None


@dataclass
class RestPiece:
    """The general gather plan of what is left, restricted to the tiles that have keys left."""

    plan: object  # GatherPlan (its K=0 group, if any, is skipped)
    groups: list  # plan.groups with K > 0
    tiles: torch.Tensor  # [P] tile ids (in plan.tile units, head-major) of those groups' tiles, in group order
    flat_index: torch.Tensor  # their gathered key rows


@dataclass
class SplitPlan:
    shared_index_HS: torch.Tensor | None  # [H, S] key token ids of each head's shared blocks (piece A)
    shared_same: bool  # all heads share the same blocks (piece A's K/V: one index_select on the token axis)
    shared_flat: torch.Tensor | None  # [H * S] rows of k.reshape(B, H*N, D) for piece A
    token_mask_HNS: torch.Tensor | None  # the plan's fixed token mask restricted to piece A's keys
    window: WindowPiece | None
    rest: RestPiece | None
    fallback: object  # GatherPlan of the whole layout: dropout, score biases, non-CPU devices
    density: float

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        key_padding_mask_BN, token_mask, score_bias, dropout_p, scale = call
        if dropout_p == 0.0 and score_bias is None and call.doc_ids_BN is None and takes_cpu_path(q_BHND):
            return split_attention(q_BHND, k_BHND, v_BHND, self, key_padding_mask_BN, token_mask, scale)
        return self.fallback.run(q_BHND, k_BHND, v_BHND, call)


def shared_blocks(lay_HMM: torch.Tensor) -> torch.Tensor | None:
    """``[H, s]`` key blocks that every query block row of each head attends (the first s of each head, s the
    smallest count over heads, so all heads batch into one call); None if some head has none."""
    full_HM = lay_HMM.all(1)
    s = int(full_HM.sum(-1).min())
    if s == 0:
        return None
    return torch.stack([row.nonzero().squeeze(1)[:s] for row in full_HM])


def _band(lay_HMM: torch.Tensor) -> tuple[int, int] | None:
    """(a, b): the widest run of diagonals -a..b around the main one that are on for >= 80% of their rows on
    every head (edge rows, global rows and holes left by the shared blocks are handled by piece R)."""
    H, M, _ = lay_HMM.shape

    def on(o: int) -> bool:
        d = torch.diagonal(lay_HMM, offset=o, dim1=1, dim2=2)
        return d.shape[-1] > 0 and bool((d.float().mean(-1) >= 0.8).all())

    if not on(0):
        return None
    a = b = 0
    while a + 1 < M and on(-(a + 1)):
        a += 1
    while b + 1 < M and on(b + 1):
        b += 1
    return a, b


def _tile_cost(rows: int, keys: int) -> float:
    return rows * keys * (1 + _TILE_OVERHEAD_ROWS / rows)


def _rest_cost(rest_HMM: torch.Tensor, block: int) -> float:
    if not bool(rest_HMM.any()):
        return 0.0
    r = query_tile_factor(rest_HMM)
    keys = rest_HMM[:, ::r].sum(-1).flatten() * block  # per tile
    keys = keys[keys > 0].double()
    per_key = r * block * (1 + _TILE_OVERHEAD_ROWS / (r * block)) + _GATHER_ROWS
    return float((keys * per_key).sum()) + keys.numel() * r * block * _PIECE_ROW_KEYS


def _window_candidate(rest: torch.Tensor, r: int, a: int, b: int):
    """Tiles of r blocks against windows [t*r - a, (t+1)*r + b): the block pattern P [r, r+a+b] that most tiles
    have (each element on in >= 80% of the in-range tiles), and the longest run of tiles that contain P on every
    head. Returns (t0, nt, P, rest without P in those tiles) or None."""
    H, M, _ = rest.shape
    lo = -(-a // r)
    hi = (M - b) // r
    if hi - lo < 1:
        return None
    nb = r + a + b
    tiles = torch.arange(lo, hi)
    rows = tiles[:, None] * r + torch.arange(r)  # [n, r]
    cols = tiles[:, None] * r - a + torch.arange(nb)  # [n, nb]
    blk = rest[:, rows[:, :, None], cols[:, None, :]]  # [H, n, r, nb]
    P = blk.float().mean((0, 1)) >= 0.8
    if not bool(P.any()):
        return None
    good = (blk | ~P).flatten(2).all(-1).all(0).tolist()  # [n]
    best_len = best_at = run = 0
    for i, g in enumerate(good):
        run = run + 1 if g else 0
        if run > best_len:
            best_len, best_at = run, i - run + 1
    if best_len == 0:
        return None
    t0, nt = lo + best_at, best_len
    left = rest.clone()
    sub = left[:, rows[best_at : best_at + nt, :, None], cols[best_at : best_at + nt, None, :]]
    left[:, rows[best_at : best_at + nt, :, None], cols[best_at : best_at + nt, None, :]] = sub & ~P
    return t0, nt, P, left


def _squeeze_same(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    for d in dims:
        if x.shape[d] > 1 and bool((x == x.narrow(d, 0, 1)).all()):
            x = x.narrow(d, 0, 1)
    return x


def make_split_plan(
    lay_HMM: torch.Tensor, block: int, seq_len: int, device, token_mask: torch.Tensor | None
) -> SplitPlan | None:
    """None when neither a shared block nor a window piece would save work (then the plain gather plan runs)."""
    lay = lay_HMM.cpu().bool()
    H, M, _ = lay.shape
    if M < 2 or not _HAVE_CPU_FLASH:
        return None
    tmc = None if token_mask is None else host_mask(token_mask)
    cols_HS = shared_blocks(lay)
    rest = lay
    idx = None
    if cols_HS is not None:
        rest = lay & ~torch.zeros_like(lay).scatter_(2, cols_HS[:, None, :].expand(H, M, -1), True)
        idx = (cols_HS[..., None] * block + torch.arange(block)).reshape(H, -1)
    N = M * block
    plain_cost = _rest_cost(lay, block)  # the ordinary gather plan: one piece
    shared_cost = 0.0 if idx is None else H * N * (idx.shape[1] * (1 + _TILE_OVERHEAD_ROWS / N) + _PIECE_ROW_KEYS)
    # window piece: the tile height with the smallest estimated cost (or none)
    best_cost = _rest_cost(rest, block)
    best = None
    band = _band(lay)  # the window structure of the layout (holes left by the shared blocks become mask)
    for a, b in [] if band is None else sorted({band, (0, 0)}):  # the band, or aligned diagonal tiles only
        for r in (d for d in range(1, M // 2 + 1) if M % d == 0 and d * block <= _MAX_TILE):  # >= 2 tiles
            cand = _window_candidate(rest, r, a, b)
            if cand is None:
                continue
            t0, nt, P, left = cand
            cost = H * nt * (_tile_cost(r * block, (r + a + b) * block) + r * block * _PIECE_ROW_KEYS) + _rest_cost(
                left, block
            )
            if cost < best_cost:
                best_cost, best = cost, (r, a, b, t0, nt, P, left)
    if (idx is None and best is None) or shared_cost + best_cost >= plain_cost:
        return None
    window = None
    if best is not None:
        r, a, b, t0, nt, P, rest = best
        T, nb = r * block, r + a + b
        W = nb * block
        k_start = (t0 * r - a) * block
        mask = P.repeat_interleave(block, 0).repeat_interleave(block, 1)[None, None]  # [1, 1, T, W]
        if tmc is not None:  # window tile t: query rows (t0 + t) * T + [0, T), keys k_start + t * T + [0, W)
            Ht = 1 if isinstance(tmc, BandMask) or tmc.dim() < 3 else tmc.shape[0]
            t = torch.arange(nt)
            q_idx = ((t0 + t)[:, None] * T + torch.arange(T)).repeat(Ht, 1)
            k_idx = (k_start + t[:, None] * T + torch.arange(W)).repeat(Ht, 1)
            heads = torch.arange(Ht).repeat_interleave(nt)
            mask = mask & tile_mask(tmc, heads, q_idx, k_idx).view(Ht, nt, T, W)
        mask = _squeeze_same(mask, (0, 1))
        window = WindowPiece(
            r=r,
            tile=T,
            t0=t0,
            nt=nt,
            k_start=k_start,
            width=W,
            nblocks=nb,
            block=block,
            mask=None if bool(mask.all()) else mask.to(device),
        )
    rest_piece = None
    if bool(rest.any()):
        gp = make_gather_plan(rest, block, seq_len, device, token_mask)
        keep = [g for g in gp.groups if g.k_index_GK.shape[1] > 0]
        order = gp.perm.cpu() if gp.perm is not None else torch.arange(gp.num_tiles)
        skip = sum(g.k_index_GK.shape[0] for g in gp.groups if g.k_index_GK.shape[1] == 0)
        rest_piece = RestPiece(plan=gp, groups=keep, tiles=order[skip:].to(device), flat_index=gp.flat_index)
    tm_a = None
    if idx is not None and tmc is not None:
        tm_a = tile_mask(tmc, torch.arange(H), torch.arange(seq_len).expand(H, -1), idx)
        tm_a = _squeeze_same(tm_a, (0,)).to(device)
    same = idx is not None and bool((idx == idx[:1]).all())
    return SplitPlan(
        shared_index_HS=None if idx is None else idx.to(device),
        shared_same=same,
        shared_flat=None if idx is None else (torch.arange(H)[:, None] * seq_len + idx).reshape(-1).to(device),
        token_mask_HNS=tm_a,
        window=window,
        rest=rest_piece,
        fallback=make_gather_plan(lay, block, seq_len, device, token_mask),
        density=float(lay.float().mean()),
    )


# ---------------------------------------------------------------------------------------------------------------
# execution


def _swap(x: torch.Tensor | None) -> torch.Tensor | None:
    """``[1, G, ...]`` <-> ``[G, 1, ...]`` (a view): CPU flash runs faster with the tiles on its batch axis."""
    return None if x is None else x.transpose(0, 1)


def _same(x):
    return x


def _additive(allow: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if allow is None:
        return None
    return torch.zeros(allow.shape, dtype=dtype, device=allow.device).masked_fill_(~allow, float("-inf"))


def _fwd(q, k, v, mask, row_any, scale, fold=True):
    """Flash forward on ``[B, G, T, D]`` -> (out, lse); lse = -inf where ``row_any`` says no key is allowed."""
    f = _swap if fold and q.shape[0] == 1 else _same
    out, lse = _flash_fwd(f(q), f(k), f(v), 0.0, False, attn_mask=f(mask), scale=scale)
    out, lse = f(out), f(lse)
    if row_any is not None:
        lse = lse.masked_fill(~row_any, float("-inf"))
    return out, lse


def _bwd(dout, q, k, v, out, lse, mask, scale, fold=True):
    f = _swap if fold and q.shape[0] == 1 else _same
    g = _flash_bwd(f(dout), f(q), f(k), f(v), f(out), f(lse), 0.0, False, attn_mask=f(mask), scale=scale)
    return tuple(f(t) for t in g)


def _window_views(x_XND: torch.Tensor, w: WindowPiece, keys: bool) -> torch.Tensor:
    """``[X, N, D]`` (row stride D) -> query tiles ``[X, nt, T, D]`` or overlapping key windows ``[X, nt, W, D]``."""
    X, N, D = x_XND.shape
    s0, s1, s2 = x_XND.stride()
    start = w.k_start if keys else w.t0 * w.tile
    return x_XND.as_strided(
        (X, w.nt, w.width if keys else w.tile, D), (s0, w.tile * s1, s1, s2), x_XND.storage_offset() + start * s1
    )


def _group_slices(rp: RestPiece) -> list[tuple[slice, slice]]:
    """Per group of piece R: its slice of ``rp.tiles`` and of ``rp.flat_index``."""
    out, t, f = [], 0, 0
    for g in rp.groups:
        G, K = g.k_index_GK.shape
        out.append((slice(t, t + G), slice(f, f + G * K)))
        t, f = t + G, f + G * K
    return out


def _gather_pieces(plan: SplitPlan, q, k, v):
    """Piece A's K/V and piece R's q tiles and K/V (copies; their gradients are added back in place)."""
    B, H, N, D = q.shape
    Dv = v.shape[-1]
    kA = vA = qR = kR = vR = None
    if plan.shared_index_HS is not None:
        S = plan.shared_index_HS.shape[1]
        if plan.shared_same:
            kA = k.index_select(2, plan.shared_index_HS[0])
            vA = v.index_select(2, plan.shared_index_HS[0])
        else:
            kA = k.reshape(B, H * N, D).index_select(1, plan.shared_flat).view(B, H, S, D)
            vA = v.reshape(B, H * N, Dv).index_select(1, plan.shared_flat).view(B, H, S, Dv)
    rp = plan.rest
    if rp is not None:
        qR = q.reshape(B, -1, rp.plan.tile, D).index_select(1, rp.tiles)
        kR = k.reshape(B, H * N, D).index_select(1, rp.flat_index)
        vR = v.reshape(B, H * N, Dv).index_select(1, rp.flat_index)
    return kA, vA, qR, kR, vR


class _SplitAttention(torch.autograd.Function):
    """The pieces and their merge, forward and backward, on the full q/k/v (pieces A and W read them as views; the
    gathers of A and R are done here, and their gradients are index_add-ed into one dq/dk/dv in place, so the
    backward allocates no zero-filled buffer per gather and no sum of per-piece gradients)."""

    @staticmethod
    def forward(ctx, meta, q, k, v):
        plan, scale = meta["plan"], meta["scale"]
        B, H, N, D = q.shape
        Dv = v.shape[-1]
        neg = float("-inf")
        kA, vA, qR, kR, vR = _gather_pieces(plan, q, k, v)
        pieces = []  # (name, out in its own shape, lse as [B, H, N] with -inf where not covered)
        if kA is not None:
            mask, row_any = meta["A"]
            oA, lseA = _fwd(q, kA, vA, mask, row_any, scale)
            pieces.append(("A", oA, lseA))
        w = plan.window
        q3 = k3 = v3 = None
        if w is not None:  # [B*H, N, D]: views of contiguous inputs, else copies (kept for the backward)
            q3, k3, v3 = meta["xw"](q), meta["xw"](k), meta["xw"](v)
            mask, row_any = meta["W"]
            oW, lseW = _fwd(
                _window_views(q3, w, False),
                _window_views(k3, w, True),
                _window_views(v3, w, True),
                mask,
                row_any,
                scale,
                fold=False,
            )  # [BH, nt, T, *]
            full = lseW.new_full((B * H, N), neg)
            full[:, w.t0 * w.tile : (w.t0 + w.nt) * w.tile] = lseW.reshape(B * H, -1)
            pieces.append(("W", oW, full.view(B, H, N)))
        rp = plan.rest
        if rp is not None:
            TR = rp.plan.tile
            full = None
            outs = []
            for g, (ts, fs), (mask, row_any) in zip(rp.groups, _group_slices(rp), meta["R"]):
                G, K = g.k_index_GK.shape
                o, lse_g = _fwd(
                    qR[:, ts], kR[:, fs].view(B, G, K, D), vR[:, fs].view(B, G, K, Dv), mask, row_any, scale
                )
                if full is None:
                    full = lse_g.new_full((B, rp.plan.num_tiles, TR), neg)
                full.index_copy_(1, rp.tiles[ts], lse_g)
                outs.append(o)
            pieces.append(("R", outs, full.view(B, H, N)))
        lse = pieces[0][2]
        for p in pieces[1:]:
            lse = torch.logaddexp(lse, p[2])
        lse = lse.masked_fill(torch.isneginf(lse), 0.0)  # rows with no key anywhere: all weights 0, P = 0
        acc = torch.promote_types(q.dtype, lse.dtype)
        out = None
        for name, o, lse_p in pieces:
            wgt = torch.exp(lse_p - lse)
            if name == "A":  # first, covers every row: the product is the (contiguous) accumulator
                out = torch.mul(o, wgt.unsqueeze(-1), out=q.new_empty(B, H, N, Dv, dtype=acc))
                continue
            if out is None:
                out = q.new_zeros(B, H, N, Dv, dtype=acc)
            if name == "W":
                rows = slice(w.t0 * w.tile, (w.t0 + w.nt) * w.tile)
                out[:, :, rows] += o.reshape(B, H, -1, Dv) * wgt[:, :, rows].unsqueeze(-1)
            else:
                TR = rp.plan.tile
                wt = wgt.view(B, -1, TR)
                out_t = out.view(B, -1, TR, Dv)
                for og, (ts, _) in zip(o, _group_slices(rp)):
                    tiles = rp.tiles[ts]
                    out_t.index_add_(1, tiles, og * wt.index_select(1, tiles).unsqueeze(-1))
        out = out.to(q.dtype)
        ctx.meta = meta
        ctx.save_for_backward(q, k, v, kA, vA, qR, kR, vR, out, lse, q3, k3, v3)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, kA, vA, qR, kR, vR, out, lse, q3, k3, v3 = ctx.saved_tensors
        meta = ctx.meta
        plan, scale = meta["plan"], meta["scale"]
        B, H, N, D = q.shape
        Dv = v.shape[-1]
        dout = dout.contiguous()
        dq = None
        dk = k.new_zeros(B, H, N, D)
        dv = v.new_zeros(B, H, N, Dv)
        if kA is not None:
            dq, dkA, dvA = _bwd(dout, q, kA, vA, out, lse, meta["A"][0], scale)
            dq = dq.contiguous()
            if plan.shared_same:
                dk.index_add_(2, plan.shared_index_HS[0], dkA)
                dv.index_add_(2, plan.shared_index_HS[0], dvA)
            else:
                dk.view(B, H * N, D).index_add_(1, plan.shared_flat, dkA.reshape(B, -1, D))
                dv.view(B, H * N, Dv).index_add_(1, plan.shared_flat, dvA.reshape(B, -1, Dv))
        if dq is None:
            dq = q.new_zeros(B, H, N, D)
        w = plan.window
        if w is not None:
            rows = slice(w.t0 * w.tile, (w.t0 + w.nt) * w.tile)
            shp = (B * H, w.nt, w.tile)
            gq, gk, gv = _bwd(
                dout.view(B * H, N, Dv)[:, rows].view(*shp, Dv),
                _window_views(q3, w, False),
                _window_views(k3, w, True),
                _window_views(v3, w, True),
                out.view(B * H, N, Dv)[:, rows].view(*shp, Dv),
                lse.view(B * H, N)[:, rows].view(shp),
                meta["W"][0],
                scale,
            )
            dq.view(B * H, N, D)[:, rows] += gq.reshape(B * H, -1, D)
            for j in range(w.nblocks):  # overlapping windows: add each key block of the windows back in place
                sl = slice(j * w.block, (j + 1) * w.block)
                for acc, g, E in ((dk, gk, D), (dv, gv, Dv)):
                    acc.view(B * H, N, E).as_strided(
                        (B * H, w.nt, w.block, E), (N * E, w.tile * E, E, 1), (w.k_start + j * w.block) * E
                    ).add_(g[:, :, sl])
        rp = plan.rest
        if rp is not None:
            TR = rp.plan.tile
            d_t, o_t, l_t = dout.view(B, -1, TR, Dv), out.view(B, -1, TR, Dv), lse.view(B, -1, TR)
            dq_t = dq.view(B, -1, TR, D)
            dk_f, dv_f = dk.view(B, H * N, D), dv.view(B, H * N, Dv)
            for g, (ts, fs), (mask, _) in zip(rp.groups, _group_slices(rp), meta["R"]):
                G, K = g.k_index_GK.shape
                tiles, flat = rp.tiles[ts], rp.flat_index[fs]
                gq, gk, gv = _bwd(
                    d_t.index_select(1, tiles),
                    qR[:, ts],
                    kR[:, fs].view(B, G, K, D),
                    vR[:, fs].view(B, G, K, Dv),
                    o_t.index_select(1, tiles),
                    l_t.index_select(1, tiles),
                    mask,
                    scale,
                )
                dq_t.index_add_(1, tiles, gq)
                dk_f.index_add_(1, flat, gk.reshape(B, G * K, D))
                dv_f.index_add_(1, flat, gv.reshape(B, G * K, Dv))
        return None, dq, dk, dv


def _fold_bh(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, D]`` -> ``[B*H, N, D]`` with unit row stride in D (a view when possible, else a copy)."""
    B, H, N, D = x.shape
    if x.stride(3) == 1 and (B == 1 or x.stride(0) == H * x.stride(1)):
        return x.as_strided((B * H, N, D), (x.stride(1), x.stride(2), 1), x.storage_offset())
    return x.contiguous().view(B * H, N, D)


def _window_allow(plan: SplitPlan, B: int, H: int, N: int, key_padding_mask_BN, token_mask):
    """The window piece's allow mask as ``[B*H|1, nt|1, T|1, W]`` (None = all allowed)."""
    w = plan.window
    allow = None if w.mask is None else w.mask.unsqueeze(0)  # [1, H|1, nt|1, T, W]
    if key_padding_mask_BN is not None:
        kp = key_padding_mask_BN
        kw = kp.as_strided(
            (B, w.nt, w.width),
            (kp.stride(0), w.tile * kp.stride(1), kp.stride(1)),
            kp.storage_offset() + w.k_start * kp.stride(1),
        )[:, None, :, None, :]
        allow = kw if allow is None else allow & kw
    if token_mask is not None:
        tm = token_mask
        while tm.dim() < 3:
            tm = tm.unsqueeze(0)
        s0, s1, s2 = tm.stride()
        tw = tm.as_strided(
            (tm.shape[0], w.nt, w.tile, w.width),
            (s0, w.tile * s1 + w.tile * s2, s1, s2),
            tm.storage_offset() + w.t0 * w.tile * s1 + w.k_start * s2,
        ).unsqueeze(0)
        allow = tw if allow is None else allow & tw
    if allow is None:
        return None
    if allow.shape[0] == 1 and allow.shape[1] == 1:
        return allow[0]
    return allow.expand(B, H, *allow.shape[2:]).reshape(B * H, *allow.shape[2:])


def split_attention(
    q_BHND: torch.Tensor,
    k_BHND: torch.Tensor,
    v_BHND: torch.Tensor,
    plan: SplitPlan,
    key_padding_mask_BN: torch.Tensor | None,
    token_mask: torch.Tensor | None,
    scale: float | None,
) -> torch.Tensor:
    B, H, N, D = q_BHND.shape
    dtype = q_BHND.dtype
    meta = {"plan": plan, "scale": scale, "xw": _fold_bh}
    if plan.shared_index_HS is not None:  # piece A: all queries against the shared blocks
        S = plan.shared_index_HS.shape[1]
        allow = None
        if key_padding_mask_BN is not None:
            allow = (
                key_padding_mask_BN[:, plan.shared_index_HS[0]]
                if plan.shared_same
                else key_padding_mask_BN[:, plan.shared_index_HS]
            ).view(B, -1, 1, S)
        if token_mask is not None:
            tm = token_mask
            while tm.dim() < 3:
                tm = tm.unsqueeze(0)
            tm = tm.expand(H, N, N).gather(2, plan.shared_index_HS[:, None, :].expand(H, N, S)).unsqueeze(0)
            allow = tm if allow is None else allow & tm
        if plan.token_mask_HNS is not None:
            tm = plan.token_mask_HNS.unsqueeze(0)
            allow = tm if allow is None else allow & tm
        meta["A"] = (_additive(allow, dtype), None if allow is None else allow.any(-1))
    if plan.window is not None:
        allow = _window_allow(plan, B, H, N, key_padding_mask_BN, token_mask)
        row_any = None
        if allow is not None:
            row_any = allow.any(-1)
            if not bool(row_any.all()):
                row_any = row_any.expand(B * H, plan.window.nt, plan.window.tile)
            else:
                row_any = None
        meta["W"] = (_additive(allow, dtype), row_any)
    rp = plan.rest
    if rp is not None:  # piece R: the general gather plan of what is left
        masks = []
        for g in rp.groups:
            G, K = g.k_index_GK.shape
            allow = None
            if key_padding_mask_BN is not None:
                allow = key_padding_mask_BN[:, g.k_index_GK].view(B, G, 1, K)
            allow = tile_allow(allow, token_mask, g.token_mask_GQK, g.head_G, g.q_index_GQ, g.k_index_GK, H, N)
            masks.append((_additive(allow, dtype), None if allow is None else allow.any(-1)))
        meta["R"] = masks
    return _SplitAttention.apply(meta, q_BHND, k_BHND, v_BHND)
