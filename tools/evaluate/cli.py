"""``python -m tools.evaluate``'s settings: one config dataclass, its flags generated from the fields
(common/cli.py ``add_flags``), names checked against the registries (an unknown one names the nearest)."""

from __future__ import annotations

import argparse
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from common.cli import HelpFormatter, add_flags, build, cli
from common.errors import UserError
from tools.device import PRECISIONS
from tools.evaluate.protocols import PROTOCOLS
from tools.evaluate.sweep import Model, Sweep

TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def nearest(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown(flag: str, name: str, choices: Iterable[str], what: str) -> UserError:
    choices = list(choices)
    return UserError(f"{flag} {name!r} is not {what}{nearest(name, choices)}; choose from: {', '.join(choices)}")


@dataclass
class EvaluateConfig:
    """One evaluation: checkpoints x a protocol's tasks x its grid x seeds, resumable, ending in a table."""

    protocol: str
    """The paper whose fine-tuning protocol to follow (tools/evaluate/protocols.py)."""
    data_dir: str
    """Directory holding the tasks' data in any supported layout (docs/evaluation_data.md); nothing is downloaded."""
    output_dir: str
    """Sweep directory: one directory per run, settings.json per model and task, table.md and table.json."""
    model: list[str] = field(default_factory=list, metadata=cli(skip=True))
    """Checkpoints to compare, each a Hugging Face directory or TAG=DIR (the table's column name; default: the
    directory's name); repeat the flag or give several."""
    suite: list[str] | None = None
    """The protocol's suites to run (default: all of the protocol's)."""
    tasks: list[str] | None = None
    """Only these tasks of the protocol (narrows the sweep; the table says so)."""
    lr: list[float] | None = None
    """Only these learning rates of the protocol's grid (narrows the sweep)."""
    batch_size: list[int] | None = None
    """Only these batch sizes of the protocol's grid (narrows the sweep)."""
    weight_decay: list[float] | None = None
    """Only these weight decays of the protocol's grid (narrows the sweep)."""
    epochs: list[float] | None = None
    """Only these epoch counts of the protocol's grid (narrows the sweep)."""
    seeds: list[int] | None = None
    """Only these of the protocol's seeds (narrows the sweep)."""
    limit_train: int | None = None
    """Fine-tune on the first N training examples of each task only (a quick look; the table says so)."""
    limit_eval: int | None = None
    """Score the first N examples of each dev set only (a quick look; the table says so)."""
    device: str | None = None
    """cpu, cuda or cuda:N for every run; default: the GPU when there is one."""
    precision: str = field(default="auto", metadata=cli(choices=lambda: PRECISIONS))
    """Autocast precision of the fine-tunings (tools/finetune.py)."""
    max_runs: int | None = None
    """Stop after this many fine-tunings in this sitting (run the same command again to go on)."""
    shard: str | None = None
    """I/N: run only runs I, I+N, I+2N, ... of the plan (0 <= I < N), e.g. one Slurm array task each
    (--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); then one --report-only run writes the table."""
    dry_run: bool = False
    """Print the runs the command would make (and how many), then exit."""
    report_only: bool = False
    """Run nothing: write the table from the runs done so far."""
    allow_changed_settings: bool = False
    """Resume although a task's settings.json records other settings (e.g. the data or checkpoint moved); the
    finished runs are kept and the old settings stay in its history."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise _unknown("--protocol", self.protocol, PROTOCOLS, "a protocol")
        proto = PROTOCOLS[self.protocol]
        for s in self.suite or ():
            if s not in proto.suites:
                raise _unknown("--suite", s, proto.suites, f"a suite of protocol {self.protocol}")
        for t in self.tasks or ():
            if t not in proto.settings:
                others = [p.name for p in PROTOCOLS.values() if t in p.settings]
                if others:
                    raise UserError(
                        f"--tasks {t}: protocol {self.protocol} does not evaluate it ({', '.join(others)} does); "
                        f"choose from: {', '.join(proto.tasks)}"
                    )
                raise _unknown("--tasks", t, proto.tasks, f"a task of protocol {self.protocol}")
            if self.suite and proto.suite_of(t) not in self.suite:
                raise UserError(f"--tasks {t} is not in --suite {' '.join(self.suite)}; drop one of the two")
        if not self.model:
            raise UserError("give at least one --model (a Hugging Face directory, or TAG=DIR)")
        for flag, v in (("--limit-train", self.limit_train), ("--limit-eval", self.limit_eval),
                        ("--max-runs", self.max_runs)):  # fmt: skip
            if v is not None and v < 1:
                raise UserError(f"{flag} must be >= 1, got {v}")
        self.shard_pair()
        if not self.report_only and not self.dry_run and not Path(self.data_dir).is_dir():
            raise UserError(f"--data-dir {self.data_dir}: no such directory")

    def models(self) -> tuple[Model, ...]:
        """``--model`` values as (tag, path): ``TAG=DIR`` or ``DIR`` (tag: its name)."""
        out = []
        for spec in self.model:
            tag, sep, path = spec.partition("=")
            if not sep:
                tag, path = Path(spec.rstrip("/")).name, spec
            if not TAG.match(tag):
                raise UserError(f"--model {spec}: tag {tag!r} must be letters, digits, '.', '_' or '-'; give TAG=DIR")
            if not self.report_only and not Path(path).is_dir():
                raise UserError(f"--model {spec}: {path} is not a directory (a Hugging Face export)")
            out.append(Model(tag, str(path)))
        return tuple(out)

    def shard_pair(self) -> tuple[int, int] | None:
        """``--shard I/N`` as (I, N)."""
        if self.shard is None:
            return None
        m = re.fullmatch(r"(\d+)/(\d+)", self.shard)
        if not m or not int(m[1]) < int(m[2]):
            raise UserError(f"--shard {self.shard}: give I/N with 0 <= I < N (e.g. 3/16)")
        return int(m[1]), int(m[2])

    def sweep(self) -> Sweep:
        """The sweep these settings ask for."""
        proto = PROTOCOLS[self.protocol]
        suites = self.suite or list(proto.suites)
        tasks = [t for s in suites for t in proto.suites[s] if not self.tasks or t in self.tasks]
        tup = lambda v: None if v is None else tuple(v)  # noqa: E731
        return Sweep(
            protocol=proto,
            models=self.models(),
            tasks=tuple(tasks),
            data_dir=str(self.data_dir),
            lrs=tup(self.lr),
            batch_sizes=tup(self.batch_size),
            weight_decays=tup(self.weight_decay),
            epochs=tup(self.epochs),
            seeds=tup(self.seeds),
            limit_train=self.limit_train,
            limit_eval=self.limit_eval,
            device=self.device,
            precision=self.precision,
        )


def build_parser(description: str = "") -> argparse.ArgumentParser:
    """One flag per :class:`EvaluateConfig` field; the names' choices come from the registries."""
    p = argparse.ArgumentParser(prog="python -m tools.evaluate", description=description, formatter_class=HelpFormatter)
    add_flags(p, EvaluateConfig)
    p.add_argument("--model", dest="model", action="extend", nargs="+", default=[], help=_doc("model"))
    choices = {
        "protocol": list(PROTOCOLS),
        "suite": sorted({s for p in PROTOCOLS.values() for s in p.suites}),
        "tasks": list(dict.fromkeys(t for p in PROTOCOLS.values() for t in p.tasks)),
    }
    for action in p._actions:
        if action.dest in choices:
            action.help = f"{action.help} Choices: {', '.join(choices[action.dest])}."
    return p


def _doc(name: str) -> str:
    from common.cli import field_docs

    return field_docs(EvaluateConfig)[name]


def parse(argv: list[str], description: str = "") -> EvaluateConfig:
    """The command line as a validated :class:`EvaluateConfig`."""
    ns = build_parser(description).parse_args(argv)
    return build(EvaluateConfig, ns, model=ns.model)
