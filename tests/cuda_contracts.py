"""CUDA's scaled-dot-product-attention contracts, written down and emulated on CPU.

No GPU runs our CI, and CPU SDPA hides what CUDA does differently: it returns contiguous outputs, accepts any dtype,
and our kernels take CPU-only branches on CPU tensors (the tile fold in ``sdpa_tiles``, the split plan, host reads
of masks). :func:`emulate_cuda` sends CPU tensors down the branches a CUDA device takes (it replaces
``model.host.takes_cpu_path``, the one question those branches ask) and replaces
``torch.nn.functional.scaled_dot_product_attention`` with a dispatcher that picks a backend by torch's CUDA rules
and returns what that backend returns on CUDA: its output strides, its refusals, its mask preprocessing.

Backend selection follows ``select_sdp_backend`` in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: the
priority order (cuDNN first on sm90/sm100 with a recent cuDNN, see ``check_prefer_cudnn_attention``; then flash,
memory-efficient, math), each backend's ``can_use_*`` filters, the backends enabled by
``torch.nn.attention.sdpa_kernel`` (so tests force a backend the same way on the emulation and on a real GPU), and
"No available kernel. Aborting execution." when none is left. The rules were read from torch's main branch
(2.1x); what differs between versions is noted where it matters.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

BACKENDS = ("cudnn", "flash", "efficient", "math")
"""torch's SDPA backends on CUDA, in the order ``priority_order`` tries them when cuDNN is preferred."""


@dataclass(frozen=True)
class EmulatedGPU:
    """What backend selection reads from the device (``cudaDeviceProp`` and the cuDNN build)."""

    name: str
    capability: tuple[int, int]
    prefer_cudnn: bool
    """cuda/sdp_utils.cpp ``check_prefer_cudnn_attention``: cuDNN first on sm90/sm100 with cuDNN > 9.15.0."""


H100 = EmulatedGPU("H100", (9, 0), prefer_cudnn=True)
A100 = EmulatedGPU("A100", (8, 0), prefer_cudnn=False)
V100 = EmulatedGPU("V100", (7, 0), prefer_cudnn=False)
GPUS = {g.name: g for g in (H100, A100, V100)}


def enabled_backends() -> set[str]:
    """The backends ``torch.nn.attention.sdpa_kernel`` (or ``torch.backends.cuda.enable_*_sdp``) leaves enabled."""
    b = torch.backends.cuda
    on = {
        "cudnn": b.cudnn_sdp_enabled(),
        "flash": b.flash_sdp_enabled(),
        "efficient": b.mem_efficient_sdp_enabled(),
        "math": b.math_sdp_enabled(),
    }
    return {name for name, enabled in on.items() if enabled}


