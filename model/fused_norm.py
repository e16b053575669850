"""``LayerNorm(dropout(x) + residual)`` of a post-LN (BERT) layer, twice per layer: eager (three kernels forward --
dropout, add, LayerNorm -- a stored dropout mask, three backward) or one Triton kernel each way
(ModelConfig.residual_norm 'triton'; the programs are :mod:`model.fused_norm_tl`).

The fused path keeps what eager keeps minus the dropout mask (regenerated from a Philox seed in the backward): the
sum ``z`` in eager's dtype (:func:`eager_dtypes`: under autocast the bf16 sublayer output plus the fp32 residual stream
is fp32, as eager's add promotes) and LayerNorm's per-row mean and 1/std. It runs on CUDA tensors (and on CPU under
Triton's interpreter, ``TRITON_INTERPRET=1``, for the tests), and never while torch.compile traces the model:
Inductor fuses the eager ops into one kernel itself (``triton_per_fused_add_native_dropout_native_layer_norm``), so
the setting is the eager step's. No host sync: the seed stays on the device.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from model.cpu_shortcuts import takes_cpu_path

#: rows each backward program instance walks (their weight and bias gradients summed in fp32, then over instances)
ROWS_PER_PROGRAM = 64
_warned: set[str] = set()


def programs() -> ModuleType | None:
    """The Triton programs, imported on first use by name (an export that copies static imports stays torch-only);
    None where Triton is missing."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        return importlib.import_module("model.fused_norm_tl")
    except ModuleNotFoundError:  # a Hugging Face export of our code: the programs were not copied
        return None


def interpreting() -> bool:
    """Triton runs its interpreter here (CPU tensors): ``TRITON_INTERPRET=1`` (tests/conftest.py on a machine without
    a GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


_MISSING = "Triton's programs are not here"


def refusal(device_type: str, compiling: bool) -> str | None:
    """Why residual_norm 'triton' runs the eager ops instead (None: it runs the kernel) on ``device_type`` ('cpu'
    for tensors on the CPU path), ``compiling``: inside torch.compile's tracing."""
    if compiling:
        return "the model is compiled: Inductor fuses the eager dropout, add and LayerNorm into one kernel itself"
    if device_type == "cpu" and not interpreting():
        return "the kernel runs on CUDA (on a CPU only under Triton's interpreter, TRITON_INTERPRET=1)"
    if device_type not in ("cpu", "cuda"):
        return f"{device_type}: the kernel runs on CUDA"
    if programs() is None:
        return _MISSING
    return None


def route_line(device_type: str, compiled: bool) -> str:
    """The start-up line of a run with residual_norm 'triton': whether the kernel runs, and why not (the setting is
    never dropped silently)."""
    why = refusal(device_type, compiled)
    if why is None:
        return "residual norm: LayerNorm(dropout(x) + residual) in one Triton kernel each way (--residual-norm triton)"
    return f"residual norm: --residual-norm triton runs the eager ops here ({why})"


def fused_applies(x: torch.Tensor, norm: nn.Module) -> bool:
    """Whether this call takes the Triton path: a LayerNorm with a weight and no :func:`refusal` (once warned when
    Triton is missing)."""
    if not isinstance(norm, nn.LayerNorm) or norm.weight is None:
        return False
    why = refusal("cpu" if takes_cpu_path(x) else x.device.type, torch.compiler.is_compiling())
    if why == _MISSING and "missing" not in _warned:
        _warned.add("missing")
        warnings.warn("residual_norm 'triton': Triton's programs are not here; the layers run eager", stacklevel=2)
    return why is None


