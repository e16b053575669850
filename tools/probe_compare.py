"""Did pretraining help? The quickstart's last screen: the probe tasks (tools.evaluate.probe_data, held-out text)
fine-tuned from the pretrained export and from its untrained twin (tools.random_init), same budget, several seeds,
in one process (the imports cost seconds).

    python -m tools.probe_compare --model out/quickstart/hf --data-dir out/quickstart/probe

Prints one row per task (median dev accuracy over seeds, and the spread max - min, for each model) and exits 1 unless,
on every task, the pretrained model's median beats the random-init median by more than the larger of the two
spreads: the gap must exceed what reseeding alone moves either model by.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
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
    seeds: list[str] = field(default_factory=lambda: ["1", "2", "3"])
    """Fine-tuning seeds (head init, data order, dropout); the same for both models."""
    lr: float = 1e-3
    """Peak learning rate (both models; a tiny model fine-tunes at the rate it pretrained at, 1e-3 to 2e-3)."""
    epochs: float = 10.0
    """Passes over each task's training set."""
    batch_size: int = 16
    """Examples per step."""
    padding: str = "longest"
    """tools.finetune's padding: longest (the probes' sentences are short: about 3x cheaper than padding to the
    model's N) or auto (BlockBERT at its pretraining N, the papers' protocol)."""
    json_out: str | None = None
    """Also write every run's accuracy and the summary as JSON here."""

    def __post_init__(self) -> None:
        from tools.evaluate.tasks import TASKS

        bad = [t for t in self.tasks if t not in TASKS]
        if bad or not self.tasks:
            raise ValueError(f"--tasks: unknown {bad or 'none given'}; give probe_pair and/or probe_single")
        if len(self.seeds) < 2:
            raise ValueError("--seeds: give at least 2 (the spread over seeds is the yardstick)")
        if self.lr <= 0 or self.epochs <= 0 or self.batch_size < 1:
            raise ValueError("--lr and --epochs must be > 0, --batch-size >= 1")


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


def compare(cfg: CompareConfig) -> dict[str, Any]:
    """Every task x model x seed, fine-tuned and scored; returns the runs, the verdict per task, the seconds."""
    t0 = time.time()
    from tools.evaluate.data import load_split
    from tools.evaluate.metrics import score
    from tools.evaluate.tasks import get_task
    from tools.finetune import FinetuneConfig, finetune
    from tools.random_init import random_init

    src = Path(cfg.model)
    twin = Path(cfg.random_init) if cfg.random_init else src.with_name(src.name + "_random_init")
    if not (twin / "config.json").is_file():
        random_init(src, twin, seed=0)
    models = {"pretrained": str(src), "random-init": str(twin)}
    runs: dict[str, dict[str, list[float]]] = {}
    train_seconds = 0.0
    with tempfile.TemporaryDirectory(prefix="probe_compare.") as scratch:
        for name in cfg.tasks:
            task = get_task(name)
            train = load_split(task, cfg.data_dir, "train")
            dev = load_split(task, cfg.data_dir, "validation")
            runs[name] = {}
            for label, path in models.items():
                accs = []
                for seed in cfg.seeds:
                    ft = FinetuneConfig(
                        output_dir=f"{scratch}/{name}_{label}_{seed}",
                        lr=cfg.lr,
                        epochs=cfg.epochs,
                        batch_size=cfg.batch_size,
                        padding=cfg.padding,
                        seed=int(seed),
                        device="cpu",
                    )
                    res = finetune(path, task.kind, train, {"validation": dev}, ft, num_labels=task.num_labels)
                    train_seconds += res.train_seconds
                    accs.append(score(task, dev, res.predictions["validation"])["accuracy"])
                runs[name][label] = accs
    return {
        "config": asdict(cfg),
        "models": models,
        "runs": runs,
        "verdict": {t: verdict(r["pretrained"], r["random-init"]) for t, r in runs.items()},
        "dev_examples": {t: len(load_split(t, cfg.data_dir, "validation")) for t in cfg.tasks},
        "seconds": time.time() - t0,
        "train_seconds": train_seconds,
    }


def report(result: dict[str, Any]) -> str:
    """The table: one row per task, the two models side by side (median over seeds, spread), the gap."""
    cfg = result["config"]
    lines = [
        f"Fine-tuned on held-out text ({len(cfg['seeds'])} seeds each, lr {cfg['lr']:g}, {cfg['epochs']:g} epochs, "
        f"batch {cfg['batch_size']}): dev accuracy, median over seeds (spread max - min)",
        f"  {'task':<13} {'dev':>4}  {'pretrained':>16}  {'random-init':>16}  {'gap':>6}",
    ]
    for task, v in result["verdict"].items():
        pre = f"{v['pretrained_median']:>7.1f} (±{v['pretrained_spread']:4.1f})"
        lines.append(
            f"  {task:<13} {result['dev_examples'][task]:>4}  {pre}"
            f"  {v['random_median']:>7.1f} (±{v['random_spread']:4.1f})  {v['gap']:>+6.1f}"
            f"  {'pretraining helped' if v['helped'] else 'NOT beyond the spread'}"
        )
    lines.append(f"({len(cfg['tasks']) * 2 * len(cfg['seeds'])} fine-tunings in {result['seconds']:.0f} s, "
                 f"{result['train_seconds']:.0f} s of it in training loops)")  # fmt: skip
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
