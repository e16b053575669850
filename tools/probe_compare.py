"""Did pretraining help? The quickstart's last screen: the probe tasks (tools.evaluate.probe_data, held-out text)
fine-tuned from the pretrained export and from its untrained twin (tools.random_init), same budget, several seeds.
The fine-tunings run side by side in ``--workers`` processes of ``--threads`` threads each (a 2-layer, 128-wide
model's matrices are too small to share between threads; two processes on two cores took 0.60x the wall time of one,
docs/troubleshooting.md, with the same results: every run is seeded and single-threaded).

    python -m tools.probe_compare --model out/quickstart/hf --data-dir out/quickstart/probe

Prints one row per task (median dev accuracy over seeds, and the spread max - min, for each model) and exits 1 unless,
on every task, the pretrained model's median beats the random-init median by more than the larger of the two
spreads: the gap must exceed what reseeding alone moves either model by.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Sequence

from common.cli import HelpFormatter, add_flags
from common.error_exit import run_entry
from common.errors import UserError

PROBE_TASKS = ("probe_pair", "probe_single")


@dataclass
class CompareConfig:
    """The comparison: which export, which probe data, and the one fine-tuning budget both models get."""

    model: str
    """The pretrained Hugging Face export (tools.convert_checkpoint --to-hf)."""
    data_dir: str
    """Where tools.evaluate.probe_data wrote probe_pair/ and probe_single/."""
    random_init: str | None = None
    """The untrained twin's directory; None = made next to --model as <model>_random_init (tools.random_init)."""
    tasks: list[str] = field(default_factory=lambda: list(PROBE_TASKS))
    """Probe tasks to fine-tune (tools/evaluate/tasks.py names)."""
    protocol: str = "quickstart"
    """Where the fine-tuning settings come from (tools/evaluate/protocols.py): its one grid point per probe task
    (learning rate, batch, epochs, weight decay, warmup, max length) and its seeds, the same for both models."""
    seeds: list[int] | None = None
    """Fine-tuning seeds (head init, data order, dropout), the same for both models; default: the protocol's."""
    lr: float | None = None
    """Peak learning rate for every task instead of the protocol's (a look at another budget)."""
    epochs: float | None = None
    """Passes over each task's training set instead of the protocol's."""
    batch_size: int | None = None
    """Examples per step instead of the protocol's."""
    padding: str = "longest"
    """tools.finetune's padding: longest (the probes' sentences are short: about 2-3x cheaper than padding to the
    model's N) or auto (BlockBERT at its pretraining N, the papers' protocol and python -m tools.evaluate's)."""
    threads: int = 1
    """torch CPU threads for the fine-tunings (a CPU run): 1, as a 2-layer, 128-wide model's matrices are too small to
    share, and on a busy 2-core machine two threads cost 5-10x the CPU time of one (measured: docs/troubleshooting.md);
    0 = torch's default."""
    workers: int = 0
    """Processes fine-tuning side by side (each loads torch and transformers once, ~5 s): 0 = one per CPU this process
    may use (os.sched_getaffinity) divided by --threads, at most one per run; 1 = all runs in this process."""
    json_out: str | None = None
    """Also write every run's accuracy and last training loss, and the summary, as JSON here."""

    def __post_init__(self) -> None:
        from tools.evaluate.protocols import PROTOCOLS
        from tools.evaluate.tasks import TASKS

        bad = [t for t in self.tasks if t not in TASKS]
        if bad or not self.tasks:
            raise ValueError(f"--tasks: unknown {bad or 'none given'}; give probe_pair and/or probe_single")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--protocol {self.protocol!r}: choose from {', '.join(PROTOCOLS)}")
        missing = [t for t in self.tasks if t not in PROTOCOLS[self.protocol].settings]
        if missing:
            raise ValueError(f"--protocol {self.protocol} has no setting for {missing}")
        if self.seeds is not None and len(set(self.seeds)) < 2:
            raise ValueError("--seeds: give at least 2 different ones (the spread over seeds is the yardstick)")
        if (self.lr is not None and self.lr <= 0) or (self.epochs is not None and self.epochs <= 0):
            raise ValueError("--lr and --epochs must be > 0")
        if (self.batch_size is not None and self.batch_size < 1) or self.threads < 0 or self.workers < 0:
            raise ValueError("--batch-size must be >= 1, --threads and --workers >= 0")


