"""Per-run curves and costs, and per-config means and spreads."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.pretrain_compare.logs import read_log
from benchmarks.pretrain_compare.specs import RunSpec

STALL_FACTOR = 10.0
"""A log window slower than this many times the run's median step is a stall of the machine (a suspended VM, a
descheduled job), not the model's cost: the training-time axis counts it at the median step time and the run
lists it under ``stalls``."""


def summarize_run(spec: RunSpec, run_dir: Path, seq_length: int) -> dict[str, Any]:
    """A run's curve and costs from its own logs: training time and tokens are accumulated from the trainer's
    log windows (evaluation, checkpointing and start-up excluded), so a resumed run counts each step once."""
    train, valid = read_log(run_dir / "log.jsonl")
    windows = []  # (iteration, steps, seconds, real tokens)
    prev = 0
    for rec in train:
        it = int(rec["iteration"])
        n = it - prev
        if n <= 0 or not rec.get("samples_per_s"):
            continue
        gbs = rec["consumed_samples"] / it
        dt = n * gbs / rec["samples_per_s"]
        windows.append((it, n, dt, rec["tokens_per_s"] * dt))
        prev = it
    # the first window holds loader warm-up
    step_times = [dt / n for _, n, dt, _ in windows[1:]] or [dt / n for _, n, dt, _ in windows]
    median = statistics.median(step_times) if step_times else None
    times, tokens, stalls = {0: 0.0}, {0: 0.0}, []
    t_acc = tok_acc = 0.0
    for it, n, dt, tok in windows:
        if median and dt / n > STALL_FACTOR * median:
            stalls.append({"iteration": it, "steps": n, "seconds": round(dt, 1)})
            dt = n * median
        t_acc += dt
        tok_acc += tok
        times[it], tokens[it] = t_acc, tok_acc
    evals = []
    for rec in valid:
        it = int(rec["iteration"])
        if it not in times:
            continue
        evals.append(
            {
                "iteration": it,
                "train_time_s": round(times[it], 3),
                "tokens": int(tokens[it]),
                **{k: float(v) for k, v in rec["valid"].items()},
            }
        )
    launches = []
    if (run_dir / "launches.jsonl").exists():
        launches = [json.loads(x) for x in (run_dir / "launches.jsonl").read_text().splitlines() if x.strip()]
    return {
        "config": spec.config,
        "seed": spec.seed,
        "iterations": train[-1]["iteration"] if train else 0,
        "evals": evals,
        "final": evals[-1] if evals else None,
        "step_time_s": median,
        "stalls": stalls,
        "train_time_s": round(t_acc, 3),
        "tokens": int(tok_acc),
        "peak_memory_mb": max((r["memory"] for r in train), default=None),
        "launch_wall_s": round(sum(x["wall_s"] for x in launches), 1),
        "launches": len(launches),
        "final_train_loss": train[-1]["loss"] if train else None,
        "seq_length": seq_length,
        "done": (run_dir / "done.json").exists(),
    }


def _mean_std(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def summarize(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per config: final validation loss/perplexity/accuracy, step time and peak memory over its seeds, and the
    ratios to dense (time and memory savings as the blockwise paper's Table 2 reports them)."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in runs.values():
        if r["final"] is not None:
            by_config.setdefault(r["config"], []).append(r)
    out: dict[str, Any] = {}
    for config, rs in by_config.items():
        out[config] = {
            "seeds": sorted(r["seed"] for r in rs),
            "final_iteration": min(r["final"]["iteration"] for r in rs),
            "loss": _mean_std([r["final"]["loss"] for r in rs]),
            "perplexity": _mean_std([r["final"]["perplexity"] for r in rs]),
            "mlm_accuracy": _mean_std([r["final"]["mlm_accuracy"] for r in rs]),
            "step_time_s": _mean_std([r["step_time_s"] for r in rs]),
            "peak_memory_mb": _mean_std([r["peak_memory_mb"] for r in rs]),
        }
    if "dense" in out:
        d = out["dense"]
        for config, s in out.items():
            s["time_vs_dense"] = s["step_time_s"]["mean"] / d["step_time_s"]["mean"]
            s["memory_vs_dense"] = s["peak_memory_mb"]["mean"] / d["peak_memory_mb"]["mean"]
            s["perplexity_vs_dense"] = s["perplexity"]["mean"] / d["perplexity"]["mean"]
    return out
