"""``flex``: torch FlexAttention with a BlockMask built from the layout (Triton on CUDA; eager inference on CPU)."""

from __future__ import annotations

import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from model.attention.band import BandMask, dense_mask
from model.attention.kernels.flex_mask import SPARSE_BLOCK, _grouped_any_all, layout_block_mask
from model.attention.kernels.registry import Call, Kernel, register_kernel

MIN_CAPABILITY = (8, 0)
"""Below it an explicit ``flex`` is refused: Triton has no tensor-core (MMA) path for sm < 80, and FlexAttention runs
about 10x slower than SDPA on a V100 (attention-gym issue 21); ``auto`` never picks flex there."""
COMPILE_BACKEND = "inductor"
"""torch.compile backend of the CUDA path (tests use "eager" to count Dynamo's compilations on CPU)."""
_compiled_flex: dict[tuple, Callable] = {}


def _flex_call(q, k, v, score_mod, block_mask, scale, kernel_options=None):
    return flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, kernel_options=kernel_options
    )


def _flex_fn(device_type: str, bucket: tuple) -> Callable:
    """Eager FlexAttention on CPU (inference only); elsewhere one compiled callable per ``bucket`` (shapes, dtype,
    grad mode, which masks and bias), each compiled from its own copy of :func:`_flex_call`'s code object.

    Why: Dynamo counts recompilations per code object and, past ``recompile_limit`` (8), runs the frame eagerly:
    for FlexAttention that is the unfused path that materialises every score, silently. With one shared compiled
    callable (``dynamic=False``), a benchmark over sequence lengths or a run with a short last batch, evaluation and
    a DIET bias passed the limit. A bucket sees one input signature, so it compiles once and never approaches the
    limit; a new shape opens a new bucket, which is the compilation a static-shape kernel needs anyway. Under an
    outer ``torch.compile`` (``--compile``) the callable is inlined into the model's graph."""
    if device_type == "cpu":
        return _flex_call
    fn = _compiled_flex.get(bucket)
    if fn is None:
        code = _flex_call.__code__.replace(co_name=f"_flex_call_{len(_compiled_flex)}")
        fresh = types.FunctionType(code, _flex_call.__globals__, code.co_name, _flex_call.__defaults__)
        fn = _compiled_flex[bucket] = torch.compile(fresh, dynamic=False, backend=COMPILE_BACKEND)
    return fn


