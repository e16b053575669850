"""Fine-tune a converted model on one downstream task: sequence classification, regression (STS-B), multiple choice
(SWAG) or extractive QA (SQuAD 1.1/2.0, MRQA), through Hugging Face's Auto head classes and ``Trainer``.

The API, over the canonical examples of tools/evaluate/examples.py (what tools.evaluate's sweeps call)::

    result = finetune("out/bb-hf", "extractive_qa", train, {"validation": dev}, FinetuneConfig(output_dir="runs/1"),
                      num_labels=0, with_negative=True)
    result.predictions["validation"]   # QAPredictions: best non-null span text and null_odds per question id

The command line runs one fine-tuning on JSON-lines files and scores it through tools.evaluate.metrics (in percent):
accuracy (classification, multiple choice), Pearson/Spearman (regression), SQuAD v1.1 EM/F1 (extractive QA) or, with
--with-negative, the official SQuAD 2.0 scores; tools.evaluate runs the papers' suites, grids and seeds::

    python -m tools.finetune --model HF_DIR --task classification --train train.jsonl --dev dev.jsonl --output-dir OUT
    python -m tools.finetune --model HF_DIR --task extractive_qa --train train.jsonl --dev dev.jsonl --output-dir OUT
    torchrun --nproc_per_node 2 -m tools.finetune ...   # data-parallel (DDP) through the Trainer; rank 0 writes

Protocol (BlockBERT paper, appendix A.4, following BERT's SQuAD setup): inputs are ``[CLS] question [SEP] context
[SEP]`` up to ``max_length = N`` (default: the model's max positions, the length it was pretrained at); longer
contexts are cut into windows whose starts are ``doc_stride = 128`` context tokens apart; a linear layer gives
start/end logits per token; the answer is the best-scoring valid span over all windows of an example, a span starting
only in the window that gives its first token the most centred context (BERT's ``token_is_max_context``). SQuAD 2.0:
unanswerable questions (and windows without the answer) target [CLS]; the null score is [CLS]'s start+end logit, the
minimum over the example's windows (BERT's run_squad), and ``null_odds`` = null score - best non-null span score.

Padding (``--padding auto``): a model whose attention layout depends on the sequence length (BlockBERT: the sequence
is cut into ``num_blocks`` chunks of length/num_blocks) gets every input padded to N, so that fine-tuning sees the
chunks it was pretrained with; every other family (dense, SparseBERT token masks, fixed/BigBird-style block layouts,
DIET) uses a prefix of its N-token pattern for a shorter input, which is exactly what padding to N would compute, so
batches are padded to their longest input only.

Data of the command line, one JSON object per line:
  classification:  {"sentence1": str, "sentence2": str (optional), "label": int | str}  ("sentence" / "text" also
                   accepted for sentence1)
  regression:      the same with a numeric "label" (STS-B's similarity)
  multiple_choice: {"context": str, "prefix": str (optional), "endings": [str, ...], "label": int}  (SWAG's sent1,
                   sent2, ending0..3)
  extractive_qa:   {"id": str (optional), "context": str, "question": str,
                    "answers": {"text": [str, ...], "answer_start": [int, ...]}}
                   or the flattened form with "answers.text" / "answers.answer_start"; empty answers (an
                   unanswerable question) only with --with-negative.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from common.cli import HelpFormatter, add_flags, cli
from common.error_exit import report, run_entry
from common.errors import UserError
from common.inputs import parse_json_object
from tools.device import PRECISIONS
from tools.evaluate import metrics
from tools.evaluate.examples import KINDS, ChoiceExample, Example, Predictions, QAExample, QAPredictions, TextExample


class DataError(UserError, ValueError):
    """Bad input data; the message names the file and line (or the example)."""


TASK_ALIASES = {"qa": "extractive_qa"}
"""Older ``--task`` names still accepted."""
TASKS = KINDS + tuple(TASK_ALIASES)
"""``--task`` choices: the example kinds (tools.evaluate.examples.KINDS) and their aliases."""
PADDINGS = ("auto", "longest", "max_length")
"""``auto``: max_length for length-dependent layouts (BlockBERT), else longest; ``longest``: each batch padded to its
longest input; ``max_length``: every input padded to max_length."""


# ----------------------------------------------------------------------------------------------- config
@dataclass
class FinetuneConfig:
    """The hyperparameters of one fine-tuning run (what :func:`finetune` takes besides the model and the data)."""

    output_dir: str
    """Where the run writes (the Trainer's scratch, the model with --save-model; the command line adds
    metrics.json and predictions.jsonl)."""
    max_length: int | None = None
    """N: longest input in tokens; None = the model's max_position_embeddings (the paper's max_sequence_length=N)."""
    padding: str = field(default="auto", metadata=cli(choices=lambda: PADDINGS))
    """auto (to max_length for a length-dependent layout such as BlockBERT's, else to the batch's longest input),
    longest or max_length."""
    doc_stride: int = 128
    """QA: distance in context tokens between the starts of consecutive windows of a long context."""
    max_query_length: int = 64
    """QA: questions are cut to this many tokens."""
    max_answer_length: int = 30
    """QA: longest predicted span in tokens."""
    n_best: int = 20
    """QA: start/end candidates per window considered when decoding."""
    epochs: float = 4.0
    """Passes over the training data (the paper: 4)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (overrides epochs)."""
    batch_size: int = 16
    """Examples (QA: windows) per forward pass and device (the paper: 16 or 32 per step)."""
    gradient_accumulation_steps: int = 1
    """Forward passes per optimizer step (examples per step = batch_size x this x the number of processes)."""
    lr: float = 3e-5
    """Peak learning rate (the paper grid-searches 5e-6 .. 5e-5)."""
    warmup_fraction: float = 0.1
    """Linear warmup over this fraction of the steps, then linear decay to 0."""
    weight_decay: float = 0.01
    """AdamW weight decay (not on biases and LayerNorm weights)."""
    seed: int = 42
    """Seed for head init, shuffling and dropout."""
    trust_remote_code: bool = True
    """Load custom modeling code shipped in the model directory (our sparse-attention exports need it)."""
    save_model: bool = False
    """Also save the fine-tuned model and tokenizer to output_dir/model."""
    device: str | None = None
    """cpu, cuda or cuda:N; default: the GPU when there is one (under torchrun: each process its LOCAL_RANK's)."""
    precision: str = field(default="auto", metadata=cli(choices=lambda: PRECISIONS))
    """auto (bf16 on GPUs with bf16 hardware, fp16 with a gradient scaler on older GPUs, fp32 on CPU), fp32, fp16
    or bf16: autocast for the forward passes; weights and optimizer stay fp32."""

    def __post_init__(self) -> None:
        for name in (
            "doc_stride",
            "max_query_length",
            "max_answer_length",
            "n_best",
            "batch_size",
            "gradient_accumulation_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_length is not None and self.max_length < 8:
            raise ValueError(f"--max-length must be >= 8, got {self.max_length}")
        if self.padding not in PADDINGS:
            raise ValueError(f"--padding must be one of {', '.join(PADDINGS)}, got {self.padding!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.epochs <= 0 and not self.max_steps:
            raise ValueError("--epochs must be > 0 (or give --max-steps)")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"--warmup-fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")


@dataclass(kw_only=True)
class FinetuneRun(FinetuneConfig):
    """One fine-tuning from the command line: the model, the task and its JSON-lines files, and the
    hyperparameters."""

    model: str
    """Hugging Face directory (from tools.convert_checkpoint, or any BERT-like model)."""
    task: str = field(metadata=cli(choices=lambda: TASKS))
    """classification | regression | multiple_choice | extractive_qa (qa: the same)."""
    train: str
    """Training JSON lines."""
    dev: str
    """Evaluation JSON lines."""
    with_negative: bool = False
    """extractive_qa: unanswerable questions (empty answers, SQuAD 2.0) are allowed and trained to point at [CLS]."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task not in TASKS:
            raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
        for name in ("model", "train", "dev"):
            if not Path(getattr(self, name)).exists():
                raise ValueError(f"--{name} {getattr(self, name)}: not found")

    @property
    def kind(self) -> str:
        return TASK_ALIASES.get(self.task, self.task)


@dataclass
class FinetuneResult:
    """What one run gives back: the predictions per evaluation split and what the run cost."""

    predictions: dict[str, Predictions]
    """Per ``evals`` key, in the order of its examples (tools.evaluate.examples.Predictions)."""
    train_seconds: float
    """Wall time of the Trainer's training loop (no loading, encoding or prediction)."""
    steps: int
    """Optimizer steps."""
    train_examples: int
    """Training rows fed forward, all processes and epochs together (QA: windows; multiple choice: questions)."""
    train_tokens: int
    """Input token positions fed forward in training, padding included (multiple choice: every ending's)."""
    train_loss_first: float
    train_loss_last: float
    info: dict[str, Any] = field(default_factory=dict)
    """device, precision, max_length, padding, world_size, windows (QA) ..."""


# ----------------------------------------------------------------------------------------------- data (CLI)
def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = parse_json_object(line, str(path), "one JSON object per line", DataError, line=n)
            yield n, obj


def read_text_pairs(path: str | Path, *, regression: bool = False) -> list[tuple[TextExample, Any]]:
    """(example with label None, raw label) per line; the caller maps labels to indices (classification) or floats."""
    out = []
    for n, o in read_jsonl(path):
        a = next((o[k] for k in ("sentence1", "sentence", "text") if k in o), None)
        if not isinstance(a, str) or "label" not in o:
            raise DataError(
                f"{path}:{n}: a {'regression' if regression else 'classification'} line needs a string 'sentence1' "
                f"(or 'sentence'/'text') and a 'label'; got keys {sorted(o)}"
            )
        b = o.get("sentence2")
        if b is not None and not isinstance(b, str):
            raise DataError(f"{path}:{n}: 'sentence2' must be a string")
        label = o["label"]
        if regression:
            if isinstance(label, bool) or not isinstance(label, (int, float)) or not math.isfinite(label):
                raise DataError(f"{path}:{n}: a regression 'label' must be a finite number, got {label!r}")
            label = float(label)
        out.append((TextExample(str(o.get("id", f"{Path(path).name}:{n}")), a, b, None), label))
    if not out:
        raise DataError(f"{path}: no examples")
    return out


def read_classification(path: str | Path) -> list[tuple[TextExample, Any]]:
    return read_text_pairs(path)


def read_choices(path: str | Path) -> list[ChoiceExample]:
    out = []
    for n, o in read_jsonl(path):
        ctx, prefix, endings, label = o.get("context"), o.get("prefix", ""), o.get("endings"), o.get("label")
        if (
            not isinstance(ctx, str)
            or not isinstance(prefix, str)
            or not isinstance(endings, list)
            or len(endings) < 2
            or not all(isinstance(e, str) for e in endings)
            or isinstance(label, bool)
            or not isinstance(label, int)
            or not 0 <= label < len(endings)
        ):
            raise DataError(
                f"{path}:{n}: a multiple_choice line needs a string 'context', an optional string 'prefix', "
                "'endings' (a list of >= 2 strings) and 'label' (the index of the right ending)"
            )
        out.append(ChoiceExample(str(o.get("id", f"{Path(path).name}:{n}")), ctx, prefix, tuple(endings), label))
    if not out:
        raise DataError(f"{path}: no examples")
    if len({len(e.endings) for e in out}) != 1:
        raise DataError(f"{path}: every question needs the same number of endings")
    return out


def read_qa(path: str | Path, *, with_negative: bool = False) -> list[QAExample]:
    out = []
    for n, o in read_jsonl(path):
        ans = o.get("answers")
        if isinstance(ans, dict):
            texts, starts = ans.get("text"), ans.get("answer_start")
        else:
            texts, starts = o.get("answers.text"), o.get("answers.answer_start")
        ctx, q = o.get("context"), o.get("question")
        if (
            not isinstance(ctx, str)
            or not isinstance(q, str)
            or not isinstance(texts, list)
            or not isinstance(starts, list)
            or len(texts) != len(starts)
            or not (texts or with_negative)
        ):
            raise DataError(
                f"{path}:{n}: a QA line needs 'context', 'question' and 'answers' "
                "{'text': [...], 'answer_start': [...]} (same non-zero length; empty only with --with-negative)"
            )
        for t, s in zip(texts, starts):
            if not isinstance(s, int) or not isinstance(t, str) or ctx[s : s + len(t)] != t:
                raise DataError(
                    f"{path}:{n}: answer {t!r} is not at character {s} of the context (found {ctx[s : s + len(t)]!r})"
                )
        qid = str(o.get("id", f"{Path(path).name}:{n}"))
        out.append(QAExample(qid, q, ctx, tuple(texts), tuple(starts), is_impossible=not texts))
    if not out:
        raise DataError(f"{path}: no examples")
    return out


# ----------------------------------------------------------------------------------------------- QA windows
@dataclass
class QAFeature:
    """One window of one example."""

    example: int
    input_ids: list[int]
    token_type_ids: list[int]
    offsets: list[tuple[int, int] | None]
    """Character span in the context for context tokens, None for question/special tokens."""
    start: int
    """Gold start token (0 = [CLS] when the answer is not inside this window or the question has none)."""
    end: int
    max_context: list[bool] | None = None
    """Per position: this window gives the context token its most centred view among all windows (BERT's
    ``token_is_max_context``); predictions may start only there, so overlapping windows do not compete."""


def qa_features(
    tokenizer, examples: Sequence[QAExample], max_length: int, doc_stride: int, max_query_length: int
) -> list[QAFeature]:
    """``[CLS] q [SEP] window [SEP]``; window starts are ``doc_stride`` context tokens apart (BERT's run_squad)."""
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise DataError("the tokenizer has no [CLS]/[SEP] token; QA needs a BERT-style tokenizer")
    feats = []
    for ei, ex in enumerate(examples):
        q_ids = tokenizer(ex.question, add_special_tokens=False)["input_ids"][:max_query_length]
        enc = tokenizer(ex.context, add_special_tokens=False, return_offsets_mapping=True)
        c_ids, c_off = enc["input_ids"], enc["offset_mapping"]
        capacity = max_length - len(q_ids) - 3
        if capacity < 1:
            raise DataError(
                f"example {ex.id}: --max-length {max_length} leaves no room for the context after a "
                f"{len(q_ids)}-token question; raise --max-length or lower --max-query-length"
            )
        tok_s = tok_e = None
        if ex.answers and not ex.is_impossible:
            a_start = ex.starts[0]
            a_end = a_start + len(ex.answers[0])  # exclusive; training uses the first gold answer (train has one)
            tok_s = next((i for i, (s, e) in enumerate(c_off) if e > a_start), None)
            tok_e = next((i for i in range(len(c_off) - 1, -1, -1) if c_off[i][0] < a_end), None)
        spans = []  # (first context token, number of tokens) of each window
        w = 0
        while True:
            n = min(capacity, len(c_ids) - w)
            spans.append((w, n))
            if w + n >= len(c_ids):
                break
            w += min(n, doc_stride)
        owner = [-1] * len(c_ids)  # index of the window that gives each context token its most centred view
        score = [-1.0] * len(c_ids)
        for k, (w, n) in enumerate(spans):
            for t in range(w, w + n):
                c = _centredness((w, n), t)
                if c > score[t]:  # strict: the first window wins ties, as in BERT
                    score[t], owner[t] = c, k
        q0 = len(q_ids) + 2  # position of the first context token in a window
        for k, (w, n) in enumerate(spans):
            ids = [cls_id] + q_ids + [sep_id] + c_ids[w : w + n] + [sep_id]
            tt = [0] * q0 + [1] * (n + 1)
            offs: list[tuple[int, int] | None] = [None] * q0 + list(c_off[w : w + n]) + [None]
            start = end = 0
            if tok_s is not None and tok_e is not None and w <= tok_s and tok_e < w + n:
                start, end = tok_s - w + q0, tok_e - w + q0
            best = [owner[t] == k for t in range(w, w + n)]
            feats.append(QAFeature(ei, ids, tt, offs, start, end, [False] * q0 + best + [False]))
    return feats


def _centredness(span: tuple[int, int], t: int) -> float:
    """BERT run_squad's score of how much context a window gives token t: min(left, right) + 0.01 * length."""
    w, n = span
    return min(t - w, w + n - 1 - t) + 0.01 * n


def decode_qa(
    features: Sequence[QAFeature],
    start_logits: Sequence[Sequence[float]],
    end_logits: Sequence[Sequence[float]],
    examples: Sequence[QAExample],
    n_best: int,
    max_answer_length: int,
) -> QAPredictions:
    """Per example: the best valid span (start <= end, both in the context, length <= max) over all its windows,
    and the null score ([CLS] start + end logit) minimised over its windows, as BERT's run_squad does;
    ``null_odds`` = null score - best span score (a question with no valid span gets "" scored 0, as run_squad's
    "empty" entry)."""
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for f, sl, el in zip(features, start_logits, end_logits):
        n = len(f.input_ids)
        sl, el = list(sl[:n]), list(el[:n])
        null[f.example] = min(null.get(f.example, math.inf), sl[0] + el[0])
        starts = sorted(range(n), key=lambda i: -sl[i])[:n_best]
        ends = sorted(range(n), key=lambda i: -el[i])[:n_best]
        ctx = examples[f.example].context
        for s in starts:
            for e in ends:
                if f.offsets[s] is None or f.offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                    continue
                if f.max_context is not None and not f.max_context[s]:
                    continue
                score = sl[s] + el[e]
                if f.example not in best or score > best[f.example][0]:
                    best[f.example] = (score, ctx[f.offsets[s][0] : f.offsets[e][1]])
    text, odds = {}, {}
    for i, ex in enumerate(examples):
        score, span = best.get(i, (0.0, ""))
        text[ex.id] = span
        odds[ex.id] = float(null.get(i, 0.0) - score)
    return QAPredictions(text=text, null_odds=odds)


# ----------------------------------------------------------------------------------------------- encoding
class _Rows(torch.utils.data.Dataset):
    """Encoded examples (QA: windows) as dicts of lists; the collator pads them."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]


def _pad(rows: Sequence[Sequence[int]], value: int, length: int) -> torch.Tensor:
    return torch.tensor([list(r) + [value] * (length - len(r)) for r in rows], dtype=torch.long)


def _collator(pad_id: int, pad_to: int | None):
    """Pads ids with the tokenizer's pad id, segment ids and the attention mask with 0, to ``pad_to`` or to the
    batch's longest input; multiple-choice rows (one list per ending) become ``[batch, choices, length]``."""

    def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [r["input_ids"] for r in rows]
        choices = isinstance(ids[0][0], list)
        flat = [c for r in ids for c in r] if choices else ids
        tts = [c for r in rows for c in r["token_type_ids"]] if choices else [r["token_type_ids"] for r in rows]
        n = pad_to or max(len(r) for r in flat)
        out = {
            "input_ids": _pad(flat, pad_id, n),
            "token_type_ids": _pad(tts, 0, n),
            "attention_mask": _pad([[1] * len(r) for r in flat], 0, n),
        }
        if choices:
            out = {k: v.view(len(rows), -1, n) for k, v in out.items()}
        for key in ("labels", "start_positions", "end_positions"):
            if key in rows[0]:
                out[key] = torch.tensor([r[key] for r in rows])
        return out

    return collate


def _encode_pairs(tok, a: list[str], b: list[str] | None, max_len: int) -> list[dict[str, Any]]:
    enc = tok(a, b, truncation=True, max_length=max_len)
    tts = enc.get("token_type_ids") or [[0] * len(r) for r in enc["input_ids"]]
    return [{"input_ids": i, "token_type_ids": t} for i, t in zip(enc["input_ids"], tts)]


def _text_rows(tok, exs: Sequence[TextExample], max_len: int, labelled: bool, kind: str) -> list[dict[str, Any]]:
    pair = any(e.text_b is not None for e in exs)
    rows = _encode_pairs(tok, [e.text_a for e in exs], [e.text_b or "" for e in exs] if pair else None, max_len)
    if labelled:
        for r, e in zip(rows, exs):
            r["labels"] = float(e.label) if kind == "regression" else int(e.label)
    return rows


def _choice_rows(tok, exs: Sequence[ChoiceExample], max_len: int, labelled: bool) -> list[dict[str, Any]]:
    """SWAG (and HF's run_swag): ``context`` paired with ``prefix + " " + ending`` for every ending."""
    rows = []
    for e in exs:
        seconds = [f"{e.prefix} {end}".strip() for end in e.endings]
        per = _encode_pairs(tok, [e.context] * len(seconds), seconds, max_len)
        row: dict[str, Any] = {
            "input_ids": [p["input_ids"] for p in per],
            "token_type_ids": [p["token_type_ids"] for p in per],
        }
        if labelled:
            row["labels"] = int(e.label)
        rows.append(row)
    return rows


def _qa_rows(feats: Sequence[QAFeature], labelled: bool) -> list[dict[str, Any]]:
    rows = []
    for f in feats:
        r: dict[str, Any] = {"input_ids": f.input_ids, "token_type_ids": f.token_type_ids}
        if labelled:
            r.update(start_positions=f.start, end_positions=f.end)
        rows.append(r)
    return rows


def _check_examples(kind: str, name: str, exs: Sequence[Example], num_labels: int, labelled: bool, neg: bool) -> None:
    """Every example is of the kind's type (and labelled where it trains), so a mistake is named before training."""
    want = {"classification": TextExample, "regression": TextExample, "multiple_choice": ChoiceExample}.get(
        kind, QAExample
    )
    for i, e in enumerate(exs):
        if not isinstance(e, want):
            raise DataError(f"{name}[{i}] (id {getattr(e, 'id', '?')}): a {kind} run needs {want.__name__}s")
        if kind == "extractive_qa":
            if e.is_impossible and not neg and labelled:
                raise DataError(
                    f"{name}[{i}] (id {e.id}) has no answer: pass with_negative=True (SQuAD 2.0) to train on "
                    "unanswerable questions"
                )
            if labelled and not e.is_impossible and not e.answers:
                raise DataError(f"{name}[{i}] (id {e.id}): an answerable question needs an answer to train on")
            continue
        if not labelled:
            continue
        if e.label is None:
            raise DataError(f"{name}[{i}] (id {e.id}) has no label; a training split must be labelled")
        if kind == "classification" and not (isinstance(e.label, int) and 0 <= e.label < num_labels):
            raise DataError(f"{name}[{i}] (id {e.id}): label {e.label!r} is not a class index in [0, {num_labels})")
        if kind == "multiple_choice" and not 0 <= e.label < len(e.endings):
            raise DataError(f"{name}[{i}] (id {e.id}): label {e.label} is not an index of its {len(e.endings)} endings")
    if kind == "multiple_choice" and len({len(e.endings) for e in exs}) > 1:
        raise DataError(f"{name}: every question needs the same number of endings")


# ----------------------------------------------------------------------------------------------- model & Trainer
def _needs_remote_code(model_dir: str | Path) -> bool:
    cfg = Path(model_dir, "config.json")
    return cfg.is_file() and "auto_map" in json.loads(cfg.read_text())


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclass
class _Setup:
    """What every kind starts from: the device and dtype, the tokenizer, the HF config, the window length."""

    model: str
    device: Any
    dtype: Any
    remote: bool
    tok: Any
    hf_cfg: Any
    max_len: int
    out: Path
    pad: int


def _setup(model: str | Path, cfg: FinetuneConfig) -> _Setup:
    """Device and precision, the tokenizer and config of the model, checked before any data is encoded."""
    from transformers import AutoConfig, AutoTokenizer

    from tools.device import resolve_device, resolve_precision

    model = str(model)
    if not Path(model).exists():
        raise DataError(f"model {model}: not found (a Hugging Face directory from tools.convert_checkpoint)")
    device = resolve_device(cfg.device)
    dtype = resolve_precision(cfg.precision, device)
    if device.type == "cuda" and device.index not in (None, 0) and _world_size() == 1:
        raise DataError(
            f"--device {cfg.device}: the Trainer uses the first visible GPU; pick GPU {device.index} "
            f"with CUDA_VISIBLE_DEVICES={device.index} and --device cuda"
        )
    torch.manual_seed(cfg.seed)
    remote = _needs_remote_code(model)
    if remote and not cfg.trust_remote_code:
        raise DataError(
            f"--model {model} ships custom modeling code (auto_map in config.json); "
            "drop --no-trust-remote-code to load it"
        )
    tok = AutoTokenizer.from_pretrained(model, trust_remote_code=remote)  # v5 reads the config too
    if not getattr(tok, "is_fast", False):
        raise DataError(f"--model {model}: a fast tokenizer (tokenizer.json) is needed for character offsets")
    hf_cfg = AutoConfig.from_pretrained(model, trust_remote_code=remote)
    if getattr(hf_cfg, "model_type", None) not in ("bert", "sparsebert"):
        print(
            f"[finetune] note: model_type {hf_cfg.model_type!r} is not BERT; segment ids are still passed",
            file=sys.stderr,
        )
    max_len = cfg.max_length or int(hf_cfg.max_position_embeddings)
    if max_len > hf_cfg.max_position_embeddings:
        raise DataError(
            f"--max-length {max_len} exceeds the model's max_position_embeddings {hf_cfg.max_position_embeddings}"
        )
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    return _Setup(model, device, dtype, remote, tok, hf_cfg, max_len, out, pad)


HEADS = {
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "multiple_choice": "AutoModelForMultipleChoice",
    "extractive_qa": "AutoModelForQuestionAnswering",
}
"""The transformers Auto class that builds each kind's head."""


def _load_head(s: _Setup, kind: str, num_labels: int):
    import transformers

    auto = getattr(transformers, HEADS[kind])
    kw: dict[str, Any] = {}
    if kind == "classification":
        kw = dict(num_labels=num_labels)
    elif kind == "regression":
        kw = dict(num_labels=1, problem_type="regression")
    return auto.from_pretrained(s.model, trust_remote_code=s.remote, **kw)


def length_dependent_layout(model: torch.nn.Module, max_len: int) -> bool:
    """Whether some attention layer of ``model`` lays a shorter sequence out differently from the first positions
    of a ``max_len`` one (BlockBERT: the chunks are length/num_blocks long), so inputs must be padded to
    ``max_len`` to see the pretrained pattern. Layers that slice their max-length layout (fixed, BigBird-style,
    SparseBERT token masks) and dense layers are length-independent."""
    for module in model.modules():
        sc = getattr(module, "sparsity_config", None)
        if sc is None or not hasattr(module, "layout_for") or getattr(module, "master_layout", None) is None:
            continue
        full = module.layout_for(max_len)
        short = sc.padded_length(1)
        if short >= max_len:
            continue
        part = module.layout_for(short)
        nb = part.shape[-1]
        if not torch.equal(part.cpu(), full.cpu()[:, :nb, :nb]):
            return True
    return False


def _trainer(model, train_rows: list[dict[str, Any]], s: _Setup, cfg: FinetuneConfig, pad_to: int | None):
    """transformers' Trainer with the paper's protocol: AdamW (no decay on biases and LayerNorm weights), linear
    warmup over ``warmup_fraction`` of the steps then linear decay to 0, gradient clipping at 1.0; autocast and the
    fp16 gradient scaler from ``precision``; under torchrun, DDP over the processes (gloo on CPU); nothing saved or
    reported by the Trainer itself. Counts the rows it trains on (``trainer.rows_seen``)."""
    from transformers import Trainer, TrainingArguments

    class CountingTrainer(Trainer):
        rows_seen = 0

        def training_step(self, model, inputs, *args, **kwargs):
            self.rows_seen += int(inputs["input_ids"].shape[0])
            return super().training_step(model, inputs, *args, **kwargs)

    world = _world_size()
    per_step = cfg.batch_size * cfg.gradient_accumulation_steps * world
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * math.ceil(len(train_rows) / per_step)))
    extra = {}
    if world > 1 and s.device.type == "cpu":
        extra["ddp_backend"] = "gloo"
    args = TrainingArguments(
        output_dir=str(s.out / "trainer"),
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        max_steps=total,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        warmup_steps=int(cfg.warmup_fraction * total),
        lr_scheduler_type="linear",
        max_grad_norm=1.0,
        optim="adamw_torch",
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=s.dtype == torch.bfloat16,
        fp16=s.dtype == torch.float16,
        use_cpu=s.device.type == "cpu",
        report_to="none",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        include_num_input_tokens_seen="all",
        **extra,
    )
    return CountingTrainer(
        model=model, args=args, train_dataset=_Rows(train_rows), data_collator=_collator(s.pad, pad_to)
    )


