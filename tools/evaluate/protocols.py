"""The papers' fine-tuning protocols as data: one registry (:data:`PROTOCOLS`), from which the command line's
choices, the sweep's grid and docs/evaluation.md's tables are derived.

A protocol names, per task, the grid the paper searches (learning rate x batch size x weight decay x epochs), what
stays fixed (warmup, max length, window stride) and the seeds each grid point is repeated with. Every setting says
where it comes from (``source``): the paper's table or section, or, where the paper is silent, what we chose and why.

What none of the four papers does, and so is not in the registry: starting a task from another task's fine-tuned
model (RoBERTa starts RTE/MRPC/STS-B from its MNLI model; none of SparseBERT, DIET, BlockBERT or the fixed-head-size
paper says so), and picking a checkpoint during fine-tuning (DIET's Table 7 lists a "checkpoint interval" of 3.5k
steps; we score the model at the end of training, see :data:`Protocol.not_reproduced`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class GridPoint:
    """One point of a task's hyperparameter grid (what a paper searches over; seeds repeat each point)."""

    lr: float
    """Peak learning rate (linear warmup, then linear decay to 0)."""
    batch_size: int
    """Examples (QA: windows) per optimizer step."""
    weight_decay: float
    """AdamW weight decay."""
    epochs: float
    """Passes over the training set."""

    @property
    def name(self) -> str:
        """The run directory's name for this point: ``lr2e-05_bs32_wd0.01_ep3``."""
        return f"lr{self.lr:g}_bs{self.batch_size}_wd{self.weight_decay:g}_ep{self.epochs:g}"


@dataclass(frozen=True)
class TaskSetting:
    """How one protocol fine-tunes one task: the grid, the fixed settings and the seeds."""

    lrs: tuple[float, ...]
    """Learning rates searched."""
    batch_sizes: tuple[int, ...]
    """Batch sizes searched (examples, or QA windows, per optimizer step)."""
    weight_decays: tuple[float, ...] = (0.01,)
    """AdamW weight decays searched."""
    epochs: tuple[float, ...] = (3.0,)
    """Training lengths searched, in epochs."""
    warmup_fraction: float = 0.1
    """Linear warmup over this fraction of the steps, then linear decay to 0."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Each grid point is fine-tuned once per seed; the table reports the median over these."""
    max_length: int | None = None
    """Longest input in tokens; None: the checkpoint's max_position_embeddings (its pretraining N)."""
    doc_stride: int = 128
    """Extractive QA: distance in context tokens between the starts of consecutive windows of a long context."""
    source: str = ""
    """Where each value comes from: the paper's table or section, or why we chose it where the paper is silent."""

    def __post_init__(self) -> None:
        for name in ("lrs", "batch_sizes", "weight_decays", "epochs", "seeds"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"TaskSetting.{name} must be non-empty without repeats, got {values!r}")
        if any(v <= 0 for v in self.lrs + self.epochs) or any(b < 1 for b in self.batch_sizes):
            raise ValueError("learning rates and epochs must be > 0 and batch sizes >= 1")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.max_length is not None and self.max_length < 8:
            raise ValueError(f"max_length must be >= 8 or None, got {self.max_length}")
        if self.doc_stride < 1:
            raise ValueError(f"doc_stride must be >= 1, got {self.doc_stride}")

    def grid(self) -> list[GridPoint]:
        """Every grid point, in a fixed order (lr, then batch size, weight decay, epochs)."""
        return [
            GridPoint(lr, bs, wd, ep)
            for lr, bs, wd, ep in itertools.product(self.lrs, self.batch_sizes, self.weight_decays, self.epochs)
        ]


