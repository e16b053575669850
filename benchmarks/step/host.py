"""``--measure host``: the host's cost of a training step, per phase, for each bf16 DeepSpeed config: measured on CPU.

The H200 profile (docs/performance.md) found the bert-base step host-bound: at batch 32 the GPU idles half the step
while the host runs DeepSpeed ZeRO's per-parameter gradient hooks, per-parameter norms and dtype casts. Those are
counted here exactly, without a GPU: every aten operator the step dispatches (a TorchDispatchMode sees each one; a
foreach/fused operator counts once, as it is one launch or a few on a GPU), split by phase:

- ``forward``: the engine's forward (the model, autocast's weight casts);
- ``autograd``: the backward's own operators (run by autograd's engine or a custom Function's backward);
- ``engine_backward``: what DeepSpeed adds to the backward: its gradient hooks, bucket copies and reductions, the
  backward epilogue;
- ``step``: ``engine.step()``: gradient norm, clipping, the optimizer, the master-to-model copy, zero_grad;
- ``other``: the trainer's own work between them (its gradient clipping where ``ResolvedDSConfig.trainer_clips``).

The operators inside torch's optimizer are also counted apart (``ops_in_torch_optimizer``): on CPU torch's AdamW
runs tensor by tensor, on a GPU the trainer's AdamW is fused (a few launches for all tensors: configure_optimizer),
so there a ZeRO-0 step dispatches about ``total - ops_in_torch_optimizer`` operators. (ZeRO 1-2 hand the optimizer
one flat tensor per group: a few operators either way.)

The model is bert-base's layout (12 layers, the same parameter tensors) at a tiny width (``--hidden 64``), batch 1,
N=16 by default: the kernels are then negligible and the wall time per step is the host's per-operator work (the
optimizer's memory traffic of a full-width bert-base would hide it on CPU). The step is the one ``--measure time``
times and ``--measure profile`` profiles (DeepSpeed's engine, the trainer's inputs and its --clip-grad default). Host
ms are the best of ``--steps`` timed steps, without the counter.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.report import markdown_table
from benchmarks.step.case import Case
from benchmarks.step.engine import TrainStep

PHASES = ("forward", "autograd", "engine_backward", "step", "other")
"""The phases of a step an operator is counted in (module docstring)."""
CONFIGS = ("zero1_bf16_overlap.json", "zero1_bf16.json", "zero0_bf16_autocast.json", "zero2_bf16.json")
"""The bf16 ds_configs/ files compared by default, the first the ratios' base: ZeRO-1 with DeepSpeed's per-parameter
gradient hooks (the shipped zero1_bf16.json until 2026-11-27), the shipped ZeRO-1 without them, ZeRO-0 with torch
autocast (fp32 weights, torch's AdamW over whole tensors, the trainer's clipping) and ZeRO-2."""
_AUTOGRAD_RUN = ("_engine_run_backward", "backward", "grad")
_TORCH = os.sep + "torch" + os.sep


def _backward_side() -> str:
    """``autograd`` when the innermost Python frame outside torch is autograd's engine (an operator of the graph) or
    a custom Function of this repository, else ``engine_backward`` (DeepSpeed's hooks and epilogue)."""
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if _TORCH in path:
            if "autograd" in path and f.f_code.co_name in _AUTOGRAD_RUN:
                return "autograd"
        elif os.sep + "deepspeed" + os.sep in path:
            return "engine_backward"
        elif "/model/" in path:
            return "autograd"
        f = f.f_back
    return "engine_backward"


_OPTIM = os.sep.join(("torch", "optim", ""))


def _in_torch_optimizer() -> bool:
    """Inside a torch optimizer's step: on a GPU the shipped AdamW is fused (a few launches for all tensors), on CPU
    torch's default is a loop over the tensors (it defaults to fused/foreach on CUDA only)."""
    f = sys._getframe(2)
    while f is not None:
        if _OPTIM in f.f_code.co_filename:
            return True
        f = f.f_back
    return False


def _deepspeed_site() -> str | None:
    """``file:function`` of the innermost DeepSpeed frame, None when DeepSpeed is not on the stack."""
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if os.sep + "deepspeed" + os.sep in path:
            return f"{path.rsplit(os.sep + 'deepspeed' + os.sep, 1)[1]}:{f.f_code.co_name}"
        f = f.f_back
    return None


class Phases:
    """The phase the step is in (set around the engine's forward, backward and step by :func:`instrument`) and the
    host seconds spent in each."""

    def __init__(self) -> None:
        self.now = "other"
        self.seconds: Counter[str] = Counter()


class OpCounter(TorchDispatchMode):
    """Counts every dispatched aten operator into ``counts[phase][op]``, and DeepSpeed's into ``sites``."""

    def __init__(self, phases: Phases) -> None:
        super().__init__()
        self.phases = phases
        self.counts: dict[str, Counter[str]] = {p: Counter() for p in PHASES}
        self.sites: Counter[str] = Counter()
        self.in_optimizer = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        phase = _backward_side() if self.phases.now == "backward" else self.phases.now
        self.counts[phase][func.overloadpacket.__name__] += 1
        if phase in ("engine_backward", "step", "other"):
            self.sites[f"{phase} {_deepspeed_site()}"] += 1
            self.in_optimizer += _in_torch_optimizer()
        return func(*args, **(kwargs or {}))


def instrument(engine, phases: Phases) -> None:
    """Set ``phases.now`` around the engine's forward, backward and step and time them (instance attributes: the
    trainer's and TrainStep's calls go through them)."""
    for name in ("forward", "backward", "step"):
        real = getattr(engine, name)

        def wrapped(*a, _real=real, _phase=name, **k):
            before, phases.now = phases.now, _phase
            t0 = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                phases.seconds[_phase] += time.perf_counter() - t0
                phases.now = before

        setattr(engine, name, wrapped)


def measure(config: str, args, device: torch.device) -> dict:
    """One config's row: operators per phase of one counted step, host ms per step and per phase (medians of
    ``args.steps`` timed steps)."""
    case = Case(precision="bf16", seq_len=args.seq_len, batch=args.batch, ds_config=config)
    ts = TrainStep(case, args, device)
    try:
        phases = Phases()
        instrument(ts.engine, phases)
        for _ in range(args.warmup):
            ts.step()
        times, split = [], {p: [] for p in ("forward", "backward", "step")}
        for _ in range(args.steps):
            phases.seconds.clear()
            t0 = time.perf_counter()
            ts.step()
            times.append(time.perf_counter() - t0)
            for p in split:
                split[p].append(phases.seconds[p])
        counter = OpCounter(phases)
        with counter:
            ts.step()
        params = sum(1 for p in ts.engine.module.parameters() if p.requires_grad)
        ops = {p: sum(c.values()) for p, c in counter.counts.items()}
        return {
            "config": config,
            "param_tensors": params,
            "host_ms": 1e3 * min(times),
            "host_ms_by_phase": {p: 1e3 * min(v) for p, v in split.items()},
            "ops": ops,
            "ops_total": sum(ops.values()),
            "ops_in_torch_optimizer": counter.in_optimizer,
            "top_ops": {p: dict(c.most_common(args.top)) for p, c in counter.counts.items() if c},
            "deepspeed_sites": dict(counter.sites.most_common(args.top)),
        }
    finally:
        ts.close()


def markdown(result: dict) -> list[str]:
    """The table: aten operators per step by phase and host ms, each with its ratio to the first row."""
    rows = result["rows"]
    base = rows[0]
    shown = [
        r["ops"]
        | {
            "config": r["config"],
            "total": f"{r['ops_total']} ({r['ops_total'] / base['ops_total']:.2f}x)",
            "optimizer": r["ops_in_torch_optimizer"],
            "ms": f"{r['host_ms']:.1f} ({r['host_ms'] / base['host_ms']:.2f}x)",
        }
        for r in rows
    ]
    columns = [("config", "config"), *((p, p) for p in PHASES), ("total", "total")]
    columns += [("optimizer", "of which torch's optimizer"), ("ms", "host ms/step")]
    return [
        f"Host cost of one training step ({result['machine']}; bert-base layout, {base['param_tensors']} parameter "
        "tensors; aten operators dispatched per step, by phase; ratios to the first row)",
        "",
        *markdown_table(shown, columns),
    ]


def run(args, device: torch.device, write) -> dict:
    """Every config's row, ``write(result)`` at the end."""
    import platform

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    result = {"machine": machine, "rows": []}
    for c in args.configs:
        r = measure(c, args, device)
        result["rows"].append(r)
        print(f"[step host] {c}: {r['ops_total']} ops ({r['ops']}), {r['host_ms']:.1f} ms", flush=True)
    write(result)
    return result
