"""``--measure profile``: where the training step's time goes: the step of ``--measure time`` (DeepSpeed's engine,
the trainer's own batches and inputs) under torch.profiler, in step variants side by side.

Per variant: the top kernels (CUDA kernels on a GPU, aten operators on CPU) with their share of the step's wall
time, the device's busy fraction (kernel time / wall time), host syncs per step and where they are made, peak
memory, tokens/s, TFLOP/s and MFU (model/flops.py, pretrain/throughput.py), and the kernel ``auto`` chose. The first
variant's profiled steps are written as a chrome trace (``--trace``, gzipped when the name ends in .gz) to study
afterwards (chrome://tracing, https://ui.perfetto.dev).

Variants (:data:`STEP_VARIANTS`, in priority order: the most informative first) differ from the base (N=512, batch
32, ZeRO-1, attention dropout 0.1, --sample-mode rows with an attention mask where padded, eager) in one setting
each: compiled (torch.compile through the engine, as the trainer's --compile), batch x2 and x4, attention dropout 0
(``dropout0``: the hidden dropout stays 0.1, as run_scripts/common.sh's RECIPE=fast; cuDNN's attention then draws no
Philox mask, torch 2.11 runs cuDNN with dropout too), packed rows (--sample-mode packed-docs: no padding, document
masks), ZeRO-0 and ZeRO-2, and two bf16 ds_configs against the base's zero1_bf16.json: zero1_overlap (DeepSpeed's
per-parameter gradient hooks, zero1_bf16_overlap.json) and zero0_autocast (zero0_bf16_autocast.json); last, the
combinations issue #47 asks about: compiled_dropout0, packed_dropout0 (packed rows run the varlen kernel without
dropout: varlen_attn), packed_compiled, packed_compiled_dropout0; and fused_norm (--residual-norm triton: dropout +
residual + LayerNorm in one Triton kernel each way, eager only); head_main, the MLM head as it was before issue #47
(unpadded vocabulary, plain loss, 128 slots at N=512), for the side-by-side.
``--budget-s`` (or, under benchmarks/gpu_check.py, the step's deadline it is given in $GPU_CHECK_STEP_DEADLINE)
bounds the run: a variant is started only when the time left exceeds the longest variant so far (compiled: twice
that, at least --compile-estimate-s), the JSON is rewritten after each, so a run stops cleanly with what it has.

Host syncs: on CUDA ``torch.cuda.set_sync_debug_mode("warn")`` is on during the counted step and every warning is
counted at the Python line that made it; on CPU (no such mode) benchmarks/support/host_syncs.py counts what that mode
would flag (value reads and blocking copies of tensors that would live on the device, data-dependent shapes, DeepSpeed's
accelerator ``synchronize``), by function.
"""

from __future__ import annotations

import os
import re
import statistics
import time
import warnings
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import torch

from benchmarks.report import markdown_table
from benchmarks.step.case import Case
from benchmarks.step.engine import TrainStep, sync
from common.process import STEP_DEADLINE_ENV
from pretrain.throughput import peak_tflops

TOP_KERNELS = 15
STEP_VARIANTS: dict[str, dict] = {
    "eager": {},
    "zero1_overlap": {"ds_config": "zero1_bf16_overlap.json"},
    "zero0_autocast": {"ds_config": "zero0_bf16_autocast.json", "zero": 0},
    "compiled": {"compile": True},
    "batch_x2": {"batch_factor": 2},
    "batch_x4": {"batch_factor": 4},
    "dropout0": {"attention_dropout": 0.0},
    "packed": {"sample_mode": "packed-docs"},
    "zero0": {"zero": 0},
    "zero2": {"zero": 2},
    "compiled_dropout0": {"compile": True, "attention_dropout": 0.0},
    "packed_dropout0": {"sample_mode": "packed-docs", "attention_dropout": 0.0},
    "packed_compiled": {"sample_mode": "packed-docs", "compile": True},
    "packed_compiled_dropout0": {"sample_mode": "packed-docs", "compile": True, "attention_dropout": 0.0},
    "fused_norm": {"residual_norm": "triton"},
    "head_main": {"mlm_head": "main"},
}
"""Variant name (``--variants`` of ``--measure profile``) -> what it changes from the base case; the order is the
priority order. A variant with a ``ds_config`` names a bf16 file (``--measure host`` counts their host work on CPU):
run with bf16 only."""
MARGIN_S = 5.0
"""Kept back before the deadline to write the JSON and leave."""


