"""The benchmark steps: the measuring commands of benchmarks/ run as subprocesses (this package imports nothing of
benchmarks/), each writing its JSON into the work directory, read back here for the summary and the report's tables.

The command lines are the harnesses' (docs/benchmarks.md): ``python -m benchmarks.attention --measure time`` (the
kernel table) and ``python -m benchmarks.step --measure time|profile`` (the training step, its profile); both name
what they measure as ``--cases NAME@N`` (docs/benchmarks.md, "Cases")."""

from __future__ import annotations

import json
from pathlib import Path

from devtools.gpu_check.context import Ctx
from devtools.gpu_check.runner import Step, StepResult

KERNEL_TABLE_LAYOUTS = ["blockbert_n2", "blockbert_n3", "fixed_b64", "local_bi_b64"]
PROFILE_TRACE = "profile_trace.json.gz"
"""The profile step's chrome trace (the first variant's profiled steps), in the report directory's logs/."""


def _json_result(out: Path, res: StepResult, proc) -> dict | None:
    """A benchmark's JSON, kept as the step's details; None, with the step failed, when it wrote none."""
    if not out.is_file():
        res.status, res.summary = "failed", f"no {out.name} (exit code {proc.returncode})"
        return None
    res.details = json.loads(out.read_text())
    return res.details


def _fresh(path: Path):
    """A step's ``prepare``: no result left from an earlier run in a reused work directory."""
    return lambda: path.unlink(missing_ok=True)


def kernel_table_step(ctx: Ctx, cap_s: float) -> Step:
    """BlockBERT n=2/n=3, Fixed and sliding window per kernel against dense SDPA: time and peak memory."""
    d = ctx.work / "kernel_table"
    if ctx.device == "cpu":
        seq, kernels, dtype, repeats = ["256", "512"], ["block_gather"], "fp32", "1"
    else:
        kernels = ["flex", "block_gather", "triton_block"]
        seq, dtype, repeats = ["512", "1024", "4096", "8192"], ctx.low_precision, "3"
    cmd = [ctx.python, "-m", "benchmarks.attention", "--measure", "time", "--device", ctx.device, "--dtype", dtype]
    cases = f"{','.join(KERNEL_TABLE_LAYOUTS)}@{','.join(seq)}"
    cmd += ["--cases", cases, "--kernels", *kernels, "--repeats", repeats]
    cmd += ["--target-factor", "1.3", "--out-dir", str(d), "--no-plot"]
    expected = len(seq) * len(KERNEL_TABLE_LAYOUTS) * len(kernels)

    def check(res: StepResult, proc) -> None:
        result = _json_result(d / "attention.json", res, proc)
        if result is None:
            return
        rows, failed = result["rows"], result.get("failed", [])
        missed = [
            f"{r['layout']}@{r['n']}: {r['time_ratio']:.2f}x > {r['target']:.2f}x"
            for r in rows
            if r["kernel"] == "flex" and not r["meets_time"]
        ]
        res.details = {"meta": result.get("meta", {}), "rows": rows, "failed": failed, "flex_target_missed": missed}
        ok = proc.returncode == 0 and len(rows) == expected and not failed
        # --quick measures; the full check also holds flex to its target (1.3 x density x dense SDPA time)
        res.status = "passed" if ok and (ctx.quick or not missed) else "failed"
        dense = result.get("meta", {}).get("dense_backend", "?")
        res.summary = (
            f"{len(rows)}/{expected} rows ({dtype}, dense SDPA backend: {dense})"
            + (f"; {len(failed)} failed: {', '.join(failed[:4])}" if failed else "")
            + (f"; flex over 1.3 x density x dense: {', '.join(missed[:4])}" if missed else "")
        )

    return Step("kernel_table", cap_s, [cmd], check, min_s=30, prepare=_fresh(d / "attention.json"))