@dataclass
class _Params:
    """sdp_utils_cpp.h ``sdp_params``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    dropout: float

    @property
    def requires_grad(self) -> bool:
        """sdp_utils_cpp.h ``input_requires_grad``."""
        return torch.is_grad_enabled() and any(t.requires_grad for t in (self.q, self.k, self.v))


def _common_refusal(p: _Params, ignore_singleton_last_dim: bool) -> str | None:
    """Filters every fused backend applies (sdp_utils_cpp.h): ``check_tensor_shapes`` (4-D only),
    ``check_batch_size_and_num_heads_dense`` (same B and heads, no GQA here), ``check_nonzero_sequence_lengths_dense``,
    ``check_last_dim_stride_equals_1_dense`` (q/k/v and the mask)."""
    q, k, v = p.q, p.k, p.v
    if not q.dim() == k.dim() == v.dim() == 4:
        return f"fused kernels need 4-D q/k/v, got {q.dim()}/{k.dim()}/{v.dim()}"
    if not (q.shape[0] == k.shape[0] == v.shape[0] and q.shape[1] == k.shape[1] == v.shape[1]):
        return "fused kernels need the same batch size and head count in q, k, v"
    if q.shape[2] == 0 or k.shape[2] == 0:
        return "fused kernels refuse zero sequence lengths"
    strides_ok = all(t.stride(-1) == 1 for t in (q, k, v))
    if ignore_singleton_last_dim:
        strides_ok = strides_ok or q.shape[-1] == 1
    if not strides_ok or (p.mask is not None and p.mask.stride(-1) != 1):
        return "fused kernels need stride 1 in the last dim of q, k, v and the mask"
    return None


def _half(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float16, torch.bfloat16)


def _same_dtype(p: _Params, allowed: tuple[torch.dtype, ...]) -> str | None:
    """sdp_utils_cpp.h ``check_tensor_dtype``."""
    if not (p.q.dtype == p.k.dtype == p.v.dtype and p.q.dtype in allowed):
        return f"q/k/v dtype {p.q.dtype} is not one of {allowed}"
    return None


def flash_refusal(p: _Params, gpu: EmulatedGPU) -> str | None:
    """Why flash cannot run (None: it can). cuda/sdp_utils.cpp ``can_use_flash_attention``: no attention mask
    (``check_for_attn_mask``), q/k/v head dims equal and <= 256 (``check_head_dim_size_flash``), sm80..sm121
    (``check_flash_attention_hardware_support``), no training with head dim in (192, 224] on sm86/89/120
    (``check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120``), fp16/bf16 only
    (``check_dtypes_flash_attention``: fp32 is refused, as torch refuses it)."""
    if p.mask is not None:
        return "flash takes no attn_mask"
    d = (p.q.shape[-1], p.k.shape[-1], p.v.shape[-1])
    if len(set(d)) != 1 or d[0] > 256:
        return f"flash needs equal head dims <= 256, got {d}"
    if not (8, 0) <= gpu.capability <= (12, 1):
        return f"flash needs sm80..sm121, this is sm{gpu.capability[0]}{gpu.capability[1]}"
    sm86_89 = (8, 6) <= gpu.capability <= (8, 9) or (12, 0) <= gpu.capability <= (12, 1)
    if sm86_89 and p.requires_grad and not (d[0] <= 192 or (p.dropout == 0 and d[0] > 224)):
        return "flash cannot train head dims in (192, 224] on sm86/89/120"
    why = _same_dtype(p, (torch.float16, torch.bfloat16))
    return why or _common_refusal(p, ignore_singleton_last_dim=True)


def minimum_gemm_alignment(q: torch.Tensor, gpu: EmulatedGPU) -> int:
    """cuda/sdp_utils.cpp ``minimum_gemm_alignment``: elements the CUTLASS GEMMs of memory-efficient attention
    need (4 from sm80; 128 bits, i.e. 8 half or 4 float, where tensor cores run: sm80+, or sm70+ in half)."""
    tensor_cores = gpu.capability[0] >= 8 or (gpu.capability[0] >= 7 and _half(q))
    align = 4 if gpu.capability[0] >= 8 else 1
    if tensor_cores:
        align = max(align, 128 // (16 if _half(q) else 32))
    return align


def efficient_refusal(p: _Params, gpu: EmulatedGPU) -> str | None:
    """Why memory-efficient attention cannot run. cuda/sdp_utils.cpp ``can_use_mem_efficient_attention``: sm50..sm121,
    head dims equal in q/k and divisible by :func:`minimum_gemm_alignment` (``check_head_dim_size_mem_efficient``),
    on sm80+ q/k/v storage offsets aligned to that many elements (``check_data_ptr_alignment_mem_efficient``),
    dtypes fp16/fp32 below sm80 and fp16/fp32/bf16 from sm80."""
    if not (5, 0) <= gpu.capability <= (12, 1):
        return "memory-efficient attention needs sm50..sm121"
    align = minimum_gemm_alignment(p.q, gpu)
    dq, dk, dv = p.q.shape[-1], p.k.shape[-1], p.v.shape[-1]
    if dq != dk or dq % align or dv % align or dq == 0 or dv == 0:
        return f"memory-efficient attention needs head dims divisible by {align}, got q {dq} k {dk} v {dv}"
    if gpu.capability[0] >= 8 and any(t.numel() and t.storage_offset() % align for t in (p.q, p.k, p.v)):
        return f"memory-efficient attention on sm80+ needs q/k/v storage offsets aligned to {align} elements"
    why = _common_refusal(p, ignore_singleton_last_dim=False)
    if why:
        return why
    allowed = (torch.float16, torch.float32) + ((torch.bfloat16,) if gpu.capability[0] >= 8 else ())
    return _same_dtype(p, allowed)


def cudnn_refusal(p: _Params, gpu: EmulatedGPU) -> str | None:
    """Why cuDNN attention cannot run. cuda/sdp_utils.cpp ``can_use_cudnn_attention``: not under deterministic
    algorithms (``check_cudnn_deterministic``), fp16/bf16 (``check_dtypes_low_precision``), a mask of shape
    ``[Q|1, K|1]`` or ``[B|1, H|1, Q|1, K|1]`` that does not require grad (sdp_utils_cpp.h
    ``check_attn_mask_shape``: a learned DIET bias is refused), sm80..sm121, dropout a multiple of 1/16
    (``check_cudnn_dropout``), head dims <= 128 (256 on sm90/sm10x with cuDNN > 9.22) and multiples of 8, key length
    != 1 (``check_cudnn_tensor_shapes``)."""
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return "cuDNN attention is not deterministic"
    why = _same_dtype(p, (torch.float16, torch.bfloat16))
    if why:
        return why
    m = p.mask
    if m is not None:
        if m.requires_grad:
            return "cuDNN attention takes no attn_mask that requires grad"
        B, H, Q = p.q.shape[:3]
        K = p.k.shape[2]
        if m.shape[-2] not in (Q, 1) or m.shape[-1] not in (K, 1):
            return "cuDNN attention: mask shape"
        if m.dim() == 4 and not (m.shape[0] in (1, B) and m.shape[1] in (1, H)):
            return "cuDNN attention: mask shape"
        if m.dim() not in (2, 4):
            return "cuDNN attention: mask must be 2-D or 4-D"
    if not (8, 0) <= gpu.capability <= (12, 1):
        return "cuDNN attention needs sm80..sm121"
    if p.dropout * 16.0 != math.floor(p.dropout * 16.0):
        return "cuDNN dropout must be a multiple of 1/16"
    limit = 256 if gpu.capability[0] in (9, 10) else 128
    dq, dv = p.q.shape[-1], p.v.shape[-1]
    if dq > limit or dv > limit or dq % 8 or dv % 8:
        return f"cuDNN attention needs head dims <= {limit} and multiples of 8"
    if p.k.shape[2] == 1:
        return "cuDNN attention refuses key length 1"
    return _common_refusal(p, ignore_singleton_last_dim=True)


REFUSALS = {"cudnn": cudnn_refusal, "flash": flash_refusal, "efficient": efficient_refusal}


def priority_order(gpu: EmulatedGPU) -> tuple[str, ...]:
    """cuda/sdp_utils.cpp ``priority_order``: flash, efficient, (cuDNN,) math by default; cuDNN first where
    ``check_prefer_cudnn_attention`` holds."""
    if gpu.prefer_cudnn:
        return ("cudnn", "flash", "efficient", "math")
    return ("flash", "efficient", "cudnn", "math")


def select_backend(p: _Params, gpu: EmulatedGPU) -> str:
    """cuda/sdp_utils.cpp ``select_sdp_backend``: the first enabled backend whose filters pass; with none, torch's
    error (it names every refusal)."""
    enabled = enabled_backends()
    reasons = []
    for name in priority_order(gpu):
        if name not in enabled:
            continue
        if name == "math":
            return name
        why = REFUSALS[name](p, gpu)
        if why is None:
            return name
        reasons.append(f"{name}: {why}")
    raise RuntimeError("No available kernel. Aborting execution. (" + "; ".join(reasons) + ")")


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """transformers/attention.cpp ``convert_boolean_attn_mask``: a bool mask becomes 0 / -inf in the query's dtype."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    return mask


