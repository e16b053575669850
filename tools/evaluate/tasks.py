"""The task registry: every downstream task the papers evaluate, as data (kind, labels, metrics, dev splits), its
suites in the papers' column order, and the GLUE average as the papers compute it. CLI choices, the docs' tables and
the tests' parameters all derive from :data:`TASKS` and :data:`SUITES`; the file layouts each task is read from live
beside their readers in tools/evaluate/data.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from common.errors import UserError
from tools.evaluate.examples import KINDS


@dataclass(frozen=True)
class Task:
    """One downstream task."""

    name: str
    """Registry key (``cola``, ``mnli``, ``squad2``, ``mrqa_newsqa``, ...)."""
    suite: str
    """glue | swag | squad1 | squad2 | mrqa | xnli | probe."""
    kind: str
    """One of examples.KINDS: what the task asks of the model (and so its head, predictions and metrics)."""
    label_names: tuple[str, ...]
    """Classification labels in index order (HF ``datasets``' ClassLabel order, so its integer labels are ours);
    () for regression, QA and multiple choice."""
    num_choices: int
    """multiple_choice only (SWAG: 4), else 0."""
    metrics: tuple[str, ...]
    """Every metric :func:`tools.evaluate.metrics.score` reports for the task (percent)."""
    table_metric: str
    """The one the papers' tables and the suite average use (CoLA: matthews; STS-B: spearman; MRPC/QQP: f1)."""
    eval_splits: tuple[str, ...]
    """The dev sets scored: ("validation",), MNLI ("validation_matched", "validation_mismatched"); training always
    reads "train"."""
    with_negative: bool = False
    """extractive_qa: unanswerable questions exist (SQuAD 2.0)."""
    title: str = ""
    """How the papers' tables name the task (``MNLI``, ``SST-2``); the column of :func:`column` for one split."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"task {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.table_metric not in self.metrics:
            raise ValueError(f"task {self.name}: table_metric {self.table_metric!r} is not in {self.metrics}")
        if (self.kind == "classification") != bool(self.label_names):
            raise ValueError(f"task {self.name}: label_names are for classification tasks only, and they need them")
        if (self.kind == "multiple_choice") != (self.num_choices > 0):
            raise ValueError(f"task {self.name}: num_choices is for multiple_choice tasks only, and they need it")
        if self.with_negative and self.kind != "extractive_qa":
            raise ValueError(f"task {self.name}: with_negative is for extractive_qa tasks only")

    @property
    def num_labels(self) -> int:
        """Outputs of the head: classes, 1 for regression, 1 per choice (multiple choice), 2 (start/end) for QA."""
        return {"classification": len(self.label_names), "regression": 1, "multiple_choice": 1}.get(self.kind, 2)


_ACC = ("accuracy",)
_QA = ("exact", "f1")
_SQUAD2 = ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_exact_thresh",
           "best_f1", "best_f1_thresh")  # fmt: skip
_NLI3 = ("entailment", "neutral", "contradiction")
_DEV = ("validation",)


def _glue(name: str, title: str, labels: tuple[str, ...], metrics: tuple[str, ...] = _ACC, table: str = "accuracy",
          splits: tuple[str, ...] = _DEV, kind: str = "classification") -> Task:  # fmt: skip
    return Task(name, "glue", kind, labels, 0, metrics, table, splits, title=title)


_MRQA = {  # registry key -> the dataset name in the MRQA file's header (and so in QAExample.dataset)
    "mrqa_squad": "SQuAD",
    "mrqa_newsqa": "NewsQA",
    "mrqa_triviaqa": "TriviaQA-web",
    "mrqa_searchqa": "SearchQA",
    "mrqa_hotpotqa": "HotpotQA",
    "mrqa_naturalquestions": "NaturalQuestionsShort",
}

_ALL = (
    # GLUE (metrics as BERT and SparseBERT report them: acc for MNLI/QNLI/RTE/SST-2, F1 for QQP/MRPC, Spearman for
    # STS-B, Matthews for CoLA)
    _glue("cola", "CoLA", ("unacceptable", "acceptable"), ("matthews", "accuracy"), "matthews"),
    _glue("sst2", "SST-2", ("negative", "positive")),
    _glue("mrpc", "MRPC", ("not_equivalent", "equivalent"), ("f1", "accuracy"), "f1"),
    _glue("stsb", "STS-B", (), ("pearson", "spearman"), "spearman", kind="regression"),
    _glue("qqp", "QQP", ("not_duplicate", "duplicate"), ("f1", "accuracy"), "f1"),
    _glue("mnli", "MNLI", _NLI3, splits=("validation_matched", "validation_mismatched")),
    _glue("qnli", "QNLI", ("entailment", "not_entailment")),
    _glue("rte", "RTE", ("entailment", "not_entailment")),
    _glue("wnli", "WNLI", ("not_entailment", "entailment")),
    Task("swag", "swag", "multiple_choice", (), 4, _ACC, "accuracy", _DEV, title="SWAG"),
    Task("squad1", "squad1", "extractive_qa", (), 0, _QA, "f1", _DEV, title="SQuAD v1.1"),
    # SQuAD 2.0's dev numbers are reported (BERT, SparseBERT) with the no-answer threshold tuned on the dev set
    Task("squad2", "squad2", "extractive_qa", (), 0, _SQUAD2, "best_f1", _DEV, with_negative=True, title="SQuAD v2.0"),
    *(Task(k, "mrqa", "extractive_qa", (), 0, _QA, "f1", _DEV, title=v) for k, v in _MRQA.items()),
    Task("xnli", "xnli", "classification", _NLI3, 0, _ACC, "accuracy", _DEV, title="XNLI"),
    # held-out real text in GLUE's file format (tools/evaluate/probe_data.py): MRPC's layout and SST-2's
    Task(
        "probe_pair",
        "probe",
        "classification",
        ("0", "1"),
        0,
        ("accuracy", "f1"),
        "accuracy",
        _DEV,
        title="probe (pair)",
    ),  # fmt: skip
    Task("probe_single", "probe", "classification", ("0", "1"), 0, _ACC, "accuracy", _DEV, title="probe (single)"),
)

TASKS: dict[str, Task] = {t.name: t for t in _ALL}
"""Every task by registry key."""

MRQA_DATASETS: dict[str, str] = dict(_MRQA)
"""MRQA task -> its dataset's name in the MRQA file header (the in-domain six; BlockBERT reports five of them)."""

SUITES: dict[str, tuple[str, ...]] = {
    # SparseBERT's Table 1 columns (BERT's order); WNLI is registered but, as in the papers, not in the suite
    "glue": ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte"),
    "swag": ("swag",),
    "squad1": ("squad1",),
    "squad2": ("squad2",),
    # BlockBERT's Table 3 order (SQuAD's in-domain MRQA copy last: BlockBERT reports SQuAD from its own files)
    "mrqa": ("mrqa_newsqa", "mrqa_triviaqa", "mrqa_searchqa", "mrqa_hotpotqa", "mrqa_naturalquestions", "mrqa_squad"),
    "xnli": ("xnli",),
    "probe": ("probe_pair", "probe_single"),
}
"""Suite -> its task names, in the papers' column order."""

_SPLIT_SUFFIX = {"validation_matched": "m", "validation_mismatched": "mm"}


def get_task(task: str | Task) -> Task:
    """The registry's task (a Task passes through); an unknown name is a UserError listing the known ones."""
    if isinstance(task, Task):
        return task
    try:
        return TASKS[task]
    except KeyError:
        raise UserError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}") from None


