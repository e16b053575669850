"""block_gather's permutation plan (fast path) for layouts where every query tile attends exactly one aligned key tile.

BlockBERT is the case that matters: with n chunks per head, query chunk i attends key chunk (i + k) mod n. Then no
token gather is needed, and one fused SDPA call covers every head:

- on CUDA, the encoder's q/k/v (slices of one ``[B, N, 3, H, D]`` projection) or one sequence: the chunks fold into
  SDPA's batch axis, ``[B*n, H, N/n, D]``, as views; the output is already the ``[B, N, H, D]`` memory the output
  projection reads. Shifted heads' K/V chunks move in one copy (:class:`_ChunkShift`), q with them when that frees the
  fused projection, so the training forward keeps dense's bytes (tests/test_saved_activations.py);
- on CPU, other inputs (contiguous ``[B, H, N, D]``), and calls with token masks, score biases or a fixed token
  mask: tiles ``[B, H*n, N/n, D]`` (g = head h, chunk i, a view), shifted heads' key tiles by one whole-tile
  permutation (:class:`_PermuteTiles`), which :func:`~.sdpa.sdpa_with_allow` hands to torch's CPU flash kernel as
  ``[B*H*n, 1, T, D]``, its fastest shape. On CPU the batch fold was 1.2-1.8x slower at N=3072 (issue #53): SDPA
  ran at H heads instead of one, and :class:`_ChunkShift` made one ``copy_`` per run of heads and chunk, each a
  parallel region (on a busy 2-core host a 0.5 MB copy took as long as a 9 MB one) plus transposing copies for
  contiguous inputs. :meth:`PermutationPlan._batch_fold` is the one place that chooses;
- a sequence shorter than the plan's grid (n x block does not divide N): the same chunks, the last ones cut to their
  real length, one SDPA call per (run of heads, query chunk) on views: no padded copy, no key mask
  (:meth:`PermutationPlan._run_ragged`).

Key padding, per-call token masks, the plan's fixed token mask, score biases and dropout go through the same
``sdpa_with_allow`` as the general path (masks and biases are gathered for the tiles), so results match ``dense``
in every case the general path handles. Those per-call masks and biases are tile-sized (``[B, G, T, T]``, as large as
the scores with a float bias): with any of them the call runs under :func:`~.gather.recomputed`, so they are made
again in the backward instead of being kept (DIET-REL with padding kept 3.1x the scores, packed documents 1.1x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.attention.band import tile_mask
from model.attention.kernels.block_gather.gather import recomputed
from model.attention.kernels.block_gather.tiles import host_mask, tile_allow, tiles_to_heads
from model.attention.kernels.registry import Call, same_document
from model.attention.kernels.sdpa import sdpa_with_allow
from model.cpu_shortcuts import takes_cpu_path


@dataclass
class PermutationPlan:
    """Tile g = h * n + i (head h, query chunk i) attends key tile ``tile_map[g]`` = h * n + map_h(i)."""

    tile: int  # T = N / n tokens per chunk
    chunks: int  # n
    tile_map: torch.Tensor | None  # [H * n] key tile of each query tile; None = identity (keys are a view)
    tile_unmap: torch.Tensor | None  # inverse of tile_map when it is a permutation (BlockBERT), else None
    head_G: torch.Tensor  # [H * n] head of each tile (for score biases / token masks)
    q_index_GQ: torch.Tensor  # [H * n, T] query token ids
    k_index_GK: torch.Tensor  # [H * n, T] key token ids
    token_mask_GQK: torch.Tensor | None  # the plan's fixed element mask inside the tiles
    density: float
    chunk_maps: torch.Tensor | None = None  # [H, n] key chunk of each head's query chunks; None = identity
    chunk_runs: tuple = ()  # ((h0, h1, map), ...): runs of consecutive heads with one chunk map (a tuple of n)

    def serves_length(self, seq_len: int) -> bool:
        """Whether this plan (made at ``n * tile`` tokens) computes a shorter sequence as it is, without padding: the
        same chunk boundaries, the last chunks' keys cut to their real length (:meth:`_run_ragged`). Not with a fixed
        token mask (its tiles are made for the full grid); the module pads then, and for per-call token masks and
        score biases."""
        return self.token_mask_GQK is None and 0 < seq_len <= self.chunks * self.tile

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        key_padding_mask_BN, token_mask, score_bias, _, _ = call
        N = q_BHND.shape[2]
        if N != self.chunks * self.tile:
            if not self.serves_length(N) or token_mask is not None or score_bias is not None:
                raise ValueError(
                    f"block_gather's BlockBERT plan is made for N={self.chunks * self.tile}; N={N} runs unpadded only "
                    "without a token mask or score bias (the attention module pads those calls)"
                )
            if call.doc_ids_BN is not None:
                return recomputed(lambda q, k, v: self._run_ragged(q, k, v, call), q_BHND, k_BHND, v_BHND)
            return self._run_ragged(q_BHND, k_BHND, v_BHND, call)
        if self._batch_fold(q_BHND, k_BHND, v_BHND, call):
            if call.doc_ids_BN is not None:
                return recomputed(lambda q, k, v: self._run_batch(q, k, v, call), q_BHND, k_BHND, v_BHND)
            return self._run_batch(q_BHND, k_BHND, v_BHND, call)
        tile_sized = token_mask is not None or score_bias is not None or call.doc_ids_BN is not None
        if tile_sized or (self.token_mask_GQK is not None and key_padding_mask_BN is not None):
            return recomputed(lambda q, k, v: self._run(q, k, v, call), q_BHND, k_BHND, v_BHND)
        return self._run(q_BHND, k_BHND, v_BHND, call)

    # -- tiles on SDPA's batch axis ---------------------------------------------------------------------------------
    def _batch_fold(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> bool:
        """Whether the chunks fold into SDPA's batch axis, ``[B*n, H, T, D]``, as views: one sequence (B = 1), or
        the encoder's q/k/v (slices of one ``[B, N, 3, H, D]`` projection: batch stride = N x token stride). Only
        key padding and documents are applied there (token masks, score biases and a fixed mask are tile-indexed:
        :meth:`_run`).

        Never on CPU (:func:`~model.cpu_shortcuts.takes_cpu_path`): the head-folded tiles are faster there (module
        docstring; ``python -m benchmarks.ab`` compares against a base commit). CUDA keeps the fold, chosen for its
        copies and bytes; its speed awaits the next GPU window."""
        if takes_cpu_path(q_BHND):
            return False
        if call.token_mask is not None or call.score_bias is not None or self.token_mask_GQK is not None:
            return False
        B, _, N, _ = q_BHND.shape
        return B == 1 or all(t.stride(0) == N * t.stride(2) for t in (q_BHND, k_BHND, v_BHND))

    def _run_batch(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        """Tile (b, i) of head h on SDPA's batch axis. Unshifted layouts: q, k, v are views and so is the output
        (``[B, N, H, D]`` memory on CUDA: what the output projection reads). With shifted heads, K and V get their
        key chunks in one copy each (:class:`_ChunkShift`: only the shifted heads move, the others are copied in
        place); when q shares its storage with k or v (the encoder's fused projection), q is copied with them, so
        that storage is freed and SDPA keeps three copies instead of the projection plus two (dense's bytes)."""
        key_padding_mask_BN, _, _, dropout_p, scale = call
        B, H, N, D = q_BHND.shape
        n, T = self.chunks, self.tile
        if self.chunk_maps is None:  # identity: views only
            q, k, v = (_fold_batch(t, n) for t in (q_BHND, k_BHND, v_BHND))
        else:
            copy_q = _slice_of_wider_rows(q_BHND)
            folded = _ChunkShift.apply(self.chunk_runs, n, copy_q, q_BHND if copy_q else None, k_BHND, v_BHND)
            q, k, v = folded if copy_q else (_fold_batch(q_BHND, n), *folded)
        allow = None
        if key_padding_mask_BN is not None:
            kp = key_padding_mask_BN.view(B, n, T)
            if self.chunk_maps is None:
                allow = kp.reshape(B * n, 1, 1, T)
            else:  # [B, n, H, T]: head h's key chunk of query chunk i
                allow = kp[:, self.chunk_maps.T].reshape(B * n, H, 1, T)
        if call.doc_ids_BN is not None:
            doc = call.doc_ids_BN.view(B, n, T)
            dk = doc.reshape(B * n, 1, T) if self.chunk_maps is None else doc[:, self.chunk_maps.T].reshape(B * n, H, T)
            same = same_document(doc.reshape(B * n, 1, T), dk)  # [B*n, 1|H, T, T]
            allow = same if allow is None else allow & same
        out = sdpa_with_allow(q, k, v, allow, None, dropout_p, scale, fold_tiles=True)  # [B*n, H, T, Dv]
        return out.unflatten(0, (B, n)).permute(0, 2, 1, 3, 4).reshape(B, H, N, out.shape[-1])

    # -- a sequence shorter than the plan: the same chunks, the last ones cut --------------------------------------
    def _run_ragged(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        """N < n x T: chunk i holds tokens ``[i*T, min((i+1)*T, N))`` (the chunks of the padded grid, so a model
        sees the pattern it trained with), and each (run of heads with one chunk map, query chunk) pair is one SDPA
        call on views of q/k/v against its key chunk cut to its real length: no padded copy, no key mask. The
        pieces are taken (:class:`_Pieces`: gradients written into one buffer per input, not one zero-filled
        full-size gradient per slice) and their outputs written into one ``[B, N, H, D]``-memory output
        (:class:`_Assemble`). Query rows whose key chunk is empty get zeros, as the padded plan gave them."""
        key_padding_mask_BN, _, _, dropout_p, scale = call
        B, H, N, D = q_BHND.shape
        Dv = v_BHND.shape[-1]
        pieces = self.ragged_pieces(N)
        q_specs = [(h0, h1, qs, ql) for h0, h1, qs, ql, _, kl in pieces if kl > 0]
        k_specs = [(h0, h1, ks, kl) for h0, h1, _, _, ks, kl in pieces if kl > 0]
        qs_ = _Pieces.apply(q_BHND, q_specs)
        ks_ = _Pieces.apply(k_BHND, k_specs)
        vs_ = _Pieces.apply(v_BHND, k_specs)
        outs = []
        for qp, kp_, vp, (_, _, qs, ql), (_, _, ks, kl) in zip(qs_, ks_, vs_, q_specs, k_specs):
            allow = None
            if key_padding_mask_BN is not None:
                allow = key_padding_mask_BN[:, None, None, ks : ks + kl]
            if call.doc_ids_BN is not None:
                d = call.doc_ids_BN
                same = same_document(d[:, qs : qs + ql], d[:, ks : ks + kl]).unsqueeze(1)
                allow = same if allow is None else allow & same
            outs.append(sdpa_with_allow(qp, kp_, vp, allow, None, dropout_p, scale))
        return _Assemble.apply((B, H, N, Dv), tuple(q_specs), *outs)

    def ragged_pieces(self, N: int) -> list[tuple[int, int, int, int, int, int]]:
        """``(h0, h1, q_start, q_len, k_start, k_len)`` per (run of heads with one chunk map, query chunk) at length
        ``N`` (query chunks with no real token left out; ``k_len`` 0: no real key, zeros)."""
        T = self.tile
        out = []
        for h0, h1, m in self.chunk_runs:
            for i, j in enumerate(m):
                ql = max(0, min(T, N - i * T))
                if ql:
                    out.append((h0, h1, i * T, ql, j * T, max(0, min(T, N - j * T))))
        return out

    def _run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        key_padding_mask_BN, token_mask, score_bias, dropout_p, scale = call
        B, H, N, D = q_BHND.shape
        Dv = v_BHND.shape[-1]
        n, T = self.chunks, self.tile
        G = H * n
        q = q_BHND.reshape(B, G, T, D)  # a view: query tiles are in place
        k = k_BHND.reshape(B, G, T, D)
        v = v_BHND.reshape(B, G, T, Dv)
        if self.tile_unmap is not None:  # a permutation of whole tiles: backward is the inverse permutation
            k = _PermuteTiles.apply(k, self.tile_map, self.tile_unmap)
            v = _PermuteTiles.apply(v, self.tile_map, self.tile_unmap)
        elif self.tile_map is not None:  # some key tile serves several query tiles: index_select (index_add backward)
            k = k.index_select(1, self.tile_map)
            v = v.index_select(1, self.tile_map)
        allow = None
        if key_padding_mask_BN is not None:
            kp = key_padding_mask_BN.view(B, 1, n, T).expand(B, H, n, T).reshape(B, G, 1, T)
            allow = kp if self.tile_map is None else kp.index_select(1, self.tile_map)
        allow = tile_allow(
            allow, token_mask, self.token_mask_GQK, self.head_G, self.q_index_GQ, self.k_index_GK, H, N, call.doc_ids_BN
        )
        bias = None if score_bias is None else score_bias.gather(self.head_G, self.q_index_GQ, self.k_index_GK)
        out = sdpa_with_allow(q, k, v, allow, bias, dropout_p, scale, fold_tiles=True)
        return tiles_to_heads(out, H, N)  # no .view: see there


def _fold_batch(x_BHND: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, H, N, D]`` -> ``[B*n, H, N/n, D]``, chunk i of sequence b at batch index b*n + i (a view for one sequence
    or the encoder's slices; :meth:`PermutationPlan._batch_fold`)."""
    B, H, N, D = x_BHND.shape
    return x_BHND.unflatten(2, (n, N // n)).transpose(1, 2).reshape(B * n, H, N // n, D)


def _slice_of_wider_rows(x_BHND: torch.Tensor) -> bool:
    """Whether a token's H x D values are a slice of a wider row (q of the encoder's fused ``[B, N, 3, H, D]``
    projection): then copying q lets that projection's storage go (read from strides: no storage query, which
    torch.compile would break on)."""
    return x_BHND.stride(3) == 1 and x_BHND.stride(2) > x_BHND.shape[1] * x_BHND.stride(1) >= x_BHND.shape[3]


def _chunk_spans(m: tuple) -> list[tuple[int, int, int]]:
    """``(i, j, count)``: query chunks i .. i+count-1 take key chunks j .. j+count-1 (consecutive runs of ``m``)."""
    spans: list[list[int]] = []
    for i, j in enumerate(m):
        if spans and spans[-1][1] + spans[-1][2] == j:
            spans[-1][2] += 1
        else:
            spans.append([i, j, 1])
    return [tuple(x) for x in spans]


def _copy_chunks(dst_BnTHD: torch.Tensor, src_BnTHD: torch.Tensor, runs: tuple, inverse: bool) -> None:
    """``dst[:, i, :, h] = src[:, m_h(i), :, h]`` for every run of heads (``inverse``: ``dst[:, m_h(i)] =
    src[:, i]``)."""
    for h0, h1, m in runs:
        for i, j, c in _chunk_spans(m):
            a, b = (j, i) if inverse else (i, j)
            dst_BnTHD[:, a : a + c, :, h0:h1].copy_(src_BnTHD[:, b : b + c, :, h0:h1])


class _ChunkShift(torch.autograd.Function):
    """K and V (and q, when ``copy_q``) copied into ``[B, n, T, H, D]`` memory with each head's key chunks in its
    query chunks' places, returned as ``[B*n, H, T, D]`` (the batch-folded tiles): one copy per tensor, unshifted
    heads copied as they are, and a backward that puts the gradients' chunks back in one copy (``_PermuteTiles``
    did this on the head-folded tiles of every head)."""

    @staticmethod
    def forward(ctx, runs: tuple, n: int, copy_q: bool, q, k, v):
        ctx.runs, ctx.n, ctx.copy_q = runs, n, copy_q
        outs = []
        for x, r in ((q, None), (k, runs), (v, runs)):
            if x is None:
                continue
            B, H, N, D = x.shape
            T = N // n
            src = x.unflatten(2, (n, T)).permute(0, 2, 3, 1, 4)  # [B, n, T, H, D] view
            dst = x.new_empty(B, n, T, H, D)
            if r is None:
                dst.copy_(src)
            else:
                _copy_chunks(dst, src, r, inverse=False)
            outs.append(dst.view(B * n, T, H, D).transpose(1, 2))
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        n, runs = ctx.n, ctx.runs
        out = []
        for g, r in zip(grads, ((None,) if ctx.copy_q else ()) + (runs, runs)):
            BN, H, T, D = g.shape
            B = BN // n
            g5 = g.transpose(1, 2).reshape(B, n, T, H, D)
            if r is not None:
                dst = g5.new_empty(B, n, T, H, D)
                _copy_chunks(dst, g5, r, inverse=True)
                g5 = dst
            out.append(g5.permute(0, 3, 1, 2, 4).reshape(B, H, n * T, D))
        if not ctx.copy_q:
            out.insert(0, None)
        return (None, None, None, *out)


class _Pieces(torch.autograd.Function):
    """Views ``x[:, h0:h1, s:s+ln]`` for ``specs`` ((h0, h1, s, ln), ...); the backward writes all their gradients into
    one buffer (autograd's own slice backward makes one zero-filled full-size gradient per slice)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, specs: tuple):
        ctx.specs, ctx.shape = specs, x.shape
        return tuple(x[:, h0:h1, s : s + ln] for h0, h1, s, ln in specs)

    @staticmethod
    def backward(ctx, *grads):
        B, H, N, D = ctx.shape
        specs = ctx.specs
        # runs partition the heads and a run's pieces start at distinct chunks: distinct (h0, s) do not overlap
        exact = len({(h0, s) for h0, _, s, _ in specs}) == len(specs)
        exact = exact and sum((h1 - h0) * ln for h0, h1, _, ln in specs) == H * N and all(g is not None for g in grads)
        dx = None
        for g, (h0, h1, s, ln) in zip(grads, specs):
            if g is None:
                continue
            if dx is None:  # every row written exactly once: no zero fill, no addition
                dx = g.new_empty(ctx.shape) if exact else g.new_zeros(ctx.shape)
            if exact:
                dx[:, h0:h1, s : s + ln].copy_(g)
            else:
                dx[:, h0:h1, s : s + ln] += g
        return dx, None


class _Assemble(torch.autograd.Function):
    """The pieces' outputs written into one ``[B, H, N, Dv]`` output in ``[B, N, H, Dv]`` memory (what the output
    projection reads as it is); rows no piece covers are zeros. Backward: views of the gradient."""

    @staticmethod
    def forward(ctx, shape: tuple, specs: tuple, *outs: torch.Tensor):
        B, H, N, Dv = shape
        ctx.specs = specs
        covered = sum((h1 - h0) * ln for h0, h1, _, ln in specs) == H * N
        buf = (outs[0].new_empty if covered else outs[0].new_zeros)(B, N, H, Dv)
        out = buf.transpose(1, 2)
        for o, (h0, h1, s, ln) in zip(outs, specs):
            out[:, h0:h1, s : s + ln].copy_(o)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (None, None, *(grad[:, h0:h1, s : s + ln] for h0, h1, s, ln in ctx.specs))


class _PermuteTiles(torch.autograd.Function):
    """``x.index_select(1, perm)`` whose backward is ``grad.index_select(1, inverse)``: one read and one write,
    instead of index_select's zero-filled buffer plus index_add."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, perm: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return x.index_select(1, perm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(1, inverse), None, None


def permutation_chunk_maps(lay_HMM: torch.Tensor, r: int) -> torch.Tensor | None:
    """``[H, M/r]`` key chunk of each query chunk if every query chunk (r blocks, identical rows) attends exactly
    one aligned chunk of r key blocks; else None."""
    H, M, _ = lay_HMM.shape
    Mq = M // r
    if Mq < 2:  # a single chunk is full attention: the general path handles it
        return None
    coarse = lay_HMM[:, ::r].reshape(H, Mq, Mq, r)  # [H, query chunk, key chunk, block in chunk]
    full = coarse.all(-1)
    if not bool((coarse.any(-1) == full).all()) or not bool((full.sum(-1) == 1).all()):
        return None
    return full.to(torch.int64).argmax(-1)


def make_permutation_plan(
    lay_HMM: torch.Tensor, r: int, block: int, seq_len: int, device, token_mask: torch.Tensor | None
) -> PermutationPlan | None:
    maps = permutation_chunk_maps(lay_HMM, r)
    if maps is None:
        return None
    H, n = maps.shape
    T = r * block
    ar = torch.arange(T)
    head = torch.arange(H).repeat_interleave(n)
    tile_map = (torch.arange(H)[:, None] * n + maps).reshape(-1)
    q_index = (torch.arange(n)[:, None] * T + ar).repeat(H, 1)
    k_index = maps.reshape(-1)[:, None] * T + ar
    tm = None if token_mask is None else tile_mask(host_mask(token_mask), head, q_index, k_index).to(device)
    identity = torch.equal(tile_map, torch.arange(H * n))
    bijective = torch.equal(tile_map.sort().values, torch.arange(H * n))
    runs: list[tuple[int, int, tuple]] = []
    for h, m in enumerate(tuple(int(j) for j in row) for row in maps):
        if runs and runs[-1][2] == m:
            runs[-1] = (runs[-1][0], h + 1, m)
        else:
            runs.append((h, h + 1, m))
    return PermutationPlan(
        tile=T,
        chunks=n,
        tile_map=None if identity else tile_map.to(device),
        tile_unmap=torch.argsort(tile_map).to(device) if bijective and not identity else None,
        head_G=head.to(device),
        q_index_GQ=q_index.to(device),
        k_index_GK=k_index.to(device),
        token_mask_GQK=tm,
        density=float(lay_HMM.float().mean()),
        chunk_maps=None if identity else maps.to(device),
        chunk_runs=tuple(runs),
    )