def _train(trainer) -> dict[str, Any]:
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    rows = torch.tensor(trainer.rows_seen, device=trainer.args.device)
    return {
        "steps": int(trainer.state.global_step),
        "train_loss_first": float(losses[0]),
        "train_loss_last": float(losses[-1]),
        "train_seconds": seconds,
        "train_examples": int(trainer.accelerator.reduce(rows, reduction="sum").item()),
        "train_tokens": int(trainer.state.num_input_tokens_seen),
    }


def _logits(trainer, rows: list[dict[str, Any]]) -> Any:
    pred = trainer.predict(_Rows(rows))
    return pred.predictions


# ----------------------------------------------------------------------------------------------- the API
def finetune(
    model: str | Path,
    kind: str,
    train: Sequence[Example],
    evals: Mapping[str, Sequence[Example]],
    cfg: FinetuneConfig,
    *,
    num_labels: int,
    with_negative: bool = False,
) -> FinetuneResult:
    """One fine-tuning of ``model`` (an HF directory) on ``train`` through HF's Trainer, then predictions for each
    split of ``evals`` (in its examples' order). ``num_labels``: classification's number of classes (the examples'
    labels index them); regression always has one output; multiple choice scores each ending (the examples say
    how many); extractive QA ignores it. ``with_negative``: extractive QA may train on unanswerable questions
    (SQuAD 2.0; their target is [CLS]). Writes nothing outside ``cfg.output_dir``."""
    from tools.device import precision_name

    if kind not in KINDS:
        raise DataError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not train:
        raise DataError("no training examples")
    if kind == "classification" and num_labels < 2:
        raise DataError(f"classification needs num_labels >= 2, got {num_labels}")
    _check_examples(kind, "train", train, num_labels, True, with_negative)
    for name, exs in evals.items():
        _check_examples(kind, name, exs, num_labels, False, with_negative)
    s = _setup(model, cfg)
    head = _load_head(s, kind, num_labels)
    padding = cfg.padding
    if padding == "auto":
        padding = "max_length" if length_dependent_layout(head, s.max_len) else "longest"
    pad_to = s.max_len if padding == "max_length" else None

    def rows(exs: Sequence[Example], labelled: bool) -> tuple[list[dict[str, Any]], list[QAFeature] | None]:
        if kind in ("classification", "regression"):
            return _text_rows(s.tok, exs, s.max_len, labelled, kind), None
        if kind == "multiple_choice":
            return _choice_rows(s.tok, exs, s.max_len, labelled), None
        feats = qa_features(s.tok, exs, s.max_len, cfg.doc_stride, cfg.max_query_length)
        return _qa_rows(feats, labelled), feats

    train_rows, train_feats = rows(train, True)
    trainer = _trainer(head, train_rows, s, cfg, pad_to)
    stats = _train(trainer)
    info: dict[str, Any] = {
        "model": s.model,
        "kind": kind,
        "head": type(head).__name__,
        "device": str(trainer.args.device),
        "precision": precision_name(s.dtype),
        "max_length": s.max_len,
        "padding": padding,
        "world_size": _world_size(),
        "trainer": "transformers.Trainer",
    }
    if train_feats is not None:
        info["windows"] = {"train": len(train_feats)}
    predictions: dict[str, Predictions] = {}
    for name, exs in evals.items():
        if not exs:
            predictions[name] = QAPredictions({}, {}) if kind == "extractive_qa" else []
            continue
        ev_rows, feats = rows(exs, False)
        out = _logits(trainer, ev_rows)
        if kind == "extractive_qa":
            start_logits, end_logits = (np.asarray(x, dtype=np.float32) for x in out[:2])
            starts = [start_logits[i, : len(f.input_ids)].tolist() for i, f in enumerate(feats)]
            ends = [end_logits[i, : len(f.input_ids)].tolist() for i, f in enumerate(feats)]
            predictions[name] = decode_qa(feats, starts, ends, exs, cfg.n_best, cfg.max_answer_length)
            info["windows"][name] = len(feats)
            continue
        logits = np.asarray(out[0] if isinstance(out, tuple) else out, dtype=np.float32)
        if kind == "regression":
            predictions[name] = logits.reshape(len(exs)).astype(float).tolist()
        else:
            predictions[name] = [int(i) for i in logits.argmax(-1)]
    if cfg.save_model and trainer.is_world_process_zero():
        head.save_pretrained(s.out / "model")
        s.tok.save_pretrained(s.out / "model")
    return FinetuneResult(predictions=predictions, info=info, **stats)