def train_step_step(ctx: Ctx, cap_s: float) -> Step:
    """The training step on the trainer's own batches: tokens/s, MFU, peak memory, BlockBERT n=2 against dense."""
    out = ctx.work / "train_step.json"
    if ctx.device == "cpu":
        sizes = ["--model-preset", "tiny", "--cases", "dense@128", "dense,blockbert-n2@256", "--warmup", "1"]
        sizes += ["--steps", "1", "--device", "cpu"]
    elif ctx.quick:
        sizes = ["--model-preset", "bert-base", "--cases", "dense@512", "dense,blockbert-n2@4096"]
        sizes += ["--warmup", "3", "--steps", "8"]
    else:
        sizes = ["--model-preset", "bert-base", "--cases", "dense,blockbert-n2,blockbert-n3@512,1024,4096"]
    cmd = [ctx.python, "-m", "benchmarks.step", "--measure", "time", *sizes, "--precisions", ctx.low_precision]
    cmd += ["--sample-mode", "full-sentences", "--json", str(out), *ctx.shards]

    def check(res: StepResult, proc) -> None:
        data = _json_result(out, res, proc)
        if data is None:
            return
        missed = [t["target"] for t in data["targets"] if t["met"] is False]
        errors = [f"{r['variant']}@{r['seq_len']}: {r['error']}" for r in data["rows"] if "error" in r]
        res.status = "passed" if proc.returncode == 0 and not errors and (ctx.quick or not missed) else "failed"
        parts = []
        for r in data["rows"]:
            if "error" not in r:
                mfu = "" if r.get("mfu") is None else f", MFU {100 * r['mfu']:.1f}%"
                parts.append(f"{r['variant']}@{r['seq_len']} {r['step_s'] * 1e3:.0f} ms{mfu}")
        for c in data.get("comparisons", []):
            mem = "n/a" if c["memory_ratio"] is None else f"{c['memory_ratio']:.2f}x"
            parts.append(f"n=2/dense@{c['seq_len']}: step {c['step_ratio']:.2f}x, memory {mem}")
        parts += [f"target missed: {t}" for t in missed]
        res.summary = "; ".join(errors[:3] + parts)

    return Step("train_step", cap_s, [cmd], check, min_s=45 if ctx.device == "cuda" else 20, prepare=_fresh(out))


def profile_line(r: dict) -> str:
    """One variant of the profile in a few words (the summary)."""
    if "error" in r:
        return f"{r['variant']}: FAILED {r['error']}"
    mfu = "" if r.get("mfu") is None else f", MFU {100 * r['mfu']:.1f}%"
    return f"{r['variant']} {r['step_s'] * 1e3:.1f} ms{mfu}, busy {100 * r['busy_fraction']:.0f}%"


def profile_step(ctx: Ctx, cap_s: float) -> Step:
    """The bert-base N=512 step under torch.profiler: the variants in priority order until the step's deadline (the
    harness reads it from $GPU_CHECK_STEP_DEADLINE)."""
    out = ctx.work / "profile_step.json"
    if ctx.device == "cpu":
        sizes = ["--model-preset", "tiny", "--seq-len", "64", "--batch", "2", "--warmup", "1", "--steps", "1"]
        sizes += ["--device", "cpu", "--vocab-size", "4000"]  # the smoke's vocabulary: a CPU-sized MLM head
        # inductor compiles the step for minutes on a loaded CPU: the rehearsal names the compiled variant left out
        sizes += ["--compile-estimate-s", "1000"]
    else:
        sizes = ["--model-preset", "bert-base", "--seq-len", "512", "--batch", "32", "--warmup", "3", "--steps", "2"]
        # --quick leaves the profile about 70 s (the 2026-11-26 H200 timings of the steps before it): eager takes
        # ~20 s, then the ds_config variants zero1_overlap and zero0_autocast (the harness's order); compiled starts
        # only when 40 s are left
        sizes += ["--compile-estimate-s", "40"]
    cmd = [ctx.python, "-m", "benchmarks.step", "--measure", "profile", *sizes, "--precision", ctx.low_precision]
    cmd += ["--sample-mode", "full-sentences", "--json", str(out), "--trace", str(ctx.logs / PROFILE_TRACE)]
    cmd += ctx.shards

    def check(res: StepResult, proc) -> None:
        data = _json_result(out, res, proc)
        if data is None:
            return
        errors = [r for r in data["rows"] if "error" in r]
        res.status = "passed" if proc.returncode == 0 and data["rows"] and not errors else "failed"
        parts = [profile_line(r) for r in data["rows"]]
        if data.get("left_out"):
            parts.append(f"left out at the time limit: {', '.join(data['left_out'])}")
        res.summary = "; ".join(parts) or f"no variant measured (exit code {proc.returncode})"

    return Step("profile", cap_s, [cmd], check, min_s=45 if ctx.device == "cuda" else 20, prepare=_fresh(out))


def ds_report_step(ctx: Ctx, cap_s: float) -> Step:
    """DeepSpeed's own report of its ops and their compatibility."""
    return Step("ds_report", cap_s, [[ctx.python, "-m", "deepspeed.env_report"]], None, min_s=15)
