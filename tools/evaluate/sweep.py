"""Model x task x grid point x seed: one fine-tuning per run, each kept with its dev predictions, resumable; the
papers' summary per task (the median over seeds of the best grid point).

Layout of a sweep directory (``--output-dir``)::

    <out>/<model tag>/<task>/settings.json                     what every run of this model and task shares
    <out>/<model tag>/<task>/<grid point>/seed<k>/result.json  scores per dev split, compute, the run's settings
    <out>/<model tag>/<task>/<grid point>/seed<k>/predictions_<split>.json

A run directory is written beside its place and renamed into it when the run is complete, so a run directory that
exists is done: running the same command again skips it (resume). ``settings.json`` is written by the first run of
a (model, task) and compared on every later one: a resume with other settings (another checkpoint at the same tag,
other data, another protocol, other example limits) is refused unless ``allow_changed_settings``.

Selection, as the papers do it: per grid point, the median over seeds of the task's ``table_metric`` (averaged over
its dev splits: MNLI's m and mm); the best point is the highest such median (ties: the first in grid order); the
reported numbers are the medians over seeds at that point, with their min-max spread over seeds.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from common.errors import UserError
from common.outputs import atomic_dir, atomic_file
from tools.evaluate.protocols import GridPoint, Protocol, TaskSetting

RESULT = "result.json"
SETTINGS = "settings.json"
WORK = "work"
"""The fine-tuning's own files (Trainer state) go to ``<run dir>/work`` while it runs; removed when it is done."""


FLAGS = {"lrs": "--lr", "batch_sizes": "--batch-size", "weight_decays": "--weight-decay", "epochs": "--epochs",
         "seeds": "--seeds"}  # fmt: skip
"""The command-line flag that narrows each axis (tools/evaluate/cli.py), named in errors."""


class SweepError(UserError):
    """A sweep cannot go on as asked; the message names the directory or setting and what to do."""


@dataclass(frozen=True)
class Model:
    """One checkpoint of the sweep: its column name in the table and its Hugging Face directory."""

    tag: str
    """Column name and directory name under the sweep directory."""
    path: str
    """Hugging Face directory (ours, stock BERT/ModernBERT or custom code)."""


@dataclass(frozen=True)
class Run:
    """One fine-tuning: a model, a task, a grid point and a seed, with everything it is run with."""

    model: Model
    task: str
    point: GridPoint
    seed: int
    setting: TaskSetting
    data_dir: str
    limit_train: int | None = None
    """Fine-tune on the first N training examples only (a narrowed sweep)."""
    limit_eval: int | None = None
    """Score the first N examples of each dev split only (a narrowed sweep)."""
    device: str | None = None
    precision: str = "auto"

    def path(self, out: str | Path) -> Path:
        """``<out>/<tag>/<task>/<grid point>/seed<k>``."""
        return Path(out) / self.model.tag / self.task / self.point.name / f"seed{self.seed}"


@dataclass
class RunResult:
    """What one fine-tuning gives the sweep (a ``run_one`` returns it)."""

    scores: dict[str, dict[str, float]]
    """Dev split -> metric -> value (tools/evaluate/metrics.py's score, percent)."""
    predictions: dict[str, Any]
    """Dev split -> the predictions, JSON-able (per example id)."""
    train_seconds: float
    """Wall time of the training loop."""
    train_tokens: int
    """Tokens the training passes processed, padding included."""
    steps: int = 0
    train_examples: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    """Device, precision, max length, windows ... as the fine-tuning reports them."""


RunOne = Callable[[Run, Path], RunResult]
"""Fine-tunes and scores one run; the Path is a scratch directory for the fine-tuning's own files."""