@dataclass(frozen=True)
class Protocol:
    """One paper's evaluation: which tasks (per suite, in its tables' column order) and how each is fine-tuned."""

    name: str
    """Registry key, the value of ``--protocol``."""
    paper: str
    """The paper (and the section of it that gives the protocol)."""
    suites: Mapping[str, tuple[str, ...]]
    """Suite -> the task names the paper reports for it, in its tables' order (task names: tools/evaluate/tasks.py)."""
    settings: Mapping[str, TaskSetting]
    """Task name -> its setting; one per task of :attr:`suites`."""
    not_reproduced: tuple[str, ...] = ()
    """What the paper does that this protocol does not (said in the docs and in every table it makes)."""

    def __post_init__(self) -> None:
        tasks = [t for ts in self.suites.values() for t in ts]
        if sorted(tasks) != sorted(self.settings) or len(set(tasks)) != len(tasks):
            raise ValueError(f"protocol {self.name}: every task of its suites needs exactly one setting")
        object.__setattr__(self, "suites", MappingProxyType(dict(self.suites)))
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings)))

    @property
    def tasks(self) -> tuple[str, ...]:
        """Every task of the protocol, suite by suite."""
        return tuple(t for ts in self.suites.values() for t in ts)

    def suite_of(self, task: str) -> str:
        """The suite a task of this protocol belongs to."""
        return next(s for s, ts in self.suites.items() if task in ts)


def _same(tasks: tuple[str, ...], setting: TaskSetting) -> dict[str, TaskSetting]:
    return {t: setting for t in tasks}


GLUE8 = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")
"""The GLUE tasks the papers report (WNLI left out, as BERT does), in SparseBERT's Table 1 order."""
MRQA5 = ("mrqa_searchqa", "mrqa_triviaqa", "mrqa_newsqa", "mrqa_naturalquestions", "mrqa_hotpotqa")
"""BlockBERT's Table 4 (MRQA without its SQuAD, which Table 3 reports), sorted by paragraph length as there."""

_SB = "SparseBERT (Shi et al., 2021) Appendix C, Table 4"
_SB_LRS = (1e-5, 1.5e-5, 2e-5, 3e-5, 4e-5, 5e-5)


def _sparsebert(bs: int, ep: float, ml: int | None, ml_note: str) -> TaskSetting:
    return TaskSetting(
        lrs=_SB_LRS,
        batch_sizes=(bs,),
        weight_decays=(0.1, 0.01),
        epochs=(ep,),
        max_length=ml,
        source=f"{_SB}: batch {bs}, weight decay {{0.1, 0.01}}, warmup 0.1, linear decay, {ep:g} epochs, lr {{1e-5, "
        "1.5e-5, 2e-5, 3e-5, 4e-5, 5e-5}; Sec. 3.3: 'averaged over three random repetitions' (we report the median "
        f"of three seeds); max length: {ml_note}",
    )


SPARSEBERT = Protocol(
    name="sparsebert",
    paper="SparseBERT: Rethinking the Importance Analysis in Self-attention (Shi et al., ICML 2021), Appendix C",
    suites={"glue": GLUE8, "swag": ("swag",), "squad1": ("squad1",), "squad2": ("squad2",)},
    settings={
        **_same(GLUE8, _sparsebert(32, 3, 128, "128, the pretraining n (Sec. 3.1) and BERT's GLUE length")),
        "swag": _sparsebert(16, 3, 128, "128, the pretraining n"),
        "squad1": _sparsebert(32, 3, None, "the checkpoint's N (not stated; windows of stride 128 as BERT)"),
        "squad2": _sparsebert(48, 2, None, "the checkpoint's N (not stated; windows of stride 128 as BERT)"),
    },
)

_DIET = "DIET (Chen et al., 2021) Appendix A, Table 7"
DIET = Protocol(
    name="diet",
    paper="A Simple and Effective Positional Encoding for Transformers (DIET; Chen et al., EMNLP 2021), Table 7",
    suites={"glue": GLUE8, "xnli": ("xnli",)},
    settings={
        **_same(
            GLUE8,
            TaskSetting(
                lrs=(1e-5, 2e-5, 3e-5, 4e-5),
                batch_sizes=(32,),
                epochs=(5.0, 10.0),
                max_length=128,
                source=f"{_DIET} (English): lr {{1e-5, 2e-5, 3e-5, 4e-5}}, warmup 0.1, N=128, batch 32, '5 or 10 "
                "epochs' (searched: the paper does not say which task gets which); weight decay and seeds not "
                "stated: 0.01 (BERT's) and three seeds",
            ),
        ),
        "xnli": TaskSetting(
            lrs=(1e-5, 2e-5, 3e-5, 4e-5),
            batch_sizes=(32,),
            epochs=(3.0,),
            max_length=512,
            source=f"{_DIET} (multilingual): lr {{1e-5, 2e-5, 3e-5, 4e-5}}, warmup 0.1, N=512, batch 32, 3 epochs; "
            "weight decay and seeds not stated: 0.01 and three seeds",
        ),
    },
    not_reproduced=(
        "DIET evaluates a checkpoint every 3.5k fine-tuning steps (Table 7); we score the model at the end of training",
        "DIET's per-head segment encoding for pair tasks is a property of the exported model, not of this protocol",
    ),
)

