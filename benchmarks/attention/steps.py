"""The measured step every timing measure shares, and how it is timed and its memory counted.

A step is one attention call forward and backward under training's conditions, the same for the case and for its
dense baseline: q, k and v are views of one fused ``[B, N, 3, H, D]`` projection (as model/bert.py makes them, so a
kernel that needs contiguous inputs pays its copies here as in training), the output is read as ``[B, N, H * D]``
(what the output projection reads: a copy where a kernel returns another memory layout), and both sides run the same
attention dropout (``--dropout``) and neither has a mask the other lacks (a case's own mask or bias is what it
measures).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(q, k, v) -> out``, all ``[B, H, N, D]``."""


def fused_qkv(
    batch: int, heads: int, n: int, head_dim: int, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> torch.Tensor:
    """The ``[B, N, 3, H, D]`` leaf a step's q, k and v are views of (the output of training's fused projection)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, 3, heads, head_dim, generator=g).to(device, dtype).requires_grad_()


def heads_of(qkv_BN3HD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``[B, H, N, D]``: views of the fused projection, as model/bert.py's ``BertSelfAttention`` makes them."""
    q_BHND, k_BHND, v_BHND = qkv_BN3HD.permute(2, 0, 3, 1, 4)
    return q_BHND, k_BHND, v_BHND


def make_step(fn: Attention, qkv_BN3HD: torch.Tensor) -> Callable[[], None]:
    """One forward + backward of ``fn`` under training's conditions (module docstring); the gradient is dropped."""
    B, N, _, H, D = qkv_BN3HD.shape
    go_BNC = torch.randn(B, N, H * D, generator=torch.Generator().manual_seed(1)).to(qkv_BN3HD)

    def step() -> None:
        out_BHND = fn(*heads_of(qkv_BN3HD))
        torch.autograd.backward(out_BHND.transpose(1, 2).reshape(B, N, H * D), go_BNC)
        qkv_BN3HD.grad = None

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def paired_times(
    step: Callable[[], None], baseline: Callable[[], None], device: torch.device, repeats: int
) -> dict[str, float]:
    """Median and best (minimum) seconds of ``step`` and of ``baseline``, run alternately so that load from other
    processes on a shared machine hits both alike. The best-of-N ratio is the least noisy estimate on a loaded box
    (load only ever adds time); the median ratio is reported next to it."""
    step()
    baseline()
    ts, tb = [], []
    for _ in range(repeats):
        for fn, acc in ((step, ts), (baseline, tb)):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            acc.append(time.perf_counter() - t0)
    return dict(
        time_s=statistics.median(ts), dense_time_s=statistics.median(tb), time_best_s=min(ts), dense_time_best_s=min(tb)
    )


def cpu_allocations(fn: Callable[[], Any]) -> tuple[int, int, Any]:
    """(retained bytes, peak bytes, fn's result) of one call on CPU: ``torch.profiler``'s allocation and free events
    (``profile_memory=True``) replayed in time order; retained is the running sum at the end, peak its maximum."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return cur, peak, out


def peak_memory_mib(step: Callable[[], None], device: torch.device) -> float:
    """Peak MiB the step allocates beyond what existed before it: on CUDA ``max_memory_allocated`` minus what was
    allocated before; on CPU (no allocator counter) :func:`cpu_allocations`' peak."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        sync(device)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    return cpu_allocations(step)[1] / 2**20


def machine(device: str) -> str:
    """The processor (and GPU) and torch version a result was measured on."""
    import platform

    desc = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    if device.startswith("cuda"):
        desc = f"{torch.cuda.get_device_name()} ({desc})"
    return desc