def settings(cfg: CompareConfig, task: str) -> dict[str, Any]:
    """The fine-tuning settings of one task: the protocol's single grid point and seeds, then the flags given."""
    from tools.evaluate.protocols import PROTOCOLS

    s = PROTOCOLS[cfg.protocol].settings[task]
    grid = s.grid()
    if len(grid) != 1:
        raise UserError(f"--protocol {cfg.protocol}: {task} has {len(grid)} grid points; the comparison takes one "
                        "(give --lr, --epochs, --batch-size, or use python -m tools.evaluate for a grid)")  # fmt: skip
    p = grid[0]
    return {
        "lr": cfg.lr or p.lr,
        "batch_size": cfg.batch_size or p.batch_size,
        "epochs": cfg.epochs or p.epochs,
        "weight_decay": p.weight_decay,
        "warmup_fraction": s.warmup_fraction,
        "max_length": s.max_length,
        "seeds": list(cfg.seeds or s.seeds),
    }


def verdict(pretrained: Sequence[float], random: Sequence[float]) -> dict[str, float | bool]:
    """Medians, spreads (max - min over seeds), the gap between the medians and whether it beats both spreads."""
    med_p, med_r = statistics.median(pretrained), statistics.median(random)
    spread_p, spread_r = max(pretrained) - min(pretrained), max(random) - min(random)
    gap = med_p - med_r
    return {
        "pretrained_median": med_p,
        "pretrained_spread": spread_p,
        "random_median": med_r,
        "random_spread": spread_r,
        "gap": gap,
        "helped": gap > max(spread_p, spread_r),
    }


_SPLITS: dict[tuple[str, str], tuple[Any, list, list]] = {}
"""Per process: (task name, data dir) -> (task, train, dev), read once for all of that task's runs."""


def _splits(name: str, data_dir: str) -> tuple[Any, list, list]:
    from tools.evaluate.data import load_split
    from tools.evaluate.tasks import get_task

    if (name, data_dir) not in _SPLITS:
        task = get_task(name)
        _SPLITS[name, data_dir] = (task, load_split(task, data_dir, "train"), load_split(task, data_dir, "validation"))
    return _SPLITS[name, data_dir]


def _worker_init(threads: int) -> None:
    """A fine-tuning process: torch's thread count, and transformers as quiet as the parent keeps it."""
    import torch
    import transformers

    if threads:
        torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _one_run(run: dict[str, Any]) -> tuple[float, float, float]:
    """One fine-tuning: its dev accuracy (%), the seconds its training loop took, its last logged training loss (a
    run left at chance ends near ln 2 = 0.69)."""
    from tools.evaluate.metrics import score
    from tools.finetune import FinetuneConfig, finetune

    task, train, dev = _splits(run["task"], run["data_dir"])
    s = run["settings"]
    ft = FinetuneConfig(
        output_dir=run["output_dir"],
        lr=s["lr"],
        epochs=s["epochs"],
        batch_size=s["batch_size"],
        weight_decay=s["weight_decay"],
        warmup_fraction=s["warmup_fraction"],
        max_length=s["max_length"],
        padding=run["padding"],
        seed=run["seed"],
        device="cpu",
    )
    # tools.finetune logs every step (the Trainer prints each): keep the screen to the table
    with contextlib.redirect_stdout(io.StringIO()):
        res = finetune(run["model"], task.kind, train, {"validation": dev}, ft, num_labels=task.num_labels)
    return score(task, dev, res.predictions["validation"])["accuracy"], res.train_seconds, res.train_loss_last