@dataclass(frozen=True)
class Sweep:
    """What one sweep runs: models x tasks x the (maybe narrowed) grid x seeds of a protocol."""

    protocol: Protocol
    models: tuple[Model, ...]
    tasks: tuple[str, ...]
    data_dir: str
    lrs: tuple[float, ...] | None = None
    """Only these learning rates of each task's grid (None: all)."""
    batch_sizes: tuple[int, ...] | None = None
    """Only these batch sizes (None: all)."""
    weight_decays: tuple[float, ...] | None = None
    """Only these weight decays (None: all)."""
    epochs: tuple[float, ...] | None = None
    """Only these epoch counts (None: all)."""
    seeds: tuple[int, ...] | None = None
    """Only these seeds (None: the protocol's)."""
    limit_train: int | None = None
    limit_eval: int | None = None
    device: str | None = None
    precision: str = "auto"

    def __post_init__(self) -> None:
        tags = [m.tag for m in self.models]
        if not tags:
            raise SweepError("give at least one --model")
        if len(set(tags)) != len(tags):
            raise SweepError(f"model tags must differ, got {tags}; name them: --model TAG=PATH")
        for t in self.tasks:
            if t not in self.protocol.settings:
                raise SweepError(
                    f"task {t!r} is not part of protocol {self.protocol.name} (its tasks: "
                    f"{', '.join(self.protocol.tasks)})"
                )
        for name, axis in (("limit_train", self.limit_train), ("limit_eval", self.limit_eval)):
            if axis is not None and axis < 1:
                raise SweepError(f"--{name.replace('_', '-')} must be >= 1, got {axis}")
        for name in ("lrs", "batch_sizes", "weight_decays", "epochs", "seeds"):  # narrowing only, no new values
            picked = getattr(self, name)
            if picked is None:
                continue
            flag = FLAGS[name]
            offered = sorted({v for t in self.tasks for v in getattr(self.protocol.settings[t], name)})
            extra = [v for v in picked if v not in offered]
            if extra:
                raise SweepError(
                    f"{flag} {' '.join(f'{v:g}' for v in extra)}: not in protocol {self.protocol.name}'s grid for "
                    f"these tasks ({' '.join(f'{v:g}' for v in offered)}); a sweep is narrowed to the protocol's "
                    "values, another grid is another protocol (tools/evaluate/protocols.py)"
                )
            for t in self.tasks:
                own = getattr(self.protocol.settings[t], name)
                if not set(picked) & set(own):
                    raise SweepError(
                        f"{flag} {' '.join(f'{v:g}' for v in picked)} leaves no value for {t} (its "
                        f"{name.replace('_', ' ')}: {' '.join(f'{v:g}' for v in own)}); add one of those or leave the "
                        "task out with --tasks"
                    )

    def grid(self, task: str) -> list[GridPoint]:
        """The task's grid points, narrowed."""
        keep = {
            "lr": self.lrs,
            "batch_size": self.batch_sizes,
            "weight_decay": self.weight_decays,
            "epochs": self.epochs,
        }
        return [
            p
            for p in self.protocol.settings[task].grid()
            if all(v is None or getattr(p, k) in v for k, v in keep.items())
        ]

    def task_seeds(self, task: str) -> list[int]:
        """The task's seeds, narrowed."""
        return [s for s in self.protocol.settings[task].seeds if self.seeds is None or s in self.seeds]

    def runs(self) -> list[Run]:
        """Every run, model by model, task by task, grid point by grid point, seed by seed."""
        return [
            Run(
                m,
                t,
                p,
                k,
                self.protocol.settings[t],
                self.data_dir,
                self.limit_train,
                self.limit_eval,
                self.device,
                self.precision,
            )
            for m in self.models
            for t in self.tasks
            for p in self.grid(t)
            for k in self.task_seeds(t)
        ]

    def narrowed(self) -> list[str]:
        """How this sweep differs from the protocol's full one (empty: it is the protocol's)."""
        notes = []
        for suite, tasks in self.protocol.suites.items():
            picked = [t for t in tasks if t in self.tasks]
            if picked and len(picked) < len(tasks):
                notes.append(f"{suite}: only {', '.join(picked)} of {', '.join(tasks)}")
        for t in self.tasks:
            full, kept = len(self.protocol.settings[t].grid()), len(self.grid(t))
            if kept < full:
                notes.append(f"{t}: {kept} of {full} grid points")
            seeds, all_seeds = self.task_seeds(t), self.protocol.settings[t].seeds
            if len(seeds) < len(all_seeds):
                notes.append(f"{t}: seeds {' '.join(map(str, seeds))} of {' '.join(map(str, all_seeds))}")
        if self.limit_train is not None:
            notes.append(f"training sets cut to their first {self.limit_train} examples")
        if self.limit_eval is not None:
            notes.append(f"dev sets cut to their first {self.limit_eval} examples")
        return notes