# ----------------------------------------------------------------------------------------------- command line
def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


CLI_KEYS = tuple(
    "accuracy pearson spearman exact f1 HasAns_exact HasAns_f1 NoAns_exact NoAns_f1 best_exact best_f1".split()
)
"""The scores the command line prints (metrics.json has every one, with totals and thresholds)."""


def cli_scores(kind: str, dev: Sequence[Example], preds: Predictions, *, with_negative: bool) -> dict[str, float]:
    """The single-run CLI's dev scores, in percent, through tools.evaluate.metrics (the one home of the metrics):
    classification and multiple choice ``accuracy``; regression ``pearson``/``spearman``; extractive QA SQuAD v1.1
    ``exact``/``f1``, or with unanswerable questions the official SQuAD 2.0 scores (``HasAns_``/``NoAns_`` parts,
    ``best_exact``/``best_f1`` and their thresholds)."""
    if kind == "extractive_qa":
        assert isinstance(preds, QAPredictions)
        qa = [e for e in dev if isinstance(e, QAExample)]
        return metrics.squad_v2(qa, preds) if with_negative else metrics.squad_v1(qa, preds.text)
    gold = [e.label for e in dev]  # type: ignore[union-attr]
    pred = list(preds)  # type: ignore[arg-type]
    if kind == "regression":
        return {"pearson": metrics.pearson(gold, pred), "spearman": metrics.spearman(gold, pred)}
    return {"accuracy": metrics.accuracy(gold, pred)}