def efficient_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor, gpu: EmulatedGPU) -> torch.Tensor:
    """The mask memory-efficient attention receives. transformers/attention.cpp ``preprocess_mask``: unless every
    stride but the last is a multiple of 8 and the last is 1 (``aligned_tensor<8>``), the mask is copied into a
    buffer whose last dim is padded to a multiple of 8 (``pad_bias``), then expanded to ``[B, H, Q, K]``. The kernel
    then checks (cuda/mem_eff_attention/kernel_forward.h ``check_supported``) that the bias's batch, head and row
    strides are multiples of its alignment (128 bits on tensor-core GPUs) and its dtype is the query's."""
    m = _additive_mask(mask, q.dtype)
    while m.dim() < 4:
        m = m.unsqueeze(0)
    aligned = m.stride(-1) == 1 and all(s % 8 == 0 for s in m.stride()[:-1])
    if not aligned:
        K = m.shape[-1]
        padded = F.pad(m, (0, 8 - K % 8))
        m = padded[..., :K]
    m = m.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    kernel_align = minimum_gemm_alignment(q, gpu)
    bad = [s for s in m.stride()[:3] if s % kernel_align]
    assert not bad, f"attn_bias is not correctly aligned (strides {m.stride()}, alignment {kernel_align})"
    assert m.dtype == q.dtype, "invalid dtype for bias - should match query's dtype"
    return m


