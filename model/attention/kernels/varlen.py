"""The varlen route of full (dense) attention over packed rows: FlashAttention's variable-length kernel through
torch, one launch over every document of the batch, no ``[B, 1, N, N]`` same-document mask and no key mask.

A packed batch carries ``cu_seqlens`` (``[S + 1]``, int32 in the model, made once per batch on the host by the collator,
data_pipeline/collate.py ``segment_offsets``): the token offsets, in the batch's flattened ``B * N`` tokens, where
each run of equal document ids starts, the tail of padding of a row (id -1) being one more run, and ``B * N`` last.
Attention within each run is exactly the same-document mask's attention (the padding run attends to itself only;
its outputs carry no label). The longest run is at most N, which is passed as the kernels' ``max_seqlen`` (an upper
bound they accept; a constant, so the compiled step does not specialise on it).

On CUDA from sm80 (FlashAttention's kernels need Ampere or newer; a T4 or a V100 is refused), in fp16/bf16:
``torch.nn.attention.varlen.varlen_attn`` without attention dropout (it has none); with dropout, torch's
``aten._flash_attention_forward`` (the op varlen_attn wraps, which takes a dropout probability and has its own
backward): the dropout is applied in the kernel (Philox, as SDPA's flash backend). Elsewhere (CPU, fp32, deterministic
algorithms, an older torch) the route is refused (:func:`varlen_refusal` says why) and dense applies the same-document
mask instead: exact, the reference. :func:`per_segment_attention` is the route's reference: one SDPA call per run
(tests/test_varlen.py checks the route against it and against the mask).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from model.attention.sdpa_backend import flash_hardware_refusal
from model.cpu_shortcuts import takes_cpu_path

try:
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # torch < 2.10
    _varlen_attn = None

_VARLEN_TAKES_SCALE = _varlen_attn is not None and "scale" in inspect.signature(_varlen_attn).parameters


def _device_of(q_BHND: torch.Tensor) -> tuple[str, tuple[int, int] | None]:
    """The device type ``q_BHND`` runs on and its CUDA compute capability (None off CUDA); tests replace it to
    emulate a GPU on CPU tensors."""
    if takes_cpu_path(q_BHND):
        return "cpu", None
    device = q_BHND.device
    return device.type, torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def varlen_refusal(q_BHND: torch.Tensor, dropout_p: float) -> str | None:
    """Why the varlen route cannot run for ``q_BHND`` (None: it can); :func:`refusal` on its metadata."""
    device, capability = _device_of(q_BHND)
    return refusal(device, q_BHND.dtype, q_BHND.shape[-1], dropout_p, capability)


def refusal(
    device_type: str,
    dtype: torch.dtype,
    head_size: int,
    dropout_p: float,
    capability: tuple[int, int] | None = None,
) -> str | None:
    """Why the varlen route cannot run (None: it can): FlashAttention's varlen kernel needs a CUDA device of compute
    capability sm80..sm121 (``capability``; None on CUDA reads this machine's GPU), fp16/bf16, a head size that is a
    multiple of 8 and at most 256; its backward accumulates with atomics, so not under deterministic algorithms
    (``--deterministic``)."""
    if device_type != "cuda":
        return f"{device_type}: FlashAttention's varlen kernel runs on CUDA only"
    hardware = flash_hardware_refusal(torch.cuda.get_device_capability() if capability is None else capability)
    if hardware:
        return f"FlashAttention's varlen kernel: {hardware}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"{dtype}: FlashAttention's varlen kernel takes fp16/bf16 only"
    if head_size % 8 or head_size > 256:
        return f"head size {head_size}: FlashAttention's varlen kernel needs a multiple of 8, at most 256"
    if torch.are_deterministic_algorithms_enabled():
        return "deterministic algorithms: FlashAttention's backward is not deterministic"
    if dropout_p == 0.0 and _varlen_attn is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    return None


def route_line(
    device_type: str,
    dtype: torch.dtype,
    head_size: int,
    dropout_p: float,
    capability: tuple[int, int] | None = None,
) -> str:
    """The start-up line for packed rows of full attention (what :func:`refusal` decides, with the same
    ``capability``, so the line never announces a route the first forward would refuse)."""
    why = refusal(device_type, dtype, head_size, dropout_p, capability)
    if why is not None:
        return f"packed rows: dense attention applies the same-document mask ({why})"
    if dropout_p > 0:
        return (
            f"packed rows: dense attention runs FlashAttention's varlen kernel over cu_seqlens (no N x N mask) with "
            f"attention dropout {dropout_p} in the kernel, through torch's aten._flash_attention_forward "
            "(torch.nn.attention.varlen.varlen_attn has no dropout)"
        )
    return "packed rows: dense attention runs torch.nn.attention.varlen.varlen_attn over cu_seqlens (no N x N mask)"


def _flat(t_BHND: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, D]`` -> ``[B * N, H, D]`` (a view for the encoder's q/k/v, which are views of one qkv tensor)."""
    B, H, N, D = t_BHND.shape
    return t_BHND.transpose(1, 2).reshape(B * N, H, D)


def varlen_attention(
    q_BHND: torch.Tensor,
    k_BHND: torch.Tensor,
    v_BHND: torch.Tensor,
    cu_seqlens: torch.Tensor,
    dropout_p: float,
    scale: float | None,
) -> torch.Tensor:
    """Attention within each run of ``cu_seqlens`` over the flattened batch, through torch's FlashAttention varlen
    kernel (CUDA; check :func:`varlen_refusal` first). Returns ``[B, H, N, D]``."""
    B, H, N, D = q_BHND.shape
    q, k, v = _flat(q_BHND), _flat(k_BHND), _flat(v_BHND)
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    return _flash_varlen(q, k, v, cu, N, dropout_p, scale).view(B, N, H, D).transpose(1, 2)


def _flash_varlen(
    q_THD: torch.Tensor,
    k_THD: torch.Tensor,
    v_THD: torch.Tensor,
    cu: torch.Tensor,
    N: int,
    dropout_p: float,
    scale: float | None,
) -> torch.Tensor:
    """torch's FlashAttention varlen call on ``[T, H, D]`` tensors (tests replace it to check what it is given)."""
    if dropout_p > 0.0:
        flash = torch.ops.aten._flash_attention_forward
        return flash(q_THD, k_THD, v_THD, cu, cu, N, N, dropout_p, False, False, scale=scale)[0]
    if scale is None or _VARLEN_TAKES_SCALE:
        return _varlen_attn(q_THD, k_THD, v_THD, cu, cu, N, N, **({} if scale is None else {"scale": scale}))
    return _varlen_attn(q_THD * (scale * q_THD.shape[-1] ** 0.5), k_THD, v_THD, cu, cu, N, N)  # older: no scale


def per_segment_attention(
    q_BHND: torch.Tensor,
    k_BHND: torch.Tensor,
    v_BHND: torch.Tensor,
    cu_seqlens: torch.Tensor,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """The varlen route's reference on any device: one SDPA call per run of ``cu_seqlens`` (reads the offsets on
    the host). Returns ``[B, H, N, D]``."""
    B, H, N, D = q_BHND.shape
    q, k, v = _flat(q_BHND), _flat(k_BHND), _flat(v_BHND)
    offsets = cu_seqlens.tolist()
    parts = []
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        seg = [t[lo:hi].transpose(0, 1) for t in (q, k, v)]  # [H, n, D]
        parts.append(F.scaled_dot_product_attention(*seg, dropout_p=dropout_p, scale=scale).transpose(0, 1))
    return torch.cat(parts).view(B, N, H, D).transpose(1, 2)