def run(cfg: FinetuneRun) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` on the JSON-lines task and (rank 0) write metrics.json and predictions.jsonl."""
    kind = cfg.kind
    extra: dict[str, Any] = {}
    num_labels = 0
    if kind in ("classification", "regression"):
        reg = kind == "regression"
        tr, dv = read_text_pairs(cfg.train, regression=reg), read_text_pairs(cfg.dev, regression=reg)
        if reg:
            train = [TextExample(e.id, e.text_a, e.text_b, lab) for e, lab in tr]
            dev = [TextExample(e.id, e.text_a, e.text_b, lab) for e, lab in dv]
        else:
            labels = sorted({lab for _, lab in tr}, key=lambda x: (str(type(x)), x))
            index = {lab: i for i, lab in enumerate(labels)}
            unknown = sorted({str(lab) for _, lab in dv if lab not in index})
            if unknown:
                raise DataError(f"{cfg.dev}: labels {unknown} never occur in {cfg.train}")
            if len(labels) < 2:
                raise DataError(f"{cfg.train}: classification needs at least two distinct labels")
            train = [TextExample(e.id, e.text_a, e.text_b, index[lab]) for e, lab in tr]
            dev = [TextExample(e.id, e.text_a, e.text_b, index[lab]) for e, lab in dv]
            num_labels, extra["labels"] = len(labels), labels
    elif kind == "multiple_choice":
        train, dev = read_choices(cfg.train), read_choices(cfg.dev)
    else:
        train = read_qa(cfg.train, with_negative=cfg.with_negative)
        dev = read_qa(cfg.dev, with_negative=cfg.with_negative)
    res = finetune(cfg.model, kind, train, {"dev": dev}, cfg, num_labels=num_labels, with_negative=cfg.with_negative)
    preds = res.predictions["dev"]
    result: dict[str, Any] = {
        "task": cfg.task,
        **{k: v for k, v in res.info.items() if k != "windows"},
        **{k: getattr(res, k) for k in ("steps", "train_loss_first", "train_loss_last", "train_seconds")},
        **{k: getattr(res, k) for k in ("train_examples", "train_tokens")},
    }
    result.update(cli_scores(kind, dev, preds, with_negative=cfg.with_negative))
    lines = []
    if kind == "classification":
        labels = extra["labels"]
        lines = [{"id": e.id, "label": labels[e.label], "prediction": labels[p]} for e, p in zip(dev, preds)]
    elif kind in ("regression", "multiple_choice"):
        lines = [{"id": e.id, "label": e.label, "prediction": p} for e, p in zip(dev, preds)]
    else:
        result.update(train_windows=res.info["windows"]["train"], dev_windows=res.info["windows"]["dev"])
        lines = [
            {"id": e.id, "prediction": preds.text[e.id], "null_odds": preds.null_odds[e.id], "answers": list(e.answers)}
            for e in dev
        ]
    result["config"] = asdict(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        out = Path(cfg.output_dir)
        _write_atomic(out / "predictions.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
        _write_atomic(out / "metrics.json", json.dumps(result, indent=2) + "\n")
    return result


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`FinetuneRun` field (name, type, default, choices, docstring as help)."""
    p = argparse.ArgumentParser(prog="python -m tools.finetune", description=__doc__, formatter_class=HelpFormatter)
    add_flags(p, FinetuneRun)
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.finetune", _main, argv)


def _main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    try:
        cfg = FinetuneRun(**vars(ns))
        result = run(cfg)
    except ValueError as e:  # the config's checks (DataError is a UserError already)
        if isinstance(e, UserError):
            raise
        return report("tools.finetune", str(e))
    keys = [k for k in CLI_KEYS if k in result]
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: result[k] for k in ("task", "steps", "train_loss_first", "train_loss_last", *keys)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
