"""Which backend torch's scaled_dot_product_attention takes on a CUDA GPU, predicted from the inputs' properties.

Backend selection follows ``select_sdp_backend`` in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: the
priority order (cuDNN first on sm90/sm100 with a recent cuDNN, see ``check_prefer_cudnn_attention``; then flash,
memory-efficient, math), each backend's ``can_use_*`` filters, the backends enabled by
``torch.nn.attention.sdpa_kernel``, and "No available kernel. Aborting execution." when none is left. The rules
were read from torch's main branch (2.1x). Only tensor metadata is read (dtype, shape, strides, requires_grad), so
meta or CPU tensors stand in for CUDA ones: the trainer's start-up line (:func:`dense_training_backends`) and
benchmarks/support/cuda_emulation.py (its CUDA emulation on CPU) ask the same rules; tests/test_cuda_contracts.py
checks them against ``torch._fused_sdp_choice`` on a real GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BACKENDS = ("cudnn", "flash", "efficient", "math")
"""torch's SDPA backends on CUDA, in the order ``priority_order`` tries them when cuDNN is preferred."""


@dataclass(frozen=True)
class GPUProfile:
    """What backend selection reads from the device (``cudaDeviceProp`` and the cuDNN build)."""

    name: str
    capability: tuple[int, int]
    prefer_cudnn: bool
    """cuda/sdp_utils.cpp ``check_prefer_cudnn_attention``: cuDNN first on sm90/sm100 with cuDNN > 9.15.0."""


H100 = GPUProfile("H100", (9, 0), prefer_cudnn=True)
A100 = GPUProfile("A100", (8, 0), prefer_cudnn=False)
V100 = GPUProfile("V100", (7, 0), prefer_cudnn=False)
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
class SDPAParams:
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


def _common_refusal(p: SDPAParams, ignore_singleton_last_dim: bool) -> str | None:
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


def _same_dtype(p: SDPAParams, allowed: tuple[torch.dtype, ...]) -> str | None:
    """sdp_utils_cpp.h ``check_tensor_dtype``."""
    if not (p.q.dtype == p.k.dtype == p.v.dtype and p.q.dtype in allowed):
        return f"q/k/v dtype {p.q.dtype} is not one of {allowed}"
    return None


FLASH_CAPABILITIES = ((8, 0), (12, 1))
"""The compute capabilities FlashAttention's kernels run on (cuda/sdp_utils.cpp
``check_flash_attention_hardware_support``); its varlen kernel (model/attention/kernels/varlen.py) is the same
build, so the same range."""


def flash_hardware_refusal(capability: tuple[int, int]) -> str | None:
    """Why FlashAttention cannot run on a GPU of ``capability`` (None: it can), e.g. a T4 (sm75) or a V100 (sm70)."""
    lo, hi = FLASH_CAPABILITIES
    if not lo <= tuple(capability) <= hi:
        return f"flash needs sm80..sm121, this is sm{capability[0]}{capability[1]}"
    return None


def flash_refusal(p: SDPAParams, gpu: GPUProfile) -> str | None:
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
    hardware = flash_hardware_refusal(gpu.capability)
    if hardware:
        return hardware
    sm86_89 = (8, 6) <= gpu.capability <= (8, 9) or (12, 0) <= gpu.capability <= (12, 1)
    if sm86_89 and p.requires_grad and not (d[0] <= 192 or (p.dropout == 0 and d[0] > 224)):
        return "flash cannot train head dims in (192, 224] on sm86/89/120"
    why = _same_dtype(p, (torch.float16, torch.bfloat16))
    return why or _common_refusal(p, ignore_singleton_last_dim=True)


