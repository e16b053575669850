"""``flex``: torch FlexAttention with a BlockMask built from the layout (Triton on CUDA; eager inference on CPU)."""

from __future__ import annotations

import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.nn.attention.flex_attention import flex_attention

from model.attention.band import BandMask, dense_mask
from model.attention.kernels.flex_mask import SPARSE_BLOCK, layout_block_mask
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
        fresh = types.FunctionType(code, _flex_call.__globals__, code.co_name)
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
) -> Callable:
    """FlexAttention ``mask_mod`` of a block layout, AND a key-padding mask, AND an element mask, AND same document
    (``doc_ids`` ``[B, N]``, packed sequences)."""
    per_head = layout.shape[0] > 1  # a one-head layout (full attention) serves every head
    band = token_mask if isinstance(token_mask, BandMask) else None
    if band is not None:
        token_mask = None
        radius, length = band.radius, band.length

    def mask_mod(b, h, qi, ki):
        m = layout[h if per_head else 0, qi // block, ki // block]
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


@dataclass
class FlexPlan:
    layout_HMM: torch.Tensor  # on device, bool
    block: int
    seq_len: int
    block_mask: Any  # layout (+ fixed token mask) BlockMask (B=None), reused when no per-batch mask is given
    token_mask: torch.Tensor | None = None  # the plan's fixed element mask, [H|1, N, N] on device
    key: tuple = ()  # what makes two plans' BlockMasks interchangeable (layout content, block, N, token mask)

    def build_block_mask(
        self, lay: torch.Tensor, kpm: torch.Tensor | None, tm: torch.Tensor | None, doc: torch.Tensor | None = None
    ) -> Any:
        """From the block layout, at any block size (no N x N pass: torch's ``create_block_mask`` evaluates the
        mask_mod on all B x H x N^2 elements, per forward with padding)."""
        mask_mod = mask_mod_for(lay, self.block, kpm, tm, doc)
        return layout_block_mask(lay, self.block, self.seq_len, mask_mod, kpm, tm, doc)

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
        H = q_BHND.shape[1]
        bm = self.block_mask
        lay = self.layout_HMM
        if lay.shape[0] == 1 and H > 1:
            lay = lay.expand(H, -1, -1)
        doc = call.doc_ids_BN
        if token_mask is not None:  # a per-call element mask: its own BlockMask
            tm = token_mask.to(dev)
            if self.token_mask is not None:
                tm = dense_mask(self.token_mask, dev) & tm
            bm = self.build_block_mask(lay, key_padding_mask_BN, tm, doc)
        elif key_padding_mask_BN is not None or doc is not None:  # one BlockMask per forward, shared by the layers
            kpm = key_padding_mask_BN
            bm = _PADDING_MASKS.get(self.key, (kpm, doc), lambda: self.build_block_mask(lay, kpm, self.token_mask, doc))
        if score_bias is not None:  # a low-rank part (DIET-ABS) joins q and k: O(N d) instead of an [H, N, N] table
            a_HNR, b_HNR, score_bias = score_bias.split_low_rank()
            if a_HNR is not None:
                q_BHND, k_BHND, scale = fold_low_rank(q_BHND, k_BHND, a_HNR, b_HNR, scale)
        score_mod = None if score_bias is None else score_bias.score_mod()
        elementwise = score_mod is not None or token_mask is not None or self.token_mask is not None
        opts = element_kernel_options(dev) if elementwise and dev.type == "cuda" else None
        fn = _flex_fn(
            dev.type, _bucket(q_BHND, k_BHND, v_BHND, call) + (None if opts is None else tuple(opts.items()),)
        )
        out = fn(q_BHND, k_BHND, v_BHND, score_mod, bm, scale, opts)
        return out  # FlexAttention returns 0 for rows with no allowed key (tested against dense)


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

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None) -> FlexPlan:
        dev = torch.device(device)
        if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < MIN_CAPABILITY:
            cap = torch.cuda.get_device_capability(dev)
            raise ValueError(
                f"attention kernel 'flex' needs compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}+, this GPU "
                f"is {cap[0]}.{cap[1]}: Triton has no tensor-core (MMA) path below sm80 and FlexAttention runs about "
                "10x slower than SDPA there (attention-gym issue 21); use --attention-kernel block_gather or auto"
            )
        if layout_HMM is None:  # full attention: an all-on layout at the sparse block size
            block = SPARSE_BLOCK
            m = -(-seq_len // block)
            layout_HMM = torch.ones(1, m, m, dtype=torch.bool)
        lay = layout_HMM.to(device=device, dtype=torch.bool)
        tm = token_mask
        if isinstance(tm, torch.Tensor):
            tm = tm.to(device=device, dtype=torch.bool)
        H = max(lay.shape[0], 1 if tm is None else tm.shape[0])
        if lay.shape[0] == 1 and H > 1:
            lay = lay.expand(H, -1, -1)
        plan = FlexPlan(layout_HMM=lay, block=block, seq_len=seq_len, block_mask=None, token_mask=tm)
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
