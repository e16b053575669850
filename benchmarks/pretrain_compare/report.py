"""results.json, the markdown table and the machine the comparison ran on."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from benchmarks.pretrain_compare.evaluate import unigram_baseline
from benchmarks.pretrain_compare.plots import plot
from benchmarks.pretrain_compare.presets import Preset
from benchmarks.pretrain_compare.specs import RunSpec
from benchmarks.pretrain_compare.stats import summarize, summarize_run


def machine_info() -> dict[str, Any]:
    """What the timings were taken on (CPU model, cores, GPUs, library versions)."""
    import torch

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    try:
        import deepspeed

        info["deepspeed"] = deepspeed.__version__
    except Exception:  # noqa: BLE001 - the version is informative only
        pass
    return info


def report(ns: argparse.Namespace, specs: list[RunSpec], preset_name: str, preset: Preset) -> dict[str, Any]:
    """Write results.json and the plots from whatever has run so far."""
    out = Path(ns.out)
    runs = {}
    for spec in specs:
        run_dir = out / "runs" / spec.name
        if (run_dir / "log.jsonl").exists():
            runs[spec.name] = summarize_run(spec, run_dir, preset.seq_length)
            done = run_dir / "done.json"
            if done.exists():
                runs[spec.name].update(
                    {k: v for k, v in json.loads(done.read_text()).items() if k in ("valid_fingerprint", "recheck")}
                )
    fingerprints = {r.get("valid_fingerprint") for r in runs.values() if r.get("valid_fingerprint")}
    unigram_file = out / "unigram_baseline.json"
    if not unigram_file.exists():
        first = next((spec for spec in specs if (out / "runs" / spec.name / "done.json").exists()), None)
        if first is not None:  # the validation batches are the same for every run (the fingerprints say so)
            unigram_file.write_text(json.dumps(unigram_baseline(first, out / "runs" / first.name, ns.nproc)))
    results = {
        "preset": preset_name,
        "settings": preset.settings(),
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.pretrain_compare", *ns.argv]),
        "machine": machine_info(),
        "launcher": ns.launcher,
        "nproc": ns.nproc,
        "same_validation_batches": len(fingerprints) <= 1,
        "runs": runs,
        "summary": summarize(runs),
        "unigram_baseline": json.loads(unigram_file.read_text()) if unigram_file.exists() else None,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(markdown_table(results))
    results["plots"] = [str(p) for p in plot(results, out)]
    if getattr(ns, "figures_dir", None):  # the copies docs/results.md shows, e.g. docs/figures/compare_*.png
        import shutil

        fig_dir = Path(ns.figures_dir)
        fig_dir.mkdir(parents=True, exist_ok=True)
        for src in [*results["plots"], out / "results.json"]:
            shutil.copyfile(src, fig_dir / f"{ns.figures_prefix}{Path(src).name}")
    return results


def markdown_table(results: dict[str, Any]) -> str:
    """The summary as a markdown table (docs/results.md pastes it): mean ± std over seeds where there are several."""

    def pm(d: dict[str, float], fmt: str) -> str:
        return format(d["mean"], fmt) + (f" ± {format(d['std'], fmt)}" if d["n"] > 1 else "")

    rows = [
        "| config | seeds | step | valid loss | valid ppl | MLM acc | step time (s) | vs dense "
        "| peak RSS rank 0 (MB) | vs dense |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, s in results["summary"].items():
        rows.append(
            f"| {config} | {len(s['seeds'])} | {s['final_iteration']} | {pm(s['loss'], '.3f')} | "
            f"{pm(s['perplexity'], '.1f')} | {pm(s['mlm_accuracy'], '.4f')} | {pm(s['step_time_s'], '.3f')} | "
            f"{s.get('time_vs_dense', float('nan')):.2f}x | {pm(s['peak_memory_mb'], '.0f')} | "
            f"{s.get('memory_vs_dense', float('nan')):.2f}x |"
        )
    u = results.get("unigram_baseline")
    if u:
        rows.append(
            f"| *unigram baseline* | | | {u['loss']:.3f} | {u['perplexity']:.1f} | {u['mlm_accuracy']:.4f} | | | | |"
        )
    return "\n".join(rows) + "\n"


def print_table(results: dict[str, Any]) -> None:
    print(
        "[compare] config              seeds  step  final ppl (mean±std)  mlm acc  step s  vs dense  peak MB  vs dense"
    )
    for config, s in results["summary"].items():
        print(
            f"[compare] {config:<20} {len(s['seeds']):>5} {s['final_iteration']:>5}  "
            f"{s['perplexity']['mean']:>9.2f} ± {s['perplexity']['std']:<7.2f}  {s['mlm_accuracy']['mean']:.4f}  "
            f"{s['step_time_s']['mean']:6.3f}  {s.get('time_vs_dense', float('nan')):8.3f}  "
            f"{s['peak_memory_mb']['mean']:7.0f}  {s.get('memory_vs_dense', float('nan')):8.3f}"
        )