def settings_record(run: Run, protocol: str) -> dict[str, Any]:
    """What every run of one (model, task) shares and a resume must not change."""
    return {
        "protocol": protocol,
        "task": run.task,
        "model": os.path.abspath(run.model.path),
        "data_dir": os.path.abspath(run.data_dir),
        "setting": _jsonable(asdict(run.setting)),
        "limit_train": run.limit_train,
        "limit_eval": run.limit_eval,
        "precision": run.precision,
    }


def check_settings(task_dir: Path, record: Mapping[str, Any], allow_changed: bool) -> None:
    """Write ``settings.json`` on the first run; afterwards refuse other settings (unless ``allow_changed``: then
    the new ones are recorded and the old ones kept under ``history``)."""
    path = task_dir / SETTINGS
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SweepError(f"{path}: unreadable ({e}); remove it to start this task's sweep afresh") from e
        current = {k: v for k, v in old.items() if k != "history"}
        if current == dict(record):
            return
        changed = sorted(k for k in set(current) | set(record) if current.get(k) != record.get(k))
        if not allow_changed:
            detail = "; ".join(f"{k}: {current.get(k)!r} -> {record.get(k)!r}" for k in changed)
            raise SweepError(
                f"{task_dir}: the finished runs there were made with other settings ({detail[:600]}); give "
                "another --output-dir, or --allow-changed-settings to resume with these (the runs done are kept)"
            )
        history = list(old.get("history", [])) + [current]
        record = {**record, "history": history}
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(record, indent=1) + "\n")


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=list))


def selection_score(task_metric: str, scores: Mapping[str, Mapping[str, float]]) -> float:
    """The number a grid point is chosen by: ``task_metric`` averaged over the run's dev splits."""
    try:
        return statistics.fmean(float(s[task_metric]) for s in scores.values())
    except KeyError:
        raise SweepError(f"a run's scores have no {task_metric!r}: {sorted(next(iter(scores.values())))}") from None