def _math(q, k, v, mask, dropout_p: float, scale: float | None) -> torch.Tensor:
    """transformers/attention.cpp ``_scaled_dot_product_attention_math``: softmax(q k^T * scale + mask), dropout,
    times v; fp16/bf16 computed in fp32 here (the CUDA kernels accumulate in fp32), returned contiguous."""
    s = scale if scale is not None else q.shape[-1] ** -0.5
    scores = (q.float() @ k.float().transpose(-1, -2)) * s
    if mask is not None:
        scores = scores + _additive_mask(mask, torch.float32).float()
    probs = torch.softmax(scores, -1)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    return (probs @ v.float()).to(q.dtype)


@torch.library.custom_op("sparsebert_emulation::fused_sdpa", mutates_args=())
def fused_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    scale: float | None,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_math` as one fused CUDA backend op (flash, memory-efficient, cuDNN): ``(out, logsumexp, rng state)``.
    One op, as on CUDA, so selective checkpointing (model/attention/kernels/block_gather/gather.py) can keep its
    output; its autograd keeps q, k, v, the mask, the output and a ``[B, H, Q]`` fp32 logsumexp, no score matrix,
    so ``saved_tensors_hooks`` and allocator counts under the emulation see CUDA's bytes. The scores are computed
    for :data:`EMULATED_ROWS` query rows at a time (CUDA's kernels tile them too)."""
    rng = torch.get_rng_state()
    with torch.no_grad():
        out = torch.cat([_math(q[..., r, :], k, v, _rows(mask, r), dropout_p, scale) for r in _row_chunks(q)], -2)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)  # the logsumexp's bytes (values unused here)
    return backend_layout(out, q, backend), lse, rng


def _fused_setup(ctx, inputs, output):
    q, k, v, mask, dropout_p, scale, _ = inputs
    out, lse, rng = output
    ctx.dropout_p, ctx.scale = dropout_p, scale
    ctx.save_for_backward(q, k, v, mask, out, lse, rng)


def _fused_backward(ctx, dout, _dlse, _drng):
    """The fused backward: the scores again, one chunk of query rows at a time, with the forward's RNG stream (the
    same chunks draw the same dropout)."""
    q, k, v, mask, _, _, rng = ctx.saved_tensors
    wants = [t is not None and w for t, w in zip((q, k, v, mask), ctx.needs_input_grad[:4])]
    grads = [torch.zeros_like(t) if w else None for w, t in zip(wants, (q, k, v, mask))]
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(rng)
        for r in _row_chunks(q):
            qr = q[..., r, :].detach().requires_grad_(wants[0])
            kd, vd = k.detach().requires_grad_(wants[1]), v.detach().requires_grad_(wants[2])
            m = None if mask is None else mask.detach().requires_grad_(wants[3])
            with torch.enable_grad():
                out = _math(qr, kd, vd, _rows(m, r), ctx.dropout_p, ctx.scale)
            idx = [i for i, w in enumerate(wants) if w]
            if not idx:
                continue
            got = torch.autograd.grad(out, [(qr, kd, vd, m)[i] for i in idx], dout[..., r, :], allow_unused=True)
            for i, dg in zip(idx, got):
                if dg is None:
                    continue
                if i == 0:
                    grads[0][..., r, :] += dg
                else:
                    grads[i] += dg
    return (*grads, None, None, None)


fused_sdpa.register_autograd(_fused_backward, setup_context=_fused_setup)


EMULATED_ROWS = 128
"""Query rows whose scores the emulated fused backends hold at once, so the emulation's transient
memory stays O(N) like CUDA's tiled kernels instead of holding [B, H, N, N] scores."""


def _row_chunks(q: torch.Tensor) -> list[slice]:
    """Query row chunks (the backward replays the forward's RNG stream over the same chunks, so dropout matches;
    like CUDA's Philox stream, it is not the one an unchunked CPU call draws)."""
    L = q.shape[-2]
    return [slice(i, min(L, i + EMULATED_ROWS)) for i in range(0, max(L, 1), EMULATED_ROWS)]


def _rows(mask: torch.Tensor | None, r: slice) -> torch.Tensor | None:
    """``mask``'s part for query rows ``r`` (a mask broadcast over rows is returned whole)."""
    if mask is None or mask.dim() < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., r, :]


def with_stride_order_of(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x``'s values laid out in memory with ``like``'s dim order (what ``empty_like(like)`` allocates for a dense
    ``like``), through differentiable ops."""
    order = sorted(range(like.dim()), key=lambda d: (-like.stride(d), d))
    inverse = [order.index(d) for d in range(like.dim())]
    return x.permute(order).contiguous().permute(inverse)


@dataclass
class Emulation:
    """What one :func:`emulate_cuda` block saw: the backend of every SDPA call."""

    gpu: EmulatedGPU
    backends: Counter = field(default_factory=Counter)

    def sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """``F.scaled_dot_product_attention`` as CUDA runs it (see the module docstring)."""
        if is_causal or enable_gqa:
            raise NotImplementedError("the emulation covers what the kernels call: no is_causal, no enable_gqa")
        if attn_mask is not None and attn_mask.dtype not in (torch.bool, query.dtype):
            raise RuntimeError(f"Expected attn_mask dtype to be bool or to match query dtype, got {attn_mask.dtype}")
        p = _Params(query, key, value, attn_mask, dropout_p)
        backend = select_backend(p, self.gpu)
        self.backends[backend] += 1
        mask = attn_mask
        if backend == "efficient" and mask is not None:
            mask = efficient_mask(mask, query, key, self.gpu)
        if backend == "math":
            out = _math(query, key, value, mask, dropout_p, scale)
        else:  # a fused kernel keeps q, k, v, its mask, the output and a logsumexp: no scores
            out = fused_sdpa(query, key, value, mask, dropout_p, scale, backend)[0]
        return out  # math: matmul output, contiguous; fused: in the backend's layout (backend_layout)


def backend_layout(out: torch.Tensor, query: torch.Tensor, backend: str) -> torch.Tensor:
    """``out`` in the memory layout the fused ``backend`` returns on CUDA."""
    if backend == "efficient":
        # cuda/attention.cu _scaled_dot_product_efficient_attention_cuda: the kernel writes [B, T, H, D]
        # (_efficient_attention_forward allocates res as {B, M, num_heads, Kv}) and SDPA returns its
        # transpose(1, 2): a [B, H, T, D] view whose T and H strides are swapped
        return out.transpose(1, 2).contiguous().transpose(1, 2)
    # cuda/attention.cu _scaled_dot_product_flash_attention_cuda hands flash q.transpose(1, 2), whose output
    # is empty_like(q) (flash_api.cpp mha_fwd), transposed back: the output has the query's layout.
    # cudnn/MHA.cpp allocates its output with alloc_with_matching_layout(q, ...): the same rule
    return with_stride_order_of(out, query)


@contextlib.contextmanager
def emulate_cuda(gpu: EmulatedGPU = H100):
    """Within the block, CPU tensors take CUDA's branches and SDPA keeps ``gpu``'s contracts (module docstring)."""
    import model.host

    real = model.host.takes_cpu_path
    # every module that imported it by name (the HF export needs `from model.host import ...`), and model.host
    # itself, whose cpu_all reads it from there
    holders = [
        m for name, m in list(sys.modules.items()) if name.startswith("model") and vars(m).get("takes_cpu_path") is real
    ]
    from model.attention.kernels.block_gather import gather

    emulation = Emulation(gpu)
    saved_sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = emulation.sdpa
    fused = torch.ops.sparsebert_emulation.fused_sdpa.default
    kept = getattr(gather, "KEPT_OPS", set())  # selective checkpointing keeps the fused op's output, as CUDA's
    added = fused not in kept
    kept.add(fused)
    for m in holders:
        m.takes_cpu_path = lambda where: False
    try:
        yield emulation
    finally:
        F.scaled_dot_product_attention = saved_sdpa
        if added:
            kept.discard(fused)
        for m in holders:
            m.takes_cpu_path = real


def predicted_backend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float, gpu: EmulatedGPU
) -> str:
    """The backend torch picks for these inputs on ``gpu`` under the enabled backends (raises like torch if none)."""
    return select_backend(_Params(q, k, v, mask, dropout_p), gpu)


def gpu_of_this_machine() -> EmulatedGPU:
    """The real GPU's profile (capability; cuDNN preference as torch decides it on sm90/sm100)."""
    cap = torch.cuda.get_device_capability()
    return EmulatedGPU(torch.cuda.get_device_name(), cap, prefer_cudnn=cap[0] in (9, 10))