def eager_dropout_add_norm(
    x: torch.Tensor, residual: torch.Tensor, norm: nn.Module, p: float, training: bool, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """The reference: ``norm(dropout(x) + residual)``; ``keep`` (0/1, x's shape) replaces torch's mask (tests)."""
    if keep is not None and training and p > 0:
        x = x * keep.to(x.dtype) / (1 - p)
    else:
        x = F.dropout(x, p, training)
    return norm(x + residual)


def dropout_add_norm(
    x: torch.Tensor, residual: torch.Tensor, norm: nn.Module, p: float, training: bool, fused: bool
) -> torch.Tensor:
    """``norm(dropout(x, p) + residual)``: the Triton kernel where ``fused`` and :func:`fused_applies`, else eager."""
    if fused and fused_applies(x, norm):
        return FusedDropoutAddNorm.apply(x, residual, norm.weight, norm.bias, p if training else 0.0, norm.eps)
    return eager_dropout_add_norm(x, residual, norm, p, training)


def dropout_seed(device: torch.device) -> torch.Tensor:
    """A Philox seed from torch's generator of ``device`` (so ``torch.manual_seed`` and the checkpointed RNG states
    replay the masks), kept on the device."""
    return torch.randint(0, 2**31 - 1, (1,), device=device, dtype=torch.int64)


def keep_mask(seed: torch.Tensor, shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """The 0/1 mask the kernels draw for ``seed`` (uint8, ``shape``): the tests' bridge to the eager reference."""
    tl_k = programs()
    D = shape[-1]
    M = max(1, int(torch.Size(shape).numel() // D))
    keep = torch.empty(M, D, dtype=torch.uint8, device=device)
    tl_k.keep_kernel[(M,)](keep, seed, D, BLOCK_D=_block(D), DROPOUT_P=float(p))
    return keep.view(shape)


def eager_dtypes(x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """The dtypes eager gives the sum ``dropout(x) + residual`` (type promotion: bf16 + fp32 is fp32, so the residual
    stream stays fp32 under autocast) and LayerNorm's output (fp32 under CUDA autocast, whose float32 op list holds
    layer_norm; else the sum's: CPU autocast leaves layer_norm out)."""
    z = torch.promote_types(x.dtype, residual.dtype)
    autocast_fp32 = x.device.type == "cuda" and torch.is_autocast_enabled("cuda")
    return z, torch.float32 if autocast_fp32 else z


def _block(D: int) -> int:
    return max(16, 1 << (D - 1).bit_length())


class FusedDropoutAddNorm(torch.autograd.Function):
    """``layer_norm(dropout(x) + residual, weight, bias, eps)`` in one Triton program each way."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, p: float, eps: float, seed: torch.Tensor | None = None):
        tl_k = programs()
        shape, D = x.shape, x.shape[-1]
        x2, r2 = x.reshape(-1, D).contiguous(), residual.reshape(-1, D).contiguous()
        M = x2.shape[0]
        if seed is None:
            seed = dropout_seed(x.device) if p > 0 else torch.zeros(1, dtype=torch.int64, device=x.device)
        z_dtype, y_dtype = eager_dtypes(x, residual)
        y = torch.empty_like(x2, dtype=y_dtype)
        z = torch.empty_like(x2, dtype=z_dtype)
        mean = torch.empty(M, dtype=torch.float32, device=x.device)
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        b = weight if bias is None else bias
        tl_k.fwd_kernel[(M,)](
            x2, r2, weight, b, y, z, mean, rstd, seed, D, float(eps), 1.0 / (1.0 - p) if p > 0 else 1.0,
            BLOCK_D=_block(D), DROPOUT_P=float(p), HAS_BIAS=bias is not None, num_warps=_warps(D),
        )  # fmt: skip
        ctx.save_for_backward(z, weight, mean, rstd, seed)
        ctx.p, ctx.has_bias, ctx.shape, ctx.dtypes = p, bias is not None, shape, (x.dtype, residual.dtype)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        tl_k = programs()
        z, weight, mean, rstd, seed = ctx.saved_tensors
        p, shape = ctx.p, ctx.shape
        M, D = z.shape
        dy2 = dy.reshape(-1, D).contiguous()
        dx, dr = (torch.empty_like(z, dtype=dt) for dt in ctx.dtypes)  # each input's own dtype
        programs_ = max(1, -(-M // ROWS_PER_PROGRAM))
        dw = torch.empty(programs_, D, dtype=torch.float32, device=z.device)
        db = torch.empty(programs_, D, dtype=torch.float32, device=z.device)
        tl_k.bwd_kernel[(programs_,)](
            dy2, z, weight, mean, rstd, seed, dx, dr, dw, db, M, D, 1.0 / (1.0 - p) if p > 0 else 1.0,
            BLOCK_D=_block(D), DROPOUT_P=float(p), ROWS=ROWS_PER_PROGRAM, num_warps=_warps(D),
        )  # fmt: skip
        dbias = db.sum(0).to(weight.dtype) if ctx.has_bias else None
        return dx.view(shape), dr.view(shape), dw.sum(0).to(weight.dtype), dbias, None, None, None


def _warps(D: int) -> int:
    """4 warps up to 1024 columns, 8 above (a row per program instance)."""
    return 4 if D <= 1024 else 8