def _workers(cfg: CompareConfig, runs: int) -> int:
    if cfg.workers:
        return min(cfg.workers, runs)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(runs, cpus // max(cfg.threads, 1)))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def compare(cfg: CompareConfig) -> dict[str, Any]:
    """Every task x model x seed, fine-tuned and scored; returns the runs, the verdict per task, the seconds."""
    t0 = time.time()
    from tools.random_init import random_init

    src = Path(cfg.model)
    twin = Path(cfg.random_init) if cfg.random_init else src.with_name(src.name + "_random_init")
    if not (twin / "config.json").is_file():
        random_init(src, twin, seed=0)
    models = {"pretrained": str(src), "random-init": str(twin)}
    used = {name: settings(cfg, name) for name in cfg.tasks}
    dev_examples = {name: len(_splits(name, cfg.data_dir)[2]) for name in cfg.tasks}  # bad data fails here, once
    cpu0, children0 = time.process_time(), _children_cpu()
    with tempfile.TemporaryDirectory(prefix="probe_compare.") as scratch:
        plan = []
        for name in cfg.tasks:
            for label, path in models.items():
                for seed in used[name]["seeds"]:
                    plan.append(
                        {
                            "task": name,
                            "data_dir": cfg.data_dir,
                            "settings": used[name],
                            "model": path,
                            "padding": cfg.padding,
                            "label": label,
                            "seed": int(seed),
                            "output_dir": f"{scratch}/{name}_{label}_{seed}",
                        }
                    )
        workers = _workers(cfg, len(plan))
        if workers == 1:
            _worker_init(cfg.threads)
            results = [_one_run(run) for run in plan]
        else:
            # spawn, not fork: a forked child of a process that already ran torch's thread pools can hang
            with ProcessPoolExecutor(
                workers, mp_context=get_context("spawn"), initializer=_worker_init, initargs=(cfg.threads,)
            ) as pool:
                results = list(pool.map(_one_run, plan))
    runs: dict[str, dict[str, list[float]]] = {name: {label: [] for label in models} for name in cfg.tasks}
    losses: dict[str, dict[str, list[float]]] = {name: {label: [] for label in models} for name in cfg.tasks}
    for run, (acc, _, loss) in zip(plan, results):
        runs[run["task"]][run["label"]].append(acc)
        losses[run["task"]][run["label"]].append(loss)
    return {
        "config": asdict(cfg),
        "settings": used,
        "models": models,
        "runs": runs,
        "last_train_losses": losses,
        "verdict": {t: verdict(r["pretrained"], r["random-init"]) for t, r in runs.items()},
        "dev_examples": dev_examples,
        "workers": workers,
        "seconds": time.time() - t0,
        "cpu_seconds": time.process_time() - cpu0 + _children_cpu() - children0,
        "train_seconds": sum(sec for _, sec, _ in results),
    }


def report(result: dict[str, Any]) -> str:
    """The last screen: one row per task, the two models side by side (median dev accuracy over seeds, spread max -
    min), the gap and the verdict; each task's settings and every seed's accuracy (a run left at chance shows there);
    the seconds it all took."""
    lines = [
        "Did pretraining help? Dev accuracy on probes from held-out documents, median over seeds (spread max - min)",
        f"  {'task':<13} {'dev':>4}  {'pretrained':>16}  {'random-init':>16}  {'gap':>6}",
    ]
    for task, v in result["verdict"].items():
        pre = f"{v['pretrained_median']:>7.1f} (±{v['pretrained_spread']:4.1f})"
        lines.append(
            f"  {task:<13} {result['dev_examples'][task]:>4}  {pre}"
            f"  {v['random_median']:>7.1f} (±{v['random_spread']:4.1f})  {v['gap']:>+6.1f}"
            f"  {'pretraining helped' if v['helped'] else 'NOT beyond the spread'}"
        )
    for task, s in result["settings"].items():
        lines.append(f"  {task}: lr {s['lr']:g}, batch {s['batch_size']}, {s['epochs']:g} epochs, seeds "
                     f"{', '.join(map(str, s['seeds']))} (--protocol {result['config']['protocol']})")  # fmt: skip
        per_seed = "; ".join(f"{m} {', '.join(f'{a:.1f}' for a in accs)}" for m, accs in result["runs"][task].items())
        lines.append(f"    per seed: {per_seed}")
    n = sum(2 * len(s["seeds"]) for s in result["settings"].values())
    lines.append(f"  {n} fine-tunings in {result['seconds']:.0f} s wall ({result['workers']} processes), "
                 f"{result['cpu_seconds']:.0f} s CPU ({result['train_seconds']:.0f} s in training loops)")  # fmt: skip
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`CompareConfig` field."""
    p = argparse.ArgumentParser(
        prog="python -m tools.probe_compare", description=__doc__, formatter_class=HelpFormatter
    )
    add_flags(p, CompareConfig)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: exit 0 when pretraining helped on every task, 1 when not, 2 on bad input."""
    return run_entry("tools.probe_compare", _main, argv)


def _main(argv: Sequence[str]) -> int:
    try:
        cfg = CompareConfig(**vars(build_parser().parse_args(argv)))
    except ValueError as e:
        raise UserError(str(e)) from None
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # 24 'Loading weights' bars would bury the table
    result = compare(cfg)
    print(report(result))
    if cfg.json_out:
        Path(cfg.json_out).write_text(json.dumps(result, indent=2) + "\n")
    if not all(v["helped"] for v in result["verdict"].values()):
        print("pretraining did not beat random initialisation by more than the spread over seeds on every task: see "
              "docs/troubleshooting.md", file=sys.stderr)  # fmt: skip
        return 1
    print("OK: the pretrained model beats its random-init twin by more than the spread over seeds on every task")
    return 0


if __name__ == "__main__":
    sys.exit(main())