def variant_case(name: str, base: Case) -> Case:
    """The :class:`Case` of variant ``name``: the base with its one change."""
    change = dict(STEP_VARIANTS[name])
    factor = change.pop("batch_factor", 1)
    return replace(base, batch=base.batch * factor, **change)


class SyncCounter:
    """Counts host syncs made inside ``with counter:`` by site (module docstring: CUDA's sync debug mode; on CPU
    benchmarks/support/host_syncs.py)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sites: Counter[str] = Counter()

    def __enter__(self) -> "SyncCounter":
        if self.device.type == "cuda":
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            return self
        from benchmarks.support.host_syncs import HostSyncCounter

        self._counter = HostSyncCounter(skip=(Path(__file__),))
        self._counter.sites = self.sites
        self._counter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
            for w in self._caught:
                if "synchroniz" in str(w.message):
                    path = Path(w.filename)
                    where = path.name
                    if "deepspeed" in path.parts:
                        where = "(deepspeed) " + str(Path(*path.parts[path.parts.index("deepspeed") + 1 :]))
                    self.sites[f"{where}:{w.lineno}"] += 1
            self._warnings.__exit__(*exc)
            return
        self._counter.__exit__(*exc)


def profile_summary(prof, device: torch.device, wall_s: float, steps: int) -> dict:
    """Top kernels with their share of the wall time, and the busy fraction, from a finished profiler."""
    from torch.autograd import DeviceType

    rows = []
    for e in prof.key_averages():
        if device.type == "cuda":
            if e.device_type != DeviceType.CUDA:
                continue
            us = getattr(e, "self_device_time_total", 0) or 0
        else:
            if e.device_type != DeviceType.CPU or e.key.startswith("ProfilerStep"):
                continue
            us = e.self_cpu_time_total
        if us > 0:
            rows.append((e.key, us, e.count))
    busy_us = sum(us for _, us, _ in rows)
    rows.sort(key=lambda r: -r[1])
    top = [
        {"name": k[:160], "ms_per_step": us / 1e3 / steps, "share": us / 1e6 / wall_s, "calls_per_step": n / steps}
        for k, us, n in rows[:TOP_KERNELS]
    ]
    return {"top_kernels": top, "busy_fraction": busy_us / 1e6 / wall_s, "kernels_total": len(rows)}


ATTENTION_OPS = re.compile(
    r"scaled_?dot_?product|flash_?attention|efficient_?attention|cudnn_?attention|flex_?attention", re.IGNORECASE
)
"""The attention core's operators and autograd nodes by name (SDPA and its fused backends, forward and backward,
eager or from a compiled graph; FlexAttention)."""
BACKWARD_NODE = "autograd::engine::evaluate_function: "
"""torch.profiler's name prefix of an autograd node run in the backward."""


def _time_us(e, device: torch.device) -> float:
    """An event's inclusive time: its kernels' device time on a GPU, its CPU time (children included) on CPU."""
    return (e.device_time_total if device.type == "cuda" else e.cpu_time_total) or 0.0