_BB = "BlockBERT (Qiu et al., 2020) Appendix A.4"
_BB_SETTING = TaskSetting(
    lrs=(5e-6, 1e-5, 2e-5, 3e-5, 5e-5),
    batch_sizes=(16, 32),
    epochs=(4.0,),
    max_length=None,
    doc_stride=128,
    source=f"{_BB}: max_sequence_length = N of pretraining, sliding window stride 128, lr {{5e-6, 1e-5, 2e-5, 3e-5, "
    "5e-5} x batch {16, 32}, 4 epochs; warmup, weight decay and seeds not stated: 0.1 and 0.01 (the SpanBERT and "
    "HuggingFace code it builds on) and three seeds",
)
BLOCKBERT = Protocol(
    name="blockbert",
    paper="Blockwise Self-Attention for Long Document Understanding (BlockBERT; Qiu et al., Findings of EMNLP 2020), "
    "Sec. 4.2 and Appendix A.4",
    suites={"squad1": ("squad1",), "squad2": ("squad2",), "mrqa": MRQA5},
    settings=_same(("squad1", "squad2", *MRQA5), _BB_SETTING),
    not_reproduced=(
        "BlockBERT splits each MRQA development set in halves (a new dev set and a test set, after SpanBERT) and "
        "reports the test half; the split is the data's (docs/evaluation_data.md), the sweep reports what it scores",
    ),
)

_HS = (
    "the fixed-head-size paper (Bhojanapalli et al., ICML 2020), Appendix C: 'we follow the same experimental "
    "settings as in (Devlin et al.) [2018)'; the values are BERT's (Devlin et al., Sec. 4.1 / 4.2)"
)
HEADSIZE = Protocol(
    name="headsize",
    paper="Low-Rank Bottleneck in Multi-head Attention Models (Bhojanapalli et al., ICML 2020), Appendix C and Table 3",
    suites={"glue": ("mnli",), "squad1": ("squad1",)},
    settings={
        "mnli": TaskSetting(
            lrs=(5e-5, 4e-5, 3e-5, 2e-5),
            batch_sizes=(32,),
            epochs=(3.0,),
            max_length=128,
            source=f"{_HS}: GLUE batch 32, 3 epochs, lr {{5e-5, 4e-5, 3e-5, 2e-5}}, N=128; Table 3 prints mean ± "
            "std, the number of runs is not stated: three seeds",
        ),
        "squad1": TaskSetting(
            lrs=(5e-5,),
            batch_sizes=(32,),
            epochs=(3.0,),
            max_length=384,
            doc_stride=128,
            source=f"{_HS}: SQuAD v1.1 3 epochs, lr 5e-5, batch 32, max length 384, stride 128; the SQuAD version "
            "is not named (F1 ~90 is v1.1's range); three seeds as for MNLI",
        ),
    },
)

_PROBE_BUDGET = dict(lrs=(1e-3,), batch_sizes=(16,), weight_decays=(0.01,), seeds=(1, 2, 3), max_length=None)
"""What both probe tasks share (lr 1e-3, batch 16, seeds 1-3); their epochs differ (calibrated per task)."""