def column(task: str | Task, split: str) -> str:
    """The key of one scored dev set in a results table and in :func:`suite_average`'s ``scores``: the task name,
    or for a task with several dev sets the name and the papers' suffix (``mnli-m``, ``mnli-mm``)."""
    t = get_task(task)
    if split not in t.eval_splits:
        raise ValueError(f"task {t.name} has no dev split {split!r} (its dev splits: {t.eval_splits})")
    return t.name if len(t.eval_splits) == 1 else f"{t.name}-{_SPLIT_SUFFIX.get(split, split)}"


def columns(suite: str) -> tuple[str, ...]:
    """The suite's table columns in the papers' order (GLUE: mnli-m, mnli-mm, qqp, qnli, sst2, cola, stsb, mrpc,
    rte)."""
    if suite not in SUITES:
        raise UserError(f"unknown suite {suite!r}; choose one of: {', '.join(SUITES)}")
    return tuple(column(name, split) for name in SUITES[suite] for split in TASKS[name].eval_splits)


def suite_average(suite: str, scores: Mapping[str, float]) -> float:
    """The suite's average as the papers compute it: the plain mean of every column of :func:`columns` (each task's
    ``table_metric``, in percent). For GLUE that is nine numbers, MNLI-m and MNLI-mm counting as one column each and
    WNLI left out: SparseBERT's Table 1 row "BERT-base (ours)" (85.4/85.8, 88.2, 91.5, 92.9, 62.1, 88.8, 90.4,
    69.0) averages to its 83.8 only so (83.6 with MNLI as one column). ``scores``: column -> score; a missing column
    is an error, never skipped (an average over fewer tasks is not the papers' average)."""
    cols = columns(suite)
    missing = [c for c in cols if c not in scores]
    if missing:
        raise UserError(
            f"the {suite} average needs a score for every column {cols}; missing: {', '.join(missing)}; run those "
            "tasks too (an average over fewer tasks is not the papers' average)"
        )
    return sum(float(scores[c]) for c in cols) / len(cols)
