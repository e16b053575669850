"""Where the training step's time goes: the step of benchmarks/train_step_ds.py (DeepSpeed's engine, the trainer's
own batches and inputs) under torch.profiler, in variants side by side.

Per variant: the top kernels (CUDA kernels on a GPU, aten operators on CPU) with their share of the step's wall
time, the device's busy fraction (kernel time / wall time), host syncs per step and where they are made, peak
memory, tokens/s, TFLOP/s and MFU (model/flops.py, pretrain/throughput.py), and the kernel ``auto`` chose. The first
variant's profiled steps are written as a chrome trace (``--trace``, gzipped when the name ends in .gz) to study
afterwards (chrome://tracing, https://ui.perfetto.dev).

Variants (:data:`VARIANTS`, in priority order: the most informative first) differ from the base (N=512, batch 32,
ZeRO-1, attention dropout 0.1, --sample-mode rows with an attention mask where padded, eager) in one setting each:
compiled (torch.compile through the engine, as the trainer's --compile), batch x2 and x4, attention dropout 0 (which
lets SDPA leave its memory-efficient backend), packed rows (--sample-mode packed-docs: no padding, document masks),
ZeRO-0 and ZeRO-2, and two bf16 ds_configs against the base's zero1_bf16.json: zero1_overlap (DeepSpeed's
per-parameter gradient hooks, zero1_bf16_overlap.json) and zero0_autocast (zero0_bf16_autocast.json).
``--budget-s`` (or, under benchmarks/gpu_check.py, the step's deadline it is given in $GPU_CHECK_STEP_DEADLINE)
bounds the run: a variant is started only when the time left exceeds the longest variant so
far (compiled: twice that, at least --compile-estimate-s), the JSON is rewritten after each, so a run stops cleanly
with what it has.

Host syncs: on CUDA ``torch.cuda.set_sync_debug_mode("warn")`` is on during the counted step and every warning is
counted at the Python line that made it; on CPU (no such mode) tools/host_syncs.py counts what that mode would flag
(value reads and blocking copies of tensors that would live on the device, data-dependent shapes, DeepSpeed's
accelerator ``synchronize``), by function.

    python -m benchmarks.profile_step --data-path D/sample_text_sentence --vocab-file D/vocab.txt --json p.json  # GPU
    python -m benchmarks.profile_step --model-preset tiny --device cpu --seq-len 64 --batch 2 --variants eager packed
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import warnings
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import torch

from benchmarks.train_step_ds import TOKENS_PER_STEP, Case, TrainStep, sync
from common.process import STEP_DEADLINE_ENV
from model.presets import PRESETS
from pretrain.throughput import peak_tflops

TOP_KERNELS = 15
VARIANTS: dict[str, dict] = {
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
}
"""Variant name -> what it changes from the base case; the order is the priority order. A variant with a
``ds_config`` names a bf16 file (benchmarks/host_overhead.py counts their host work on CPU): run with bf16 only."""
MARGIN_S = 5.0
"""Kept back before the deadline to write the JSON and leave."""


def variant_case(name: str, base: Case) -> Case:
    """The :class:`Case` of variant ``name``: the base with its one change."""
    change = dict(VARIANTS[name])
    factor = change.pop("batch_factor", 1)
    return replace(base, batch=base.batch * factor, **change)


class SyncCounter:
    """Counts host syncs made inside ``with counter:`` by site (module docstring: CUDA's sync debug mode; on CPU
    tools/host_syncs.py)."""

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
        from tools.host_syncs import HostSyncCounter

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


def profile_variant(name: str, case: Case, args, device: torch.device, trace: str | None) -> dict:
    """Build the step, warm it up, profile ``args.steps`` steps (wall time synchronised around them), count the host
    syncs of one more step; the row of the report."""
    from torch.profiler import ProfilerActivity, profile

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
        from pretrain.trainer import peak_memory_mb

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


def _write(path: str | None, result: dict) -> None:
    if path:
        from benchmarks.train_step_ds import _write_json

        _write_json(path, result)


def run(args, device: torch.device, name: str) -> dict:
    """Every variant in priority order while the time allows; the JSON rewritten after each."""
    deadline = _deadline(args)
    base = Case(precision=args.precision, seq_len=args.seq_len, batch=args.batch)
    result = {"device": name, "preset": args.model_preset, "rows": [], "left_out": [], "complete": False}
    longest = 0.0
    for v in args.variants:
        case = variant_case(v, base)
        if case.ds_config and case.precision != "bf16":
            result.setdefault("not_run", {})[v] = f"{case.ds_config} is a bf16 config; this run is {case.precision}"
            print(f"[profile_step] not run {v}: {result['not_run'][v]}", flush=True)
            continue
        need = max(2 * longest, args.compile_estimate_s) if case.compile else longest
        if deadline is not None and time.time() + need > deadline:  # a later, cheaper variant may still fit
            result["left_out"].append(v)
            print(f"[profile_step] left out {v}: {need:.0f} s needed, {deadline - time.time():.0f} s left", flush=True)
            continue
        t0 = time.time()
        try:
            row = profile_variant(v, case, args, device, args.trace if not result["rows"] else None)
        except Exception as e:  # one variant failing must not hide the others
            row = {"variant": v, "case": asdict(case), "error": f"{type(e).__name__}: {e}"}
        longest = max(longest, time.time() - t0)
        result["rows"].append(row)
        print("[profile_step] " + row_line(row), flush=True)
        _write(args.json, result)
    result["complete"] = not result["left_out"]
    _write(args.json, result)
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


def markdown(result: dict) -> list[str]:
    """The report's profile section: the variants side by side, then the first variant's top kernels."""
    rows = [r for r in result.get("rows", []) if "error" not in r]
    if not rows:
        return []
    out = [
        "",
        f"### Step profile ({result.get('device')}, {result.get('preset')}; wall time per step, kernel time / wall)",
        "",
        "| variant | N | batch | ZeRO | attn dropout | rows | compiled | kernel | ms | tokens/s | TFLOP/s | MFU | busy "
        "| host syncs/step | peak MiB |",
        "|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c = r["case"]
        mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        packed = "packed" if c.get("sample_mode") == "packed-docs" else f"padded ({100 * r['padding_share']:.0f}% pad)"
        zero = f"{c['zero']} (`{c['ds_config']}`)" if c.get("ds_config") else c["zero"]
        out.append(
            f"| {r['variant']} | {c['seq_len']} | {c['batch']} | {zero} | {c['attention_dropout']} | {packed} | "
            f"{'yes' if c['compile'] else 'no'} | {r['kernel_used']} | {r['step_s'] * 1e3:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['tflops']:.3g} | {mfu} | {100 * r['busy_fraction']:.0f}% | "
            f"{r['host_syncs_per_step']} | {r['peak_memory_mib']:.0f} |"
        )
    first = rows[0]
    out += [
        "",
        f"Top kernels of `{first['variant']}` ({first['kernels_total']} distinct; share of the step's wall time):",
        "",
        "| kernel | ms/step | share | calls/step |",
        "|---|---:|---:|---:|",
    ]
    for k in first["top_kernels"]:
        name = k["name"].replace("|", "/")
        out.append(f"| `{name[:100]}` | {k['ms_per_step']:.2f} | {100 * k['share']:.1f}% | {k['calls_per_step']:g} |")
    sites = ", ".join(f"{s} x{n}" for s, n in first["host_sync_sites"].items()) or "none"
    out += ["", f"Host syncs of `{first['variant']}` per step, by site: {sites}."]
    if result.get("left_out"):
        out += ["", f"Left out at the time limit: {', '.join(result['left_out'])}."]
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.errors.run_entry)."""
    from common.errors import run_entry

    return run_entry("benchmarks.profile_step", _main, argv)