QUICKSTART = Protocol(
    name="quickstart",
    paper="none: the quickstart's probe of whether pretraining helped (tools/evaluate/probe_data.py's tasks)",
    suites={"probe": ("probe_pair", "probe_single")},
    settings={
        # calibrated on the 2-core development box, 2026-11-29, against the export of the quickstart's 600-step run
        # (docs/troubleshooting.md, "Step 9: what it measures"): one fine-tuning step of the 2-layer, 128-wide
        # model costs ~45 ms (single) to ~70 ms (pair) CPU on one thread
        "probe_single": TaskSetting(
            **_PROBE_BUDGET,
            epochs=(6.0,),
            source="calibrated on this machine (issue #54 item 6; docs/troubleshooting.md, step 9): 78 steps, ~4 s "
            "CPU per run; over seeds 1-6 the pretrained model learned it in 5 (81-86%, one at 64%), random-init in "
            "none (50%); at 8 epochs random-init learns it too (5 of 6, 72-86%), at 4 the pretrained model is "
            "unsteady (54-74%)",
        ),
        "probe_pair": TaskSetting(
            **_PROBE_BUDGET,
            epochs=(8.0,),
            source="calibrated on this machine (issue #54 item 6; docs/troubleshooting.md, step 9): 104 steps, ~7 s "
            "CPU per run; over seeds 1-6 the pretrained model learned the minimal pairs in 5 (67-89%, one at 53%), "
            "random-init in none (50%); at 10 epochs random-init learns it in 1 of 6 (78%)",
        ),
    },
)

PROTOCOLS: Mapping[str, Protocol] = MappingProxyType(
    {p.name: p for p in (SPARSEBERT, DIET, BLOCKBERT, HEADSIZE, QUICKSTART)}
)
"""Every protocol by name (``--protocol``'s choices)."""


TRAIN_EXAMPLES: Mapping[str, int] = MappingProxyType(
    {
        # the official training sets (GLUE paper; SWAG; SQuAD 1.1/2.0; MRQA's in-domain train files; XNLI trains on
        # MNLI's English training set): only to size the grids' cost in docs/evaluation.md
        "mnli": 392_702,
        "qqp": 363_846,
        "qnli": 104_743,
        "sst2": 67_349,
        "cola": 8_551,
        "stsb": 5_749,
        "mrpc": 3_668,
        "rte": 2_490,
        "swag": 73_546,
        "squad1": 87_599,
        "squad2": 130_319,
        "xnli": 392_702,
        "mrqa_searchqa": 117_384,
        "mrqa_triviaqa": 61_688,
        "mrqa_newsqa": 74_160,
        "mrqa_naturalquestions": 104_071,
        "mrqa_hotpotqa": 72_928,
    }
)
"""Training examples per task (QA: questions; long contexts give several windows each), for the cost table."""


def cost_markdown() -> list[str]:
    """docs/evaluation.md's table of what each protocol's grid costs per checkpoint: fine-tunings and training
    example-passes (examples x epochs, summed over grid points and seeds), per suite."""
    from common.tables import markdown_table

    rows = []
    for p in PROTOCOLS.values():
        for suite, tasks in p.suites.items():
            runs = sum(len(p.settings[t].grid()) * len(p.settings[t].seeds) for t in tasks)
            known = all(t in TRAIN_EXAMPLES for t in tasks)
            passes = sum(
                TRAIN_EXAMPLES[t] * pt.epochs * len(p.settings[t].seeds) for t in tasks for pt in p.settings[t].grid()
            ) if known else None  # fmt: skip
            grids = sorted({f"{len(p.settings[t].grid())} x {len(p.settings[t].seeds)}" for t in tasks})
            rows.append(
                {
                    "protocol": p.name,
                    "suite": suite,
                    "tasks": len(tasks),
                    "grid": " / ".join(grids),
                    "runs": runs,
                    "passes": None if passes is None else f"{passes / 1e6:,.1f}M",
                }
            )
    return markdown_table(
        rows,
        [
            ("protocol", "protocol"),
            ("suite", "suite"),
            ("tasks", "tasks"),
            ("grid", "grid points x seeds per task"),
            ("runs", "fine-tunings per checkpoint"),
            ("passes", "training examples x epochs per checkpoint"),
        ],
    )


__all__ = ["GridPoint", "TaskSetting", "Protocol", "PROTOCOLS", "GLUE8", "MRQA5", "TRAIN_EXAMPLES", "cost_markdown"]
