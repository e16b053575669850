"""``--measure time``: training-step throughput through DeepSpeed on one device: tokens/s, model FLOPs utilisation
(MFU) and peak memory of dense, BlockBERT n=2 and n=3 at N=512 and 1024, with ZeRO-1 in fp16 and bf16 (issue #13's
GPU targets: dense bert-base bf16 MFU >= 45% on H100; BlockBERT n=2 step <= 0.78x and memory <= 0.70x of dense at
N=1024).

What is timed is what the trainer runs: dropout 0.1 on hidden states and attention (the paper set-ups of
run_scripts/common.sh; with attention dropout ``auto`` picks block_gather, not flex, for the sparse variants), and
the engine's inputs made by pretrain.trainer.device_batch, as Trainer._to_device makes them (the all-ones attention
mask is dropped on the host, so dense runs unmasked SDPA, compiled or not; packed rows drop it too; the MLM head
gathers the derived max_predictions_per_seq). --kernel applies to the sparse variants only: dense always runs
``auto``'s dense path. Each row records the kernel auto picked. With --data-path PREFIX --vocab-file V the steps run
on the data pipeline's own batches (the sample mode, padding and masking the trainer reads: --sample-mode, default
the paper set-ups' doc-sentences), each step a new batch; tokens/s then counts real (unpadded) tokens. Without, the
ids are synthetic full rows with 15% labelled.

FLOPs are counted by model/flops.py ("model FLOPs", the formula the trainer's log uses; here the MLM head's
predicted share is the batches' labelled share of positions), MFU against the dense fp16/bf16 tensor-core peak of
pretrain/throughput.py's table (a GPU not listed: MFU left empty). --compile compiles the engine as the trainer's
--compile does. Step time = the median of --steps timed optimizer steps after --warmup ones, with the device
synchronised around each.

The ideal column (issue #48): a sparse step can at best save the attention it skips, so its ideal is
``O + A x density`` with A the dense step's attention time and O the rest, both from the dense row of the same
precision, N, micro-batch, attention dropout, rows and compile setting: after its timed steps the dense row runs
:data:`PROFILED_STEPS` more under torch.profiler, A is the attention core's time per step there
(benchmarks.step.profiling.attention_events: SDPA's operators and their backward nodes; kernel time on a GPU) and
O = the dense step time - A. Each row of that group then shows ``ideal ms`` and ``vs ideal`` (step / ideal: 1.00x is
the best a kernel can do; dense itself is 1.00x by construction). Whole-preset variants (another model) get none.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.report import markdown_table
from benchmarks.step.case import WHOLE_PRESETS, Case
from benchmarks.step.engine import TrainStep, sync
from pretrain.throughput import peak_tflops

PROFILED_STEPS = {"cuda": 2, "cpu": 1}
"""Steps the dense row runs under torch.profiler, after its timed ones, for the ideal column's split, per device type
(one on CPU: the CPU runs are smoke tests of the harness)."""


def attention_split(ts: TrainStep, steps: int | None = None) -> float:
    """Seconds per step the attention core of ``ts``'s step takes (torch.profiler over ``steps`` more steps)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.step.profiling import attention_seconds

    device = ts.device
    steps = steps or PROFILED_STEPS.get(device.type, 1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            ts.step()
        sync(device)
    return attention_seconds(prof, device, steps)


def ideal_key(row: dict) -> tuple:
    """The set-up a dense row's split applies to: same precision, N, micro-batch, dropout, rows and compile."""
    return tuple(row.get(k) for k in ("precision", "seq_len", "batch", "attention_dropout", "batches", "compiled"))


def add_ideal(rows: list[dict]) -> None:
    """Each row of a group with a profiled dense row gets ``ideal_s`` = O + A x density (O = dense step - A),
    ``vs_ideal`` = step / ideal (module docstring), and its step and peak memory over dense's (``vs_dense``,
    ``memory_vs_dense``)."""
    dense = {ideal_key(r): r for r in rows if r.get("variant") == "dense" and r.get("attention_s") is not None}
    for r in rows:
        d = dense.get(ideal_key(r))
        if d is None or "error" in r or r["variant"] in WHOLE_PRESETS:
            continue
        a = min(d["attention_s"], d["step_s"])
        r["ideal_s"] = (d["step_s"] - a) + a * r["density"]
        r["vs_ideal"] = r["step_s"] / r["ideal_s"]
        r["vs_dense"] = r["step_s"] / d["step_s"]
        if r.get("peak_memory_mib") and d.get("peak_memory_mib"):
            r["memory_vs_dense"] = r["peak_memory_mib"] / d["peak_memory_mib"]


def measure(variant: str, precision: str, seq_len: int, args, device: torch.device) -> dict:
    """One row: the median step of ``args.steps`` after ``args.warmup``, with throughput, MFU and peak memory."""
    case = Case(variant, precision, seq_len, compile=args.compile)
    ts = TrainStep(case, args, device)
    for _ in range(args.warmup):
        ts.step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        ts.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tokens = statistics.mean(ts.real_tokens[args.warmup % len(ts.hosts) :] or ts.real_tokens)
    fpt = ts.flops_per_token
    peak = peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    row = {
        "variant": variant,
        "precision": precision,
        "seq_len": seq_len,
        "batch": ts.batch,
        "compiled": args.compile,
        "density": ts.density,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "tflops": fpt * tokens / step_s / 1e12,
        "mfu": (fpt * tokens / step_s / 1e12) / peak if peak else None,
        "peak_memory_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "kernel_requested": ts.config.attention.kernel,  # --kernel for the sparse variants, auto for dense
        "kernel_used": ts.kernels_used() or args.kernel,
        "attention_mask_passed": any("attention_mask" in d for d in ts.feed),
        "batches": "data pipeline" if args.data_path else "synthetic",
        "max_predictions": ts.feed[0].get("max_predictions"),
        "attention_dropout": case.attention_dropout,
    }
    if variant == "dense":  # the ideal column's split (after the timed steps and the peak: they stay unprofiled)
        row["attention_s"] = attention_split(ts)
        row["attention_share"] = row["attention_s"] / step_s
    ts.close()
    return row


def targets(rows: list[dict], device_name: str) -> list[dict]:
    """The issue's targets, each met / missed / not measured, with the numbers."""

    def find(v, p, n):
        return next((r for r in rows if (r["variant"], r["precision"], r["seq_len"]) == (v, p, n)), None)

    out = []
    dense = find("dense", "bf16", 1024) or find("dense", "fp16", 1024)
    d512 = find("dense", "bf16", 512)
    mfu = max((r["mfu"] for r in (d512, find("dense", "bf16", 1024)) if r and r["mfu"] is not None), default=None)
    out.append(
        {
            "target": "dense bert-base bf16 MFU >= 45% (H100)",
            "value": mfu,
            "met": None if mfu is None or "H100" not in device_name else mfu >= 0.45,
        }
    )
    n2 = find("blockbert-n2", dense["precision"], 1024) if dense else None
    for key, limit, label in (("step_s", 0.78, "step time"), ("peak_memory_mib", 0.70, "peak memory")):
        ratio = None
        if dense and n2 and dense.get(key) and n2.get(key):
            ratio = n2[key] / dense[key]
        out.append(
            {
                "target": f"BlockBERT n=2 {label} <= {limit}x dense at N=1024",
                "value": ratio,
                "met": None if ratio is None else ratio <= limit,
            }
        )
    return out


def comparisons(rows: list[dict]) -> list[dict]:
    """BlockBERT n=2 against dense at every (precision, N) where both were measured: step time and peak memory
    ratios (no target: the issue's targets are at N=1024, see :func:`targets`)."""
    ok = {(r["variant"], r["precision"], r["seq_len"]): r for r in rows if "error" not in r}
    out = []
    for (v, prec, n), n2 in sorted(ok.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        dense = ok.get(("dense", prec, n))
        if v != "blockbert-n2" or dense is None:
            continue
        mem = None
        if n2.get("peak_memory_mib") and dense.get("peak_memory_mib"):
            mem = n2["peak_memory_mib"] / dense["peak_memory_mib"]
        out.append({"precision": prec, "seq_len": n, "step_ratio": n2["step_s"] / dense["step_s"], "memory_ratio": mem})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


COLUMNS = [
    ("precision", "precision"),
    ("seq_len", "N"),
    ("variant", "variant"),
    ("batch", "batch"),
    ("kernel_used", "kernel"),
    ("step_s", "step ms", lambda s: f"{1e3 * s:.1f}"),
    ("tokens_per_s", "tokens/s", ".0f"),
    ("tflops", "TFLOP/s", ".1f"),
    ("mfu", "MFU", _pct),
    ("peak_memory_mib", "peak MiB", ".0f"),
    ("vs_dense", "vs dense", lambda x: f"{x:.2f}x"),
    ("memory_vs_dense", "mem vs dense", lambda x: f"{x:.2f}x"),
    ("ideal_s", "ideal ms", lambda s: f"{1e3 * s:.1f}"),
    ("vs_ideal", "vs ideal", lambda x: f"{x:.2f}x"),
    ("error", "error"),
]
"""The rows' table (a missing value, e.g. MFU on CPU, is ``-``)."""


def markdown(result: dict) -> list[str]:
    """The rows (with the ideal ``O + A x density`` where the dense row was profiled), then the targets and the n=2 /
    dense ratios."""
    out = markdown_table(result["rows"], COLUMNS if any("error" in r for r in result["rows"]) else COLUMNS[:-1])
    splits = [r for r in result["rows"] if r.get("attention_s") is not None]
    out += [""] + [
        f"ideal = O + A x density: dense {r['precision']} N={r['seq_len']} b={r['batch']}: A (attention) "
        f"{1e3 * r['attention_s']:.1f} ms = {100 * r['attention_share']:.0f}% of the step, O "
        f"{1e3 * (r['step_s'] - min(r['attention_s'], r['step_s'])):.1f} ms"
        for r in splits
    ]
    verdict = {True: "met", False: "MISSED", None: "not measured"}
    out += [""] + [f"target {t['target']}: {t['value']} -> {verdict[t['met']]}" for t in result.get("targets", [])]
    for c in result.get("comparisons", []):
        mem = "n/a" if c["memory_ratio"] is None else f"{c['memory_ratio']:.2f}x"
        out.append(
            f"BlockBERT n=2 / dense at N={c['seq_len']} ({c['precision']}): step {c['step_ratio']:.2f}x, memory {mem}"
        )
    return out


def run(args, cases: list[tuple[str, int]], device: torch.device, name: str, write) -> dict:
    """Every (precision, case) row, written after each (a run stopped at its time limit keeps what it measured)."""
    rows: list[dict] = []
    result = {"device": name, "preset": args.model_preset, "rows": rows, "complete": False}
    for precision in args.precisions:
        for v, n in cases:
            try:
                row = measure(v, precision, n, args, device)
            except Exception as e:  # record and go on: one failure must not hide the other numbers
                row = {"variant": v, "precision": precision, "seq_len": n, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            if "error" in row:
                print(f"[step time] {precision} N={n} {v}: FAILED {row['error']}", flush=True)
            else:
                mfu = "n/a" if row["mfu"] is None else _pct(row["mfu"])
                print(
                    f"[step time] {precision} N={n} {v} b={row['batch']}: {row['step_s'] * 1e3:.1f} ms, "
                    f"{row['tokens_per_s']:.0f} tok/s, {row['tflops']:.1f} TFLOP/s, MFU {mfu}",
                    flush=True,
                )
            write(result)
    add_ideal(rows)
    result.update(targets=targets(rows, name), comparisons=comparisons(rows), complete=True)
    return result