def _main(argv: list[str]) -> int:
    from common.outputs import check_file_writable

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-preset", choices=sorted(TOKENS_PER_STEP), default="bert-base")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=32, help="micro-batch of the base case (batch_x2/x4 multiply it)")
    p.add_argument("--precision", choices=["fp16", "bf16"], default="bf16")
    p.add_argument("--kernel", default="auto")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--data-path", help="the trainer's batches of this shard prefix (else synthetic ids)")
    p.add_argument("--vocab-file", help="with --data-path: the shard's WordPiece vocab")
    p.add_argument("--tokenizer-type", default="BertWordPieceLowerCase")
    p.add_argument(
        "--sample-mode",
        default="full-sentences",
        help="rows of the base case: full-sentences (gpu_check's train_step: rows filled, few padded) or doc-sentences "
        "(the paper set-ups'; on the sample corpus 70%% padding at N=512)",
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="profiled steps per variant")
    p.add_argument(
        "--compile-estimate-s",
        type=float,
        default=60.0,
        help="the least time the compiled variant is started with (compiling bert-base takes about a minute)",
    )
    p.add_argument("--budget-s", type=float, help="stop starting variants when this is spent (see the docstring)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="write the rows here (after every variant)")
    p.add_argument("--trace", help="the first variant's chrome trace (.json, or .json.gz)")
    args = p.parse_args(argv)
    if args.data_path and not args.vocab_file:
        p.error("--data-path needs --vocab-file (the shard's vocabulary)")
    if "packed" in args.variants and not args.data_path:
        p.error("--variants packed needs --data-path (packed rows come from the data pipeline)")
    for f, flag in ((args.json, "--json"), (args.trace, "--trace")):
        if f:
            check_file_writable(f, flag)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA GPU here (torch {torch.__version__}); use --device cpu")
    preset = PRESETS[args.model_preset]
    args.hidden, args.layers, args.heads = preset["hidden_size"], preset["num_layers"], preset["num_attention_heads"]
    args.tokens = args.batch * args.seq_len
    args.compile = False
    if args.device == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from benchmarks.train_step_ds import _init_single_rank

    device = _init_single_rank()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"[profile_step] device {name}; {args.model_preset}; variants {' '.join(args.variants)}", flush=True)
    result = run(args, device, name)
    print("\n".join(markdown(result)), flush=True)
    from pretrain.distributed import destroy_distributed

    destroy_distributed()
    return 1 if any("error" in r for r in result["rows"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
