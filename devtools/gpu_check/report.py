"""The report: ``report.md`` (the machine line, one row per step, the benchmark tables, the end of the output of every
step that did not pass) and ``report.json`` (everything), both rewritten whole when each step starts and ends, so a
crash keeps what was measured. They are all a committed report holds (docs/gpu_reports/); the long outputs go to
the report directory's logs/ (context.LOGS)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from common.outputs import atomic_file
from devtools.gpu_check.runner import StepResult

MD_TAIL_CHARS = 2000
"""The end of a failed step's output in report.md (report.json keeps more, logs/ all of it)."""


def _kernel_table_md(res: StepResult) -> list[str]:
    rows = res.details.get("rows") or []
    if not rows:
        return []
    meta = res.details.get("meta", {})
    out = [
        "",
        f"### Kernel table ({meta.get('dtype')}, batch {meta.get('batch')}, {meta.get('heads')} heads x "
        f"{meta.get('head_dim')}, fwd+bwd; dense = SDPA without a mask, backend {meta.get('dense_backend')})",
        "",
        "| N | layout | kernel | density | ms | dense ms | time ratio | MiB | dense MiB | memory ratio |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['layout']} | {r['kernel']} | {r['density']:.3f} | {r['time_best_s'] * 1e3:.2f} | "
            f"{r['dense_time_best_s'] * 1e3:.2f} | {r['time_ratio']:.2f} | {r['mem_mib']:.0f} | "
            f"{r['dense_mem_mib']:.0f} | {r['mem_ratio']:.2f} |"
        )
    return out


def _train_step_md(res: StepResult) -> list[str]:
    rows = [r for r in res.details.get("rows") or [] if "error" not in r]
    if not rows:
        return []
    out = [
        "",
        f"### Training step ({res.details.get('device')}, {res.details.get('preset')}, ZeRO-1, "
        f"{rows[0].get('batches')} batches)",
        "",
        "| variant | precision | N | batch | kernel | step ms | tokens/s | TFLOP/s | MFU | peak MiB |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        mem = "n/a" if r.get("peak_memory_mib") is None else f"{r['peak_memory_mib']:.0f}"
        out.append(
            f"| {r['variant']} | {r['precision']} | {r['seq_len']} | {r['batch']} | {r['kernel_used']} | "
            f"{r['step_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} | {r['tflops']:.1f} | {mfu} | {mem} |"
        )
    return out


def _profile_md(res: StepResult) -> list[str]:
    rows = [r for r in res.details.get("rows") or [] if "error" not in r]
    if not rows:
        return []
    out = [
        "",
        f"### Step profile ({res.details.get('device')}, {res.details.get('preset')}; wall time per step, kernel "
        "time / wall)",
        "",
        "| variant | N | batch | kernel | ms | TFLOP/s | MFU | busy | host syncs/step | peak MiB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        out.append(
            f"| {r['variant']} | {r['case']['seq_len']} | {r['case']['batch']} | {r['kernel_used']} | "
            f"{r['step_s'] * 1e3:.1f} | {r['tflops']:.3g} | {mfu} | {100 * r['busy_fraction']:.0f}% | "
            f"{r['host_syncs_per_step']} | {r['peak_memory_mib']:.0f} |"
        )
    return out + ["", "Top kernels and host-sync sites per variant: report.json (the profile step's details)."]


SECTIONS = {"kernel_table": _kernel_table_md, "train_step": _train_step_md, "profile": _profile_md}
"""The benchmark steps whose rows report.md shows as a table."""


def render(results: list[StepResult], env_md: str, meta: dict) -> str:
    """report.md's text."""
    lines = [
        "# GPU check report",
        "",
        f"Machine: {env_md}",
        "",
        f"Mode: {meta.get('mode')}; budget {meta.get('budget_s'):.0f} s from the start of run_scripts/gpu_check.sh; "
        f"elapsed {meta.get('elapsed_s', 0):.0f} s. Written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.",
        "",
        "| step | status | seconds | result |",
        "|---|---|---:|---|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.summary.replace('|', '/')} |")
    past = [r.name for r in results if r.details.get("past_budget")]
    if past:
        lines += ["", f"Not run, past the budget: {', '.join(past)}."]
    for r in results:
        if r.name in SECTIONS:
            lines += SECTIONS[r.name](r)
    for r in results:
        if r.status not in ("passed", "skipped", "running") and r.output_tail:
            lines += ["", f"## {r.name}: end of output", "", "```", r.output_tail[-MD_TAIL_CHARS:], "```"]
    return "\n".join(lines) + "\n"


def write_report(out: Path, results: list[StepResult], env_md: str, env_data: dict, meta: dict | None = None) -> None:
    """report.md and report.json, each replaced atomically (a reader never sees half a file)."""
    meta = meta or {"mode": "?", "budget_s": 0.0}
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "environment": env_data, "steps": [asdict(r) for r in results]}
    for name, text in (
        ("report.json", json.dumps(doc, indent=1, default=str)),
        ("report.md", render(results, env_md, meta)),
    ):
        with atomic_file(out / name) as tmp:
            tmp.write_text(text)