def minimum_gemm_alignment(q: torch.Tensor, gpu: GPUProfile) -> int:
    """cuda/sdp_utils.cpp ``minimum_gemm_alignment``: elements the CUTLASS GEMMs of memory-efficient attention
    need (4 from sm80; 128 bits, i.e. 8 half or 4 float, where tensor cores run: sm80+, or sm70+ in half)."""
    tensor_cores = gpu.capability[0] >= 8 or (gpu.capability[0] >= 7 and _half(q))
    align = 4 if gpu.capability[0] >= 8 else 1
    if tensor_cores:
        align = max(align, 128 // (16 if _half(q) else 32))
    return align


def efficient_refusal(p: SDPAParams, gpu: GPUProfile) -> str | None:
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


def cudnn_refusal(p: SDPAParams, gpu: GPUProfile) -> str | None:
    """Why cuDNN attention cannot run. cuda/sdp_utils.cpp ``can_use_cudnn_attention``: not under deterministic
    algorithms (``check_cudnn_deterministic``), fp16/bf16 (``check_dtypes_low_precision``), a mask of shape
    ``[Q|1, K|1]`` or ``[B|1, H|1, Q|1, K|1]`` that does not require grad (sdp_utils_cpp.h
    ``check_attn_mask_shape``: a learned DIET bias is refused), sm80..sm121, head dims <= 128 (256 on sm90/sm10x
    with cuDNN > 9.22) and multiples of 8, key length != 1 (``check_cudnn_tensor_shapes``).

    No dropout rule: older torch refused a dropout that is not a multiple of 1/16 (``check_cudnn_dropout``), but
    torch 2.11.0+cu130 with cuDNN 9.19 on an H200 picked cuDNN for dropout 0.1, with and without a boolean key mask
    (measured 2026-11-27: docs/gpu_reports/2026-11-27-h200-direct/sdpa_backend.txt); torch 2.11 is our floor."""
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
    limit = 256 if gpu.capability[0] in (9, 10) else 128
    dq, dv = p.q.shape[-1], p.v.shape[-1]
    if dq > limit or dv > limit or dq % 8 or dv % 8:
        return f"cuDNN attention needs head dims <= {limit} and multiples of 8"
    if p.k.shape[2] == 1:
        return "cuDNN attention refuses key length 1"
    return _common_refusal(p, ignore_singleton_last_dim=True)


REFUSALS = {"cudnn": cudnn_refusal, "flash": flash_refusal, "efficient": efficient_refusal}


def priority_order(gpu: GPUProfile) -> tuple[str, ...]:
    """cuda/sdp_utils.cpp ``priority_order``: flash, efficient, (cuDNN,) math by default; cuDNN first where
    ``check_prefer_cudnn_attention`` holds."""
    if gpu.prefer_cudnn:
        return ("cudnn", "flash", "efficient", "math")
    return ("flash", "efficient", "cudnn", "math")


def select_backend(p: SDPAParams, gpu: GPUProfile) -> str:
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


def refusals(p: SDPAParams, gpu: GPUProfile) -> list[str]:
    """``"backend: why"`` for each enabled fused backend tried before the one :func:`select_backend` picks."""
    chosen = select_backend(p, gpu)
    out = []
    for name in priority_order(gpu):
        if name == chosen:
            break
        if name in enabled_backends() and name != "math":
            out.append(f"{name}: {REFUSALS[name](p, gpu)}")
    return out


def predicted_backend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float, gpu: GPUProfile
) -> str:
    """The backend torch picks for these inputs on ``gpu`` under the enabled backends (raises like torch if none)."""
    return select_backend(SDPAParams(q, k, v, mask, dropout_p), gpu)


def gpu_of_this_machine() -> GPUProfile:
    """The real GPU's profile (capability; cuDNN preference as torch decides it on sm90/sm100)."""
    cap = torch.cuda.get_device_capability()
    return GPUProfile(torch.cuda.get_device_name(), cap, prefer_cudnn=cap[0] in (9, 10))


def torch_choice(q: torch.Tensor, mask: torch.Tensor | None, dropout_p: float) -> str:
    """The backend torch itself picks for self-attention on ``q`` (a CUDA tensor): ``torch._fused_sdp_choice``."""
    names = {int(v): k for k, v in torch.nn.attention.SDPBackend.__members__.items()}
    name = names.get(int(torch._fused_sdp_choice(q, q, q, mask, dropout_p, False)), "unknown")
    return {"CUDNN_ATTENTION": "cudnn", "FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient"}.get(
        name, name.lower()
    )


def dense_training_backends(
    batch: int,
    heads: int,
    seq_len: int,
    head_size: int,
    dtype: torch.dtype,
    dropout_p: float,
    gpu: GPUProfile,
    ask_torch: bool = False,
) -> str:
    """One line: the backend dense attention's SDPA call takes in training on ``gpu``, for padded batches (a boolean
    key mask ``[B, 1, 1, N]``, as model/attention/kernels/sdpa.py passes it) and for batches without padding (the
    trainer drops their mask), each with why the backends torch prefers refused. ``ask_torch`` (on a real GPU): the
    backend is torch's own choice for one row of that shape, and a disagreement with these rules is said in the
    line (the rules are then out of date for this torch)."""
    device = "cuda" if ask_torch else "meta"
    rows = 1 if ask_torch else batch
    q = torch.zeros(rows, seq_len, heads, head_size, dtype=dtype, device=device).transpose(1, 2).requires_grad_()
    mask = torch.ones(rows, 1, 1, seq_len, dtype=torch.bool, device=device)
    parts = []
    with torch.enable_grad():
        for what, m in (("padded batches", mask), ("unpadded", None)):
            p = SDPAParams(q, q, q, m, dropout_p)
            rules = select_backend(p, gpu)
            chosen = torch_choice(q, m, dropout_p) if ask_torch else rules
            why = refusals(p, gpu) if chosen == rules else [f"these rules predicted {rules}: report it"]
            parts.append(f"{what} -> {chosen}" + (f" ({'; '.join(why)})" if why else ""))
    return f"attention on {gpu.name}: SDPA " + ", ".join(parts)