def attention_events(events) -> list:
    """The profile's events that are the attention core, each counted once (none inside another): every outermost
    operator named as :data:`ATTENTION_OPS` says, and every backward autograd node whose forward ran inside one
    (matched by autograd's sequence number and forward thread: SDPA's math backend, CPU's path under dropout,
    records its backward as BmmBackward0, SafeSoftmaxBackward0, ... which no name gives away)."""
    events = list(events)
    forward_seq: set[tuple[int, int | None]] = set()

    def collect(e) -> None:
        if e.sequence_nr is not None and e.sequence_nr >= 0:
            forward_seq.add((e.sequence_nr, e.thread))
        for c in e.cpu_children:
            collect(c)

    named = [e for e in events if ATTENTION_OPS.search(e.name)]
    for e in named:
        if not e.name.startswith(BACKWARD_NODE):
            collect(e)
    by_seq = [
        e
        for e in events
        if e.name.startswith(BACKWARD_NODE)
        and e.sequence_nr is not None
        and (e.sequence_nr, e.fwd_thread if e.fwd_thread is not None else e.thread) in forward_seq
    ]
    chosen = {id(e): e for e in named + by_seq}

    def outermost(e) -> bool:
        p = e.cpu_parent
        while p is not None:
            if id(p) in chosen:
                return False
            p = p.cpu_parent
        return True

    return [e for e in chosen.values() if outermost(e)]


def attention_seconds(prof, device: torch.device, steps: int) -> float:
    """Seconds per step the attention core took in a finished profile of ``steps`` steps (:func:`attention_events`):
    kernel time on a GPU, operator time on CPU."""
    return sum(_time_us(e, device) for e in attention_events(prof.events())) / 1e6 / steps


def profile_variant(name: str, case: Case, args, device: torch.device, trace: str | None) -> dict:
    """Build the step, warm it up, profile ``args.steps`` steps (wall time synchronised around them), count the host
    syncs of one more step; the row of the report."""
    from torch.profiler import ProfilerActivity, profile

    from pretrain.trainer import peak_memory_mb

    t0 = time.perf_counter()
    ts = TrainStep(case, args, device)
    try:
        for _ in range(args.warmup):
            ts.step()
        sync(device)
        setup_s = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        times = []
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                sync(device)
                s0 = time.perf_counter()
                ts.step()
                sync(device)
                times.append(time.perf_counter() - s0)
        if trace:
            prof.export_chrome_trace(trace)
        counter = SyncCounter(device)
        with counter:
            ts.step()
        sync(device)
        step_s = statistics.median(times)
        tokens = statistics.mean(ts.real_tokens)
        tflops = ts.flops_per_token * tokens / step_s / 1e12
        peak = peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        row = {
            "variant": name,
            "case": asdict(case) | {"batch": ts.batch},
            "setup_s": setup_s,
            "step_s": step_s,
            "tokens_per_s": tokens / step_s,
            "padding_share": 1 - tokens / (ts.batch * case.seq_len),
            "flops_per_token": ts.flops_per_token,
            "predicted_share": ts.predicted,
            "density": ts.density,
            "tflops": tflops,
            "mfu": tflops / peak if peak else None,
            "peak_memory_mib": peak_memory_mb(device),
            "kernel_used": ts.kernels_used() or args.kernel,
            "host_syncs_per_step": sum(counter.sites.values()),
            "host_sync_sites": dict(counter.sites.most_common()),
            **profile_summary(prof, device, sum(times), len(times)),
        }
        if trace:
            row["trace"] = trace
        return row
    finally:
        ts.close()


def _deadline(args) -> float | None:
    """Epoch seconds to be done by: --budget-s from now, or gpu_check's step deadline (the earlier), less a margin."""
    ends = [time.time() + args.budget_s] if args.budget_s else []
    if os.environ.get(STEP_DEADLINE_ENV):
        ends.append(float(os.environ[STEP_DEADLINE_ENV]))
    return min(ends) - MARGIN_S if ends else None