def _bucket(q, k, v, call: Call) -> tuple:
    """What makes two flex calls need different compiled code (see :func:`_flex_fn`)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    present = tuple(x is not None for x in (call.key_padding_mask_BN, call.token_mask, call.doc_ids_BN))
    bias = None if call.score_bias is None else type(call.score_bias).__qualname__
    return (str(q.device), q.dtype, tuple(q.shape), tuple(k.shape), tuple(v.shape), grad, present, bias, call.scale)


def mask_mod_for(
    layout: torch.Tensor,
    block: int,
    kpm: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
    doc_ids: torch.Tensor | None = None,
    kv_len: int | None = None,
    form: "LayoutForm | None" = None,
) -> Callable:
    """FlexAttention ``mask_mod`` of a block layout, AND a key-padding mask, AND an element mask, AND same document
    (``doc_ids`` ``[B, N]``, packed sequences), AND key < ``kv_len`` (when given). A layout with a closed
    :class:`LayoutForm` is computed from the positions (no per-element layout table load)."""
    per_head = layout.shape[0] > 1  # a one-head layout (full attention) serves every head
    band = token_mask if isinstance(token_mask, BandMask) else None
    if band is not None:
        token_mask = None
        radius, length = band.radius, band.length

    def mask_mod(b, h, qi, ki):
        if form is None:
            m = layout[h if per_head else 0, qi // block, ki // block]
        else:
            m = form.allowed(h, qi, ki)
        if kv_len is not None:
            m = m & (ki < kv_len)
        if kpm is not None:
            m = m & kpm[b, ki]
        if token_mask is not None:
            m = m & token_mask[h if token_mask.shape[0] > 1 else 0, qi, ki]
        if band is not None:  # the window from its radius: no n x n table
            m = m & ((qi - ki).abs() <= radius) & (qi < length) & (ki < length)
        if doc_ids is not None:
            m = m & (doc_ids[b, qi] == doc_ids[b, ki])
        return m

    return mask_mod


@dataclass(frozen=True)
class LayoutForm:
    """A block layout that is a closed function of the block indices, so ``mask_mod`` computes membership instead
    of loading ``layout[h, qi // block, ki // block]`` per element:

    - ``cyclic``: BlockBERT's chunks: ``chunk`` tokens each, ``count`` of them, head h's query chunk i attends key
      chunk ``(i + shifts[h]) % count`` (``shifts``: int ``[H]``, one scalar load per head);
    - ``band``: every head's block row i attends key blocks ``i - hi .. i - lo`` (the sliding windows), keys
      bounded by ``length`` (the layout's own end; the tile padding past it is masked).
    """

    kind: str
    chunk: int = 0
    count: int = 0
    shifts: torch.Tensor | None = None
    block: int = 0
    lo: int = 0
    hi: int = 0
    length: int = 0

    def allowed(self, h, qi, ki):
        if self.kind == "cyclic":
            return (qi // self.chunk + self.shifts[h]) % self.count == ki // self.chunk
        d = qi // self.block - ki // self.block
        return (d >= self.lo) & (d <= self.hi) & (ki < self.length)


def layout_form(layout_HMM: torch.Tensor, block: int) -> LayoutForm | None:
    """The closed :class:`LayoutForm` of a bool ``[H, M, M]`` layout, if it has one (checked exactly against the
    layout: the form is used only where it reproduces every entry)."""
    H, M, _ = layout_HMM.shape
    lay = layout_HMM.cpu()
    if bool(lay.all()) or not bool(lay.any()):
        return None  # full or empty: the BlockMask alone decides (no mask_mod runs in full blocks)
    i = torch.arange(M)
    d = i[:, None] - i[None, :]
    if bool((lay == lay[:1]).all()):  # one pattern for every head: a band?
        on = d[lay[0]]
        lo, hi = int(on.min()), int(on.max())
        if torch.equal(lay[0], (d >= lo) & (d <= hi)):
            return LayoutForm("band", block=block, lo=lo, hi=hi, length=M * block)
    for count in range(2, min(M, 64) + 1):  # BlockBERT: count chunks of M / count blocks, one key chunk per row
        if M % count:
            continue
        r = M // count
        c = i // r
        shifts = (lay[:, ::r, ::r].float().argmax(-1)[:, 0]) % count  # head h's key chunk for query chunk 0
        want = (c[None, :, None] + shifts[:, None, None]) % count == c[None, None, :]
        if torch.equal(lay, want):
            return LayoutForm("cyclic", chunk=r * block, count=count, shifts=shifts.to(torch.int32))
    return None


class _PaddingMaskCache:
    """The BlockMask of the last key-padding mask (and document ids), per plan key: the layers of one forward share
    one padding mask tensor and (usually) one layout, so the mask is built once per forward, not once per layer. An
    entry is valid only for the same tensor objects at the same versions (a new batch, or an in-place change,
    rebuilds)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[Any, Any, Any]] = {}

    def get(self, key: tuple, tensors: tuple, build: Callable[[], Any]) -> Any:
        """``tensors``: the per-call inputs the mask depends on (None entries allowed)."""
        hit = self._entries.get(key)
        refs = tuple(None if t is None else (id(t), t._version) for t in tensors)
        if (
            hit is not None
            and hit[1] == refs
            and all((w is None) == (t is None) and (w is None or w() is t) for w, t in zip(hit[0], tensors))
        ):
            return hit[2]
        bm = build()
        self._entries[key] = (tuple(None if t is None else weakref.ref(t) for t in tensors), refs, bm)
        if len(self._entries) > 64:  # many distinct layouts: keep the newest
            self._entries.pop(next(iter(self._entries)))
        return bm


_PADDING_MASKS = _PaddingMaskCache()


def element_kernel_options(device: torch.device) -> dict[str, int]:
    """Triton tile sizes for a FlexAttention whose score_mod/mask_mod read a dense [.., N, N] tensor (a DIET bias, a
    token mask): the kernel then pipelines a bias and a mask tile per key block next to K and V, and torch's default
    H100 forward tiles (128 x 128, 3 stages, bf16, head dim 64) ask for 272 KiB of shared memory, over the 227 KiB an
    H100/H200 has ("No valid triton configs", seen on an H200: docs/gpu_results.md). 64-key tiles need about half;
    GPUs with less shared memory (sm86/89: ~100 KiB) also get 64-query tiles and 2 stages."""
    smem = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    if smem >= 200 * 1024:
        return {"BLOCK_N": 64}
    return {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2}


def kv_tile_for(layout_HMM: torch.Tensor, block: int) -> int | None:
    """64 when 64-token key tiles make a layout's partial 128 x 128 tiles full (64-token global columns and windows
    that half fill a 128-token key tile: Fixed, BigBird, Longformer, sliding windows at block 64) without visiting
    more: partial tile area shrinks and visited area does not grow; else None (128 x 128). Counted on the layout."""
    if 64 % block or layout_HMM.shape[-1] * block % SPARSE_BLOCK:
        return None
    area = {}
    for kv in (SPARSE_BLOCK, 64):
        a, f = (t.long().sum() for t in _grouped_any_all(layout_HMM.cpu(), (SPARSE_BLOCK // block, kv // block), 2))
        area[kv] = (int(a - f) * kv, int(a) * kv)  # (partial, visited) x query tile height
    (p128, v128), (p64, v64) = area[SPARSE_BLOCK], area[64]
    return 64 if p64 < p128 and v64 <= v128 else None


def kv_tile_trains(kv: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's compiled FlexAttention backward has a tile config for ``kv``-token key blocks here: its
    backward keeps only the default configs whose key tiles divide the BlockMask's (torch 2.13
    ``kernel/flex/flex_attention.py``: the filter reads the configs, not ``kernel_options``), and its H100/H200
    default for head dim 64-128 uses 128-key tiles, so a 64-key BlockMask has no backward there (forward: fine with
    ``BLOCK_N=64``). Read from inductor's own heuristics (a private API: unknown means no)."""
    if device.type != "cuda":
        return True
    try:
        from torch._inductor.choices import InductorChoices

        confs = InductorChoices().get_flex_attention_bwd_configs(head_dim, dtype, "cuda")
    except Exception:  # noqa: BLE001 - a private API that moved: keep the 128-token tiles
        return False
    return any(kv % c.block_n1 == 0 and kv % c.block_n2 == 0 for c in confs)


@dataclass
class FlexPlan:
    layout_HMM: torch.Tensor  # on device, bool, padded with off blocks to cover run_len
    block: int
    seq_len: int
    block_mask: Any  # layout (+ fixed token mask) BlockMask (B=None) at 128 x 128 tiles, reused without per-batch masks
    token_mask: torch.Tensor | None = None  # the plan's fixed element mask, [H|1, R, R] on device (R = run_len)
    key: tuple = ()  # what makes two plans' BlockMasks interchangeable (layout content, block, N, token mask)
    run_len: int = 0  # seq_len padded to the 128-token query tile: the length FlexAttention sees (IS_DIVISIBLE)
    kv_len: int | None = None  # keys from here on are masked by the mask_mod (full attention: its layout is coarse)
    kv_tile: int | None = None  # 64: key tiles of 64 make this layout's partial tiles full (kv_tile_for)
    form: LayoutForm | None = None  # the layout as a closed form (mask_mod without a table load), if it has one
    masks: dict = field(default_factory=dict)  # kv tile -> the layout-only BlockMask at that tile

    def build_block_mask(
        self,
        lay: torch.Tensor,
        kpm: torch.Tensor | None,
        tm: torch.Tensor | None,
        doc: torch.Tensor | None = None,
        kv_tile: int | None = None,
    ) -> Any:
        """From the block layout, at any block size (no N x N pass: torch's ``create_block_mask`` evaluates the
        mask_mod on all B x H x N^2 elements, per forward with padding)."""
        mask_mod = mask_mod_for(lay, self.block, kpm, tm, doc, self.kv_len, self.form)
        return layout_block_mask(lay, self.block, self.run_len, mask_mod, kpm, tm, doc, kv_tile, self.kv_len)

    def layout_mask(self, kv_tile: int | None) -> Any:
        """The layout-only BlockMask at ``kv_tile`` (built once per tile)."""
        if kv_tile is None:
            return self.block_mask
        if kv_tile not in self.masks:
            self.masks[kv_tile] = self.build_block_mask(self.layout_HMM, None, self.token_mask, None, kv_tile)
        return self.masks[kv_tile]

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        key_padding_mask_BN, token_mask, score_bias, dropout_p, scale = call
        dev = q_BHND.device
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q_BHND, k_BHND, v_BHND))
        if dev.type == "cpu" and needs_grad:
            raise RuntimeError(
                "attention kernel 'flex' has no backward on CPU (FlexAttention limitation): use kernel "
                "'block_gather' or 'auto' for CPU training, or run under torch.no_grad() for inference"
            )
        if dev.type == "cpu":  # grad is off here; FlexAttention rejects CPU inputs that merely require grad
            q_BHND, k_BHND, v_BHND = q_BHND.detach(), k_BHND.detach(), v_BHND.detach()
        if dropout_p > 0:
            raise ValueError(
                f"attention kernel 'flex' does not support attention dropout (got {dropout_p}); set attention "
                "dropout to 0 or use kernel 'block_gather'/'dense'"
            )
        N, R = q_BHND.shape[2], self.run_len
        pad = R - N  # to the tile: FlexAttention then compiles without bounds checks (IS_DIVISIBLE)
        if pad:
            q_BHND, k_BHND, v_BHND = (F.pad(t, (0, 0, 0, pad)) for t in (q_BHND, k_BHND, v_BHND))
        H = q_BHND.shape[1]
        lay = self.layout_HMM
        if lay.shape[0] == 1 and H > 1:
            lay = lay.expand(H, -1, -1)
        doc = call.doc_ids_BN
        kv = self.kv_tile
        if kv is not None and not (not needs_grad or kv_tile_trains(kv, q_BHND.shape[-1], q_BHND.dtype, dev)):
            kv = None
        bm = self.layout_mask(kv)
        if token_mask is not None:  # a per-call element mask: its own BlockMask (128 x 128 tiles)
            kv = None
            tm = _pad_to(token_mask.to(dev), R, (-1, -2), False)
            if self.token_mask is not None:
                tm = dense_mask(self.token_mask, dev) & tm
            bm = self.build_block_mask(
                lay, _pad_to(key_padding_mask_BN, R, (-1,), False), tm, _pad_to(doc, R, (-1,), -1)
            )
        elif key_padding_mask_BN is not None or doc is not None:  # one BlockMask per forward, shared by the layers
            kpm = key_padding_mask_BN  # the cache is keyed on the inputs as given (module.py pads them once)
            bm = _PADDING_MASKS.get(
                self.key + (kv,),
                (kpm, doc),
                lambda: self.build_block_mask(
                    lay, _pad_to(kpm, R, (-1,), False), self.token_mask, _pad_to(doc, R, (-1,), -1), kv
                ),
            )
        if score_bias is not None and pad:
            score_bias = score_bias.padded(R)
        if score_bias is not None:  # a low-rank part (DIET-ABS) joins q and k: O(N d) instead of an [H, N, N] table
            a_HNR, b_HNR, score_bias = score_bias.split_low_rank()
            if a_HNR is not None:
                q_BHND, k_BHND, scale = fold_low_rank(q_BHND, k_BHND, a_HNR, b_HNR, scale)
        score_mod = None if score_bias is None else score_bias.score_mod()
        elementwise = score_mod is not None or token_mask is not None or self.token_mask is not None
        opts = element_kernel_options(dev) if elementwise and dev.type == "cuda" else None
        if kv is not None and dev.type == "cuda":  # forward key tiles that divide the BlockMask's
            opts = {**(opts or {}), "BLOCK_N": min(kv, (opts or {}).get("BLOCK_N", kv))}
        fn = _flex_fn(
            dev.type, _bucket(q_BHND, k_BHND, v_BHND, call) + (None if opts is None else tuple(opts.items()),)
        )
        out = fn(q_BHND, k_BHND, v_BHND, score_mod, bm, scale, opts)
        return out[:, :, :N] if pad else out  # FlexAttention returns 0 for rows with no allowed key (tested)


def _pad_to(x: torch.Tensor | None, n: int, dims: tuple[int, ...], value) -> torch.Tensor | None:
    """``x`` padded at the end of each of ``dims`` to length ``n`` with ``value`` (None stays None)."""
    if x is None or all(x.shape[d] == n for d in dims):
        return x
    pads = [0] * (2 * x.dim())
    for d in dims:
        pads[2 * (-d - 1) + 1] = n - x.shape[d]
    return F.pad(x, pads, value=value)


def fold_low_rank(
    q_BHND: torch.Tensor, k_BHND: torch.Tensor, a_HNR: torch.Tensor, b_HNR: torch.Tensor, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """q' = [q, a / s], k' = [k, b] with s the score scale, so ``s q'.k' = s q.k + a.b``: a low-rank score bias
    computed inside the attention's own matmul."""
    B, H, N, D = q_BHND.shape
    s = D**-0.5 if scale is None else scale
    a = (a_HNR[:, :N] / s).to(q_BHND.dtype).expand(B, H, -1, -1)
    b = b_HNR[:, :N].to(k_BHND.dtype).expand(B, H, -1, -1)
    return torch.cat([q_BHND, a], -1), torch.cat([k_BHND, b], -1), s


@register_kernel("flex")
class FlexKernel(Kernel):
    """FlexAttention: compiled Triton kernels on CUDA; no backward and no dropout (eager inference) on CPU."""

    trains_on_cpu = False

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None, family=None) -> FlexPlan:
        dev = torch.device(device)
        if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < MIN_CAPABILITY:
            cap = torch.cuda.get_device_capability(dev)
            raise ValueError(
                f"attention kernel 'flex' needs compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}+, this GPU "
                f"is {cap[0]}.{cap[1]}: Triton has no tensor-core (MMA) path below sm80 and FlexAttention runs about "
                "10x slower than SDPA there (attention-gym issue 21); use --attention-kernel block_gather or auto"
            )
        run_len = -(-seq_len // SPARSE_BLOCK) * SPARSE_BLOCK  # the 128-token query tile; key tiles divide it
        kv_len = None
        if layout_HMM is None:  # full attention: an all-on layout at the sparse block size
            block = SPARSE_BLOCK
            m = -(-seq_len // block)
            layout_HMM = torch.ones(1, m, m, dtype=torch.bool)
            kv_len = seq_len if m * block > seq_len else None  # its last block reaches past the sequence
        lay = layout_HMM.to(dtype=torch.bool)
        M, Mr = lay.shape[-1], -(-run_len // block)
        form = layout_form(lay, block) if kv_len is None else None
        if Mr > M:  # off blocks over the tile padding (mask_mod indexes the layout there)
            lay = _grow(lay, Mr)
        lay = lay.to(device=device)
        tm = token_mask
        if isinstance(tm, BandMask):
            tm = tm.resized(run_len)
        elif isinstance(tm, torch.Tensor):
            tm = _pad_to(tm.to(device=device, dtype=torch.bool), run_len, (-1, -2), False)
        H = max(lay.shape[0], 1 if tm is None else tm.shape[0])
        if lay.shape[0] == 1 and H > 1:
            lay = lay.expand(H, -1, -1)
        if form is not None and form.shifts is not None:
            form = LayoutForm(form.kind, form.chunk, form.count, form.shifts.to(device))
        kv_tile = None if tm is not None else kv_tile_for(lay, block)
        plan = FlexPlan(lay, block, seq_len, None, tm, run_len=run_len, kv_len=kv_len, kv_tile=kv_tile, form=form)
        plan.block_mask = plan.build_block_mask(lay, None, tm)
        tm_key = (
            None
            if tm is None
            else tm.key()
            if isinstance(tm, BandMask)
            else (tuple(tm.shape), hash(tm.cpu().numpy().tobytes()))
        )
        plan.key = (block, seq_len, tuple(lay.shape), hash(lay.cpu().numpy().tobytes()), tm_key, str(device))
        return plan


def _grow(lay_HMM: torch.Tensor, m: int) -> torch.Tensor:
    """A bool ``[H, M, M]`` layout grown to ``[H, m, m]`` with off blocks."""
    out = torch.zeros(lay_HMM.shape[0], m, m, dtype=torch.bool)
    out[:, : lay_HMM.shape[1], : lay_HMM.shape[2]] = lay_HMM.cpu()
    return out
