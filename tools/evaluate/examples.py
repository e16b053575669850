"""The canonical downstream examples: what every reader in tools/evaluate/data.py returns and what every fine-tuning
run (tools/finetune.py) consumes, whatever the file format on disk."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TextExample:
    """One sentence or sentence pair (GLUE, XNLI). ``label``: the class index into the task's ``label_names``
    (classification) or the float target (regression, STS-B); None on an unlabelled split."""

    id: str
    text_a: str
    text_b: str | None
    label: int | float | None


@dataclass(frozen=True)
class ChoiceExample:
    """One multiple-choice question (SWAG): ``context`` (sent1) followed by ``prefix`` (sent2, the start of the
    second sentence) and each of ``endings``; the model scores ``context`` paired with ``prefix + " " + ending``.
    ``label``: index of the right ending, None when unlabelled."""

    id: str
    context: str
    prefix: str
    endings: tuple[str, ...]
    label: int | None


@dataclass(frozen=True)
class QAExample:
    """One extractive question (SQuAD 1.1/2.0, MRQA). ``answers``/``starts``: the gold answer texts and their
    character offsets in ``context`` (equal length; empty exactly when ``is_impossible``, SQuAD 2.0's unanswerable
    questions). ``dataset``: MRQA's source dataset name (for per-dataset scores), else the task name."""

    id: str
    question: str
    context: str
    answers: tuple[str, ...]
    starts: tuple[int, ...]
    is_impossible: bool = False
    dataset: str = field(default="", compare=False)


Example = TextExample | ChoiceExample | QAExample

KINDS = ("classification", "regression", "multiple_choice", "extractive_qa")
"""What a task asks of the model (and so which Auto head class, which predictions and which metrics it has)."""


@dataclass(frozen=True)
class QAPredictions:
    """What one fine-tuned reader answers on one split: per question id, the best non-null span's text (``text``)
    and ``null_odds`` = null score - best non-null span score (start+end logits of [CLS] minus the best valid span's,
    both over all windows of the example; SQuAD 2.0's official evaluation calls this na_prob and picks the threshold on
    it). For SQuAD 1.1 and MRQA, which have no unanswerable questions, only ``text`` is scored."""

    text: dict[str, str]
    null_odds: dict[str, float]


Predictions = list[int] | list[float] | QAPredictions
"""Per kind: classification and multiple_choice -> class/ending index per example (same order as the examples);
regression -> float per example; extractive_qa -> QAPredictions."""