def run(args, device: torch.device, name: str, write) -> dict:
    """Every variant in priority order while the time allows; ``write(result)`` after each."""
    deadline = _deadline(args)
    base = Case(precision=args.precision, seq_len=args.seq_len, batch=args.batch)
    result = {"device": name, "preset": args.model_preset, "rows": [], "left_out": [], "complete": False}
    longest = 0.0
    for v in args.variants:
        case = variant_case(v, base)
        if case.ds_config and case.precision != "bf16":
            result.setdefault("not_run", {})[v] = f"{case.ds_config} is a bf16 config; this run is {case.precision}"
            print(f"[step profile] not run {v}: {result['not_run'][v]}", flush=True)
            continue
        need = max(2 * longest, args.compile_estimate_s) if case.compile else longest
        if deadline is not None and time.time() + need > deadline:  # a later, cheaper variant may still fit
            result["left_out"].append(v)
            print(f"[step profile] left out {v}: {need:.0f} s needed, {deadline - time.time():.0f} s left", flush=True)
            continue
        t0 = time.time()
        try:
            row = profile_variant(v, case, args, device, args.trace if not result["rows"] else None)
        except Exception as e:  # one variant failing must not hide the others
            row = {"variant": v, "case": asdict(case), "error": f"{type(e).__name__}: {e}"}
        longest = max(longest, time.time() - t0)
        result["rows"].append(row)
        print("[step profile] " + row_line(row), flush=True)
        write(result)
    result["complete"] = not result["left_out"]
    return result


def row_line(r: dict) -> str:
    """One line per variant for the console and gpu_check's summary."""
    if "error" in r:
        return f"{r['variant']}: FAILED {r['error']}"
    mfu = "" if r.get("mfu") is None else f", MFU {100 * r['mfu']:.1f}%"
    return (
        f"{r['variant']} (b={r['case']['batch']}): {r['step_s'] * 1e3:.1f} ms{mfu}, busy "
        f"{100 * r['busy_fraction']:.0f}%, {r['host_syncs_per_step']} host syncs/step"
    )


def _shown(r: dict) -> dict:
    """A row's cells for the variants table."""
    c = r["case"]
    return r | {
        "seq_len": c["seq_len"],
        "batch": c["batch"],
        "zero": f"{c['zero']} (`{c['ds_config']}`)" if c.get("ds_config") else c["zero"],
        "attention_dropout": c["attention_dropout"],
        "rows": "packed" if c.get("sample_mode") == "packed-docs" else f"padded ({100 * r['padding_share']:.0f}% pad)",
        "compiled": "yes" if c["compile"] else "no",
        "mfu": "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
    }


VARIANT_COLUMNS = [
    ("variant", "variant"),
    ("seq_len", "N"),
    ("batch", "batch"),
    ("zero", "ZeRO"),
    ("attention_dropout", "attn dropout"),
    ("rows", "rows"),
    ("compiled", "compiled"),
    ("kernel_used", "kernel"),
    ("step_s", "ms", lambda s: f"{1e3 * s:.1f}"),
    ("tokens_per_s", "tokens/s", ".0f"),
    ("tflops", "TFLOP/s", ".3g"),
    ("mfu", "MFU"),
    ("busy_fraction", "busy", lambda f: f"{100 * f:.0f}%"),
    ("host_syncs_per_step", "host syncs/step"),
    ("peak_memory_mib", "peak MiB", ".0f"),
]
KERNEL_COLUMNS = [
    ("name", "kernel", lambda n: f"`{n.replace('|', '/')[:100]}`"),
    ("ms_per_step", "ms/step", ".2f"),
    ("share", "share", lambda s: f"{100 * s:.1f}%"),
    ("calls_per_step", "calls/step", "g"),
]


def markdown(result: dict) -> list[str]:
    """The report's profile section: the variants side by side, then the first variant's top kernels."""
    rows = [r for r in result.get("rows", []) if "error" not in r]
    if not rows:
        return []
    first = rows[0]
    out = [
        "",
        f"### Step profile ({result.get('device')}, {result.get('preset')}; wall time per step, kernel time / wall)",
    ]
    out += ["", *markdown_table([_shown(r) for r in rows], VARIANT_COLUMNS)]
    out += [
        "",
        f"Top kernels of `{first['variant']}` ({first['kernels_total']} distinct; share of the step's wall time):",
    ]
    out += ["", *markdown_table(first["top_kernels"], KERNEL_COLUMNS)]
    sites = ", ".join(f"{s} x{n}" for s, n in first["host_sync_sites"].items()) or "none"
    out += ["", f"Host syncs of `{first['variant']}` per step, by site: {sites}."]
    if result.get("left_out"):
        out += ["", f"Left out at the time limit: {', '.join(result['left_out'])}."]
    return out
