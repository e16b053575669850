"""The paper-shaped table of a sweep: one column per checkpoint (dense, BlockBERT, SparseBERT, DIET side by side),
one row per task and per suite average, each cell the median over seeds of the best grid point with its spread over
seeds; a second table gives each cell's best grid point and the compute its fine-tunings took. Markdown for people,
JSON (the sweep's report, tools/evaluate/sweep.py ``summarize``) for programs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from common.outputs import atomic_file
from common.tables import markdown_table

SUITE_TITLES = {"glue": "GLUE", "swag": "SWAG", "squad1": "SQuAD v1.1", "squad2": "SQuAD v2.0", "mrqa": "MRQA",
                "xnli": "XNLI", "probe": "probe"}  # fmt: skip


def shown_metrics(kind: str, table_metric: str, metrics: tuple[str, ...]) -> tuple[str, ...]:
    """The metrics a cell shows: extractive QA shows EM/F1 as the papers do (SQuAD 2.0: the best-threshold pair),
    every other task its table metric."""
    if kind == "extractive_qa":
        em = table_metric.replace("f1", "exact")
        if em in metrics:
            return (em, table_metric)
    return (table_metric,)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _tokens(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def _range(lo: float, hi: float) -> str:
    """``53.0-55.0``; ``-19.0 to 4.0`` when a bound is negative (a Matthews or Spearman below 0), where a dash
    would read as a minus."""
    return f"{_fmt(lo)}{' to ' if min(lo, hi) < 0 else '-'}{_fmt(hi)}"


def _runs(n: int) -> str:
    return f"{n} run" + ("" if n == 1 else "s")


def cell_text(row: Mapping[str, Any], cell: Mapping[str, Any], shown: tuple[str, ...]) -> str:
    """``85.4/85.8 [85.1-85.6, 85.5-86.0]``: the medians (per dev split, then per shown metric, joined by /) and the
    min-max of the table metric over seeds per split; ``-`` when no run is done."""
    if "median" not in cell:
        return "-"
    values = [_fmt(cell["median"][s][m]) for s in row["eval_splits"] for m in shown]
    spread = [_range(lo, hi) for lo, hi in (cell["spread"][s] for s in row["eval_splits"])]
    text = "/".join(values) + f" [{', '.join(spread)}]"
    if cell["runs_done"] < cell["runs_planned"]:
        text += f" ({cell['runs_done']}/{cell['runs_planned']} runs)"
    return text


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: the scores table, then best grid points and compute."""
    from tools.evaluate.tasks import SUITES, TASKS, columns

    tags = [m["tag"] for m in report["models"]]
    lines = [f"# Protocol `{report['protocol']}`: {report['paper']}", ""]
    lines.append(
        "Dev-set scores in percent: the median over seeds at the best grid point (best: the highest median of the "
        "table metric); in brackets the min-max of the table metric over those seeds."
    )
    lines.append("")
    if report["narrowed"]:
        lines.append("**Narrowed sweep, not the protocol's:** " + "; ".join(report["narrowed"]) + ".")
        lines.append("")
    if report.get("incomplete"):
        lines.append("**Incomplete:** " + "; ".join(report["incomplete"]) + ".")
        lines.append("")
    for note in report.get("not_reproduced", []):
        lines.append(f"Not reproduced: {note}.")
    if report.get("not_reproduced"):
        lines.append("")
    rows = []
    for row in report["tasks"]:
        task = TASKS[row["task"]]
        shown = shown_metrics(task.kind, row["table_metric"], task.metrics)
        title = task.title or task.name
        if len(row["eval_splits"]) > 1:  # MNLI (m/mm)
            title += " (" + "/".join(c.split("-")[-1] for c in row["columns"]) + ")"
        r = {"task": title, "metric": "/".join(shown)}
        r.update({tag: cell_text(row, row["cells"][tag], shown) for tag in tags})
        rows.append(r)
    for suite, per_model in report["averages"].items():
        if len(columns(suite)) < 2:  # one column: its average is itself
            continue
        paper_suite = set(report["suites"].get(suite, ())) == set(SUITES.get(suite, ()))
        if paper_suite or any(v is not None for v in per_model.values()):  # "-": the average lacks a column
            title = f"{SUITE_TITLES.get(suite, suite)} average"
            rows.append({"task": title, "metric": "", **{t: _fmt(per_model[t]) for t in tags}})
    lines += markdown_table(rows, [("task", "task"), ("metric", "metric"), *((t, t) for t in tags)])
    lines += ["", "Best grid point and compute (training time and tokens per fine-tuning, padding included; total "
              "over the task's grid x seeds):", ""]  # fmt: skip
    rows = []
    for row in report["tasks"]:
        r = {"task": TASKS[row["task"]].title or row["task"]}
        for tag in tags:
            c = row["cells"][tag]
            if "best_point" not in c:
                r[tag] = f"{c['runs_done']}/{c['runs_planned']} runs"
                continue
            bp, comp = c["best_point"], c["compute"]
            r[tag] = (
                f"lr {bp['lr']:g}, bs {bp['batch_size']}, wd {bp['weight_decay']:g}, {bp['epochs']:g} ep; "
                f"{comp['seconds_per_run']:.1f} s, {_tokens(comp['tokens_per_run'])} tok per run; "
                f"{_runs(c['runs_done'])}, {comp['train_seconds']:.0f} s total"
            )
        rows.append(r)
    lines += markdown_table(rows, [("task", "task"), *((t, t) for t in tags)])
    lines += ["", "Models: " + "; ".join(f"`{m['tag']}` = {m['path']}" for m in report["models"]), ""]
    return "\n".join(lines)


def write(report: Mapping[str, Any], out: str | Path) -> tuple[Path, Path]:
    """``<out>/table.md`` and ``<out>/table.json``, each written to a temporary name and renamed."""
    out = Path(out)
    md, js = out / "table.md", out / "table.json"
    with atomic_file(md) as tmp:
        tmp.write_text(markdown(report))
    with atomic_file(js) as tmp:
        tmp.write_text(json.dumps(report, indent=1) + "\n")
    return md, js