def execute(
    sweep: Sweep,
    out: str | Path,
    run_one: RunOne | None = None,
    *,
    max_runs: int | None = None,
    shard: tuple[int, int] | None = None,
    allow_changed_settings: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Run every run of ``sweep`` not done yet under ``out`` (``max_runs``: stop after that many in this sitting;
    ``shard=(i, n)``: only runs i, i+n, i+2n ... of the plan, for n parallel jobs). Returns counts: done before,
    run now, left."""
    run_one = run_one or default_run_one()
    out = Path(out)
    runs = sweep.runs()
    if shard is not None:
        i, n = shard
        runs = runs[i::n]
    counts = {"done_before": 0, "ran": 0, "left": 0}
    checked: set[tuple[str, str]] = set()
    for run in runs:
        key = (run.model.tag, run.task)
        if key not in checked:
            check_settings(out / run.model.tag / run.task, settings_record(run, sweep.protocol.name),
                           allow_changed_settings)  # fmt: skip
            checked.add(key)
        where = run.path(out)
        if (where / RESULT).exists():
            counts["done_before"] += 1
            continue
        if max_runs is not None and counts["ran"] >= max_runs:
            counts["left"] += 1
            continue
        log(f"[evaluate] {run.model.tag} {run.task} {run.point.name} seed {run.seed}: fine-tuning")
        with atomic_dir(where) as tmp:
            result = run_one(run, tmp / WORK)
            shutil.rmtree(tmp / WORK, ignore_errors=True)
            for split, preds in result.predictions.items():
                (tmp / f"predictions_{split}.json").write_text(json.dumps(preds) + "\n")
            record = {
                "model": asdict(run.model),
                "task": run.task,
                "grid_point": asdict(run.point),
                "seed": run.seed,
                "scores": result.scores,
                "train_seconds": result.train_seconds,
                "train_tokens": result.train_tokens,
                "steps": result.steps,
                "train_examples": result.train_examples,
                "info": _jsonable(result.info),
            }
            (tmp / RESULT).write_text(json.dumps(record, indent=1) + "\n")
        counts["ran"] += 1
        shown = ", ".join(
            f"{split} " + " ".join(f"{k} {v:.2f}" for k, v in sc.items()) for split, sc in result.scores.items()
        )
        log(f"[evaluate] {run.model.tag} {run.task} {run.point.name} seed {run.seed}: {shown} "
            f"({result.train_seconds:.1f} s, {result.train_tokens} tokens)")  # fmt: skip
    return counts


def load_result(run: Run, out: str | Path) -> dict[str, Any] | None:
    """A finished run's result.json, or None."""
    path = run.path(out) / RESULT
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SweepError(f"{path}: unreadable ({e}); remove its run directory to run it again") from e


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarize_task(
    task: str, metric: str, grid: Sequence[GridPoint], seeds: Sequence[int], results: Mapping[tuple[str, int], dict]
) -> dict[str, Any]:
    """One (model, task) cell: ``results`` maps (grid point name, seed) -> result.json of the finished runs."""
    planned = len(grid) * len(seeds)
    per_point = {}
    for p in grid:
        got = [results[(p.name, k)] for k in seeds if (p.name, k) in results]
        if got:
            per_point[p.name] = (p, got)
    done = [r for _, rs in per_point.values() for r in rs]
    cell: dict[str, Any] = {
        "runs_done": len(done),
        "runs_planned": planned,
        "compute": {
            "train_seconds": sum(float(r["train_seconds"]) for r in done),
            "train_tokens": sum(int(r["train_tokens"]) for r in done),
            "seconds_per_run": statistics.fmean(float(r["train_seconds"]) for r in done) if done else None,
            "tokens_per_run": statistics.fmean(int(r["train_tokens"]) for r in done) if done else None,
        },
    }
    if not per_point:
        return cell
    grid_medians = {
        name: _median([selection_score(metric, r["scores"]) for r in rs]) for name, (_, rs) in per_point.items()
    }
    best = max(grid_medians, key=lambda n: (grid_medians[n], -list(grid_medians).index(n)))
    point, runs = per_point[best]
    splits = list(runs[0]["scores"])
    metrics = list(runs[0]["scores"][splits[0]])
    cell.update(
        best_point={"name": best, **asdict(point)},
        seeds=[r["seed"] for r in runs],
        grid=grid_medians,
        median={s: {m: _median([float(r["scores"][s][m]) for r in runs]) for m in metrics} for s in splits},
        per_seed={s: [float(r["scores"][s][metric]) for r in runs] for s in splits},
        spread={
            s: [min(float(r["scores"][s][metric]) for r in runs), max(float(r["scores"][s][metric]) for r in runs)]
            for s in splits
        },
    )
    return cell


def summarize(sweep: Sweep, out: str | Path) -> dict[str, Any]:
    """The sweep's report (JSON-able): per task and model the median over seeds of the best grid point, its spread,
    the compute; per suite and model the papers' average where every column is there; how it was narrowed."""
    from tools.evaluate.tasks import TASKS, column, suite_average

    out = Path(out)
    report: dict[str, Any] = {
        "protocol": sweep.protocol.name,
        "paper": sweep.protocol.paper,
        "not_reproduced": list(sweep.protocol.not_reproduced),
        "suites": {k: list(v) for k, v in sweep.protocol.suites.items()},
        "models": [asdict(m) for m in sweep.models],
        "narrowed": sweep.narrowed(),
        "spread": "min-max over seeds of the table metric at the best grid point",
        "tasks": [],
        "averages": {},
    }
    for t in sweep.tasks:
        task = TASKS[t]
        grid, seeds = sweep.grid(t), sweep.task_seeds(t)
        row: dict[str, Any] = {
            "task": t,
            "suite": sweep.protocol.suite_of(t),
            "table_metric": task.table_metric,
            "eval_splits": list(task.eval_splits),
            "columns": [column(task, s) for s in task.eval_splits],
            "cells": {},
        }
        for m in sweep.models:
            results = {}
            for p in grid:
                for k in seeds:
                    r = load_result(Run(m, t, p, k, sweep.protocol.settings[t], sweep.data_dir), out)
                    if r is not None:
                        results[(p.name, k)] = r
            row["cells"][m.tag] = summarize_task(t, task.table_metric, grid, seeds, results)
        report["tasks"].append(row)
    incomplete = [
        f"{row['task']} x {tag}: {c['runs_done']} of {c['runs_planned']} runs"
        for row in report["tasks"]
        for tag, c in row["cells"].items()
        if c["runs_done"] < c["runs_planned"]
    ]
    report["incomplete"] = incomplete
    for suite in dict.fromkeys(row["suite"] for row in report["tasks"]):
        per_model = {}
        for m in sweep.models:
            scores = {}
            for row in report["tasks"]:
                cell = row["cells"][m.tag]
                if row["suite"] == suite and "median" in cell:
                    for split, col in zip(row["eval_splits"], row["columns"]):
                        scores[col] = cell["median"][split][row["table_metric"]]
            try:
                per_model[m.tag] = suite_average(suite, scores)
            except UserError:  # a column is missing: no average (an average over fewer tasks is not the papers')
                per_model[m.tag] = None
        report["averages"][suite] = per_model
    return report


# ----------------------------------------------------------------------------------------------- the real run
def default_run_one() -> RunOne:
    """load_split -> finetune -> score (tools/evaluate/data.py, tools/finetune.py, tools/evaluate/metrics.py); the
    data of a task is read once per process."""
    cache: dict[tuple[str, str, str, int | None], list] = {}

    def split(run: Run, name: str, limit: int | None) -> list:
        from tools.evaluate.data import load_split

        key = (run.task, run.data_dir, name, limit)
        if key not in cache:
            cache[key] = load_split(run.task, run.data_dir, name, limit=limit)
        return cache[key]

    def run_one(run: Run, work: Path) -> RunResult:
        from tools.evaluate.metrics import score
        from tools.evaluate.tasks import TASKS
        from tools.finetune import FinetuneConfig, finetune

        task = TASKS[run.task]
        train = split(run, "train", run.limit_train)
        evals = {s: split(run, s, run.limit_eval) for s in task.eval_splits}
        cfg = FinetuneConfig(
            lr=run.point.lr,
            batch_size=run.point.batch_size,
            weight_decay=run.point.weight_decay,
            epochs=run.point.epochs,
            warmup_fraction=run.setting.warmup_fraction,
            seed=run.seed,
            max_length=run.setting.max_length,
            doc_stride=run.setting.doc_stride,
            device=run.device,
            precision=run.precision,
            output_dir=str(work),
        )
        res = finetune(
            run.model.path,
            task.kind,
            train,
            evals,
            cfg,
            num_labels=task.num_labels,
            with_negative=task.with_negative,
        )
        return RunResult(
            scores={s: score(task, evals[s], res.predictions[s]) for s in evals},
            predictions={s: predictions_json(evals[s], res.predictions[s]) for s in evals},
            train_seconds=res.train_seconds,
            train_tokens=res.train_tokens,
            steps=res.steps,
            train_examples=res.train_examples,
            info={**res.info, "train_loss_first": res.train_loss_first, "train_loss_last": res.train_loss_last},
        )

    return run_one


def predictions_json(examples: Iterable[Any], predictions: Any) -> dict[str, Any]:
    """Predictions by example id (QA: ``text`` and ``null_odds`` by question id, as examples.QAPredictions)."""
    if hasattr(predictions, "text"):
        return {"text": predictions.text, "null_odds": predictions.null_odds}
    return {ex.id: p for ex, p in zip(examples, predictions)}
