"""Fine-tune a converted model on sequence classification or extractive QA (the blockwise-attention paper's protocol).

    python -m tools.finetune --model HF_DIR --task classification --train train.jsonl --dev dev.jsonl --output-dir OUT
    python -m tools.finetune --model HF_DIR --task qa --train train.jsonl --dev dev.jsonl --output-dir OUT

Protocol (BlockBERT paper, appendix A.4, following BERT's SQuAD setup): inputs are ``[CLS] question [SEP] context
[SEP]`` up to ``max_length = N`` (default: the model's max positions); longer contexts are cut into windows whose
starts are ``doc_stride = 128`` context tokens apart; a linear layer gives start/end logits per token; the answer is
the best-scoring valid span over all windows of an example, a span starting only in the window that gives its first
token the most centred context (BERT's ``token_is_max_context``). Metrics: accuracy, or SQuAD v1.1 EM/F1 (percent).

Data, one JSON object per line:
  classification: {"sentence1": str, "sentence2": str (optional), "label": int | str}  ("sentence" / "text" also
                  accepted for sentence1)
  qa:             {"id": str (optional), "context": str, "question": str,
                   "answers": {"text": [str, ...], "answer_start": [int, ...]}}
                  or the flattened form with "answers.text" / "answers.answer_start".
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import string
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from common.cli import HelpFormatter, add_flags, cli
from common.error_exit import report, run_entry
from common.errors import UserError
from common.inputs import parse_json_object
from tools.device import PRECISIONS


class DataError(UserError, ValueError):
    """Bad input data; the message names the file and line."""


TASKS = ("classification", "qa")


# ----------------------------------------------------------------------------------------------- config
@dataclass
class FinetuneConfig:
    """One fine-tuning run."""

    model: str
    """Hugging Face directory (from tools.convert_checkpoint, or any BERT-like model)."""
    task: str = field(metadata=cli(choices=lambda: TASKS))
    """classification (sentence or sentence-pair labels) | qa (SQuAD v1.1-style extractive spans)."""
    train: str
    """Training JSON lines."""
    dev: str
    """Evaluation JSON lines."""
    output_dir: str
    """Where metrics.json, predictions.jsonl (and the model with --save-model) go."""
    max_length: int | None = None
    """N: longest input in tokens; None = the model's max_position_embeddings (the paper's max_sequence_length=N)."""
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
    """Examples (QA: windows) per forward pass (the paper: 16 or 32 per step)."""
    gradient_accumulation_steps: int = 1
    """Forward passes per optimizer step (examples per step = batch_size x this)."""
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
    """cpu, cuda or cuda:N; default: the GPU when there is one."""
    precision: str = field(default="auto", metadata=cli(choices=lambda: PRECISIONS))
    """auto (bf16 on GPUs with bf16 hardware, fp16 with a gradient scaler on older GPUs, fp32 on CPU), fp32, fp16
    or bf16: autocast for the forward passes; weights and optimizer stay fp32."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
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
        if self.epochs <= 0 and not self.max_steps:
            raise ValueError("--epochs must be > 0 (or give --max-steps)")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"--warmup-fraction must be in [0, 1), got {self.warmup_fraction}")
        for name in ("model", "train", "dev"):
            if not Path(getattr(self, name)).exists():
                raise ValueError(f"--{name} {getattr(self, name)}: not found")


# ----------------------------------------------------------------------------------------------- metrics
def normalize_answer(s: str) -> str:
    """SQuAD v1.1: lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str) -> float:
    """Token-overlap F1 of the normalized strings (SQuAD v1.1)."""
    p, t = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = collections.Counter(p) & collections.Counter(t)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(t)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: dict[str, str], golds: dict[str, list[str]]) -> dict[str, float]:
    """EM and F1 in percent, each the max over the gold answers, averaged over the gold examples."""
    if not golds:
        raise ValueError("no gold examples to score")
    em = f1 = 0.0
    for qid, truths in golds.items():
        pred = predictions.get(qid, "")
        em += max(exact_match(pred, t) for t in truths)
        f1 += max(f1_score(pred, t) for t in truths)
    return {"exact_match": 100.0 * em / len(golds), "f1": 100.0 * f1 / len(golds)}


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    if len(predictions) != len(labels) or not labels:
        raise ValueError(f"accuracy needs equal, non-empty lists (got {len(predictions)} and {len(labels)})")
    return sum(int(p == t) for p, t in zip(predictions, labels)) / len(labels)


# ----------------------------------------------------------------------------------------------- data
def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = parse_json_object(line, str(path), "one JSON object per line", DataError, line=n)
            yield n, obj


@dataclass
class ClsExample:
    text_a: str
    text_b: str | None
    label: Any


def read_classification(path: str | Path) -> list[ClsExample]:
    out = []
    for n, o in read_jsonl(path):
        a = next((o[k] for k in ("sentence1", "sentence", "text") if k in o), None)
        if not isinstance(a, str) or "label" not in o:
            raise DataError(
                f"{path}:{n}: a classification line needs a string 'sentence1' (or 'sentence'/'text') "
                f"and a 'label'; got keys {sorted(o)}"
            )
        b = o.get("sentence2")
        if b is not None and not isinstance(b, str):
            raise DataError(f"{path}:{n}: 'sentence2' must be a string")
        out.append(ClsExample(a, b, o["label"]))
    if not out:
        raise DataError(f"{path}: no examples")
    return out


@dataclass
class QAExample:
    qid: str
    question: str
    context: str
    answers: list[str]
    starts: list[int]


def read_qa(path: str | Path) -> list[QAExample]:
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
            or not texts
        ):
            raise DataError(
                f"{path}:{n}: a QA line needs 'context', 'question' and 'answers' "
                "{'text': [...], 'answer_start': [...]} (same non-zero length)"
            )
        for t, s in zip(texts, starts):
            if not isinstance(s, int) or ctx[s : s + len(t)] != t:
                raise DataError(
                    f"{path}:{n}: answer {t!r} is not at character {s} of the context (found {ctx[s : s + len(t)]!r})"
                )
        out.append(QAExample(str(o.get("id", f"{Path(path).name}:{n}")), q, ctx, list(texts), list(starts)))
    if not out:
        raise DataError(f"{path}: no examples")
    return out


@dataclass
class QAFeature:
    """One window of one example."""

    example: int
    input_ids: list[int]
    token_type_ids: list[int]
    offsets: list[tuple[int, int] | None]
    """Character span in the context for context tokens, None for question/special tokens."""
    start: int
    """Gold start token (0 = [CLS] when the answer is not inside this window)."""
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
                f"example {ex.qid}: --max-length {max_length} leaves no room for the context after a "
                f"{len(q_ids)}-token question; raise --max-length or lower --max-query-length"
            )
        a_start = ex.starts[0]
        a_end = a_start + len(ex.answers[0])  # exclusive; training uses the first gold answer (SQuAD train has one)
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
) -> dict[str, str]:
    """Best valid span (start <= end, both in the context, length <= max) over every window of each example."""
    best: dict[int, tuple[float, str]] = {}
    for f, sl, el in zip(features, start_logits, end_logits):
        n = len(f.input_ids)
        sl, el = list(sl[:n]), list(el[:n])
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
    return {ex.qid: best.get(i, (0.0, ""))[1] for i, ex in enumerate(examples)}


# ----------------------------------------------------------------------------------------------- training
def _pad(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    n = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (n - len(r)) for r in rows], dtype=torch.long)


class _Rows(torch.utils.data.Dataset):
    """Encoded examples (QA: windows) as dicts of lists; the collator pads them per batch."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.rows[i]


def _collator(pad_id: int):
    """Pads ids with the tokenizer's pad id, segment ids with 0, and stacks the labels the task has."""

    def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [r["input_ids"] for r in rows]
        out = {
            "input_ids": _pad(ids, pad_id),
            "token_type_ids": _pad([r["token_type_ids"] for r in rows], 0),
            "attention_mask": _pad([[1] * len(r) for r in ids], 0),
        }
        for key in ("labels", "start_positions", "end_positions"):
            if key in rows[0]:
                out[key] = torch.tensor([r[key] for r in rows])
        return out

    return collate


def _needs_remote_code(model_dir: str) -> bool:
    cfg = Path(model_dir, "config.json")
    return cfg.is_file() and "auto_map" in json.loads(cfg.read_text())


def _trainer(
    model,
    train_rows: list[dict[str, Any]],
    pad_id: int,
    cfg: FinetuneConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    out: Path,
):
    """transformers' Trainer with the paper's protocol: AdamW (no decay on biases and LayerNorm weights), linear
    warmup over ``warmup_fraction`` of the steps then linear decay to 0, gradient clipping at 1.0; autocast and the
    fp16 gradient scaler from ``precision``; nothing saved or reported by the Trainer itself."""
    from transformers import Trainer, TrainingArguments

    per_step = cfg.batch_size * cfg.gradient_accumulation_steps
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * math.ceil(len(train_rows) / per_step)))
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
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
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu=device.type == "cpu",
        report_to="none",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    return Trainer(model=model, args=args, train_dataset=_Rows(train_rows), data_collator=_collator(pad_id))


def _train(trainer) -> dict[str, float]:
    t0 = time.time()
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {
        "steps": trainer.state.global_step,
        "train_loss_first": losses[0],
        "train_loss_last": losses[-1],
        "train_seconds": time.time() - t0,
    }


@dataclass
class _Setup:
    """What both tasks start from: the device and dtype, the tokenizer, the window length, the output folder."""

    device: Any
    dtype: Any
    remote: bool
    tok: Any
    max_len: int
    out: Path
    pad: int


def _setup(cfg: FinetuneConfig) -> _Setup:
    """Device and precision, the tokenizer and config of ``--model``, checked before any data is read."""
    from transformers import AutoConfig, AutoTokenizer

    from tools.device import resolve_device, resolve_precision

    device = resolve_device(cfg.device)
    dtype = resolve_precision(cfg.precision, device)
    if device.type == "cuda" and device.index not in (None, 0):
        raise DataError(
            f"--device {cfg.device}: the Trainer uses the first visible GPU; pick GPU {device.index} "
            f"with CUDA_VISIBLE_DEVICES={device.index} and --device cuda"
        )
    torch.manual_seed(cfg.seed)
    remote = _needs_remote_code(cfg.model)
    if remote and not cfg.trust_remote_code:
        raise DataError(
            f"--model {cfg.model} ships custom modeling code (auto_map in config.json); "
            "drop --no-trust-remote-code to load it"
        )
    tok = AutoTokenizer.from_pretrained(cfg.model, trust_remote_code=remote)  # v5 reads the config too
    if not getattr(tok, "is_fast", False):
        raise DataError(f"--model {cfg.model}: a fast tokenizer (tokenizer.json) is needed for character offsets")
    hf_cfg = AutoConfig.from_pretrained(cfg.model, trust_remote_code=remote)
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
    return _Setup(device, dtype, remote, tok, max_len, out, pad)


def _run_classification(cfg: FinetuneConfig, s: _Setup, result: dict[str, Any]) -> Any:
    """Train a sequence classifier, predict the dev set (accuracy, predictions.jsonl); returns the model."""
    from transformers import AutoModelForSequenceClassification

    train, dev = read_classification(cfg.train), read_classification(cfg.dev)
    labels = sorted({e.label for e in train}, key=lambda x: (str(type(x)), x))
    index = {lab: i for i, lab in enumerate(labels)}
    unknown = sorted({str(e.label) for e in dev if e.label not in index})
    if unknown:
        raise DataError(f"{cfg.dev}: labels {unknown} never occur in {cfg.train}")
    model = AutoModelForSequenceClassification.from_pretrained(
        cfg.model,
        num_labels=len(labels),
        trust_remote_code=s.remote,
        id2label={i: str(lab) for i, lab in enumerate(labels)},
        label2id={str(lab): i for i, lab in enumerate(labels)},
    )

    def encode(exs):
        enc = s.tok(
            [e.text_a for e in exs],
            [e.text_b for e in exs] if any(e.text_b for e in exs) else None,
            truncation=True,
            max_length=s.max_len,
        )
        tts = enc.get("token_type_ids") or [[0] * len(r) for r in enc["input_ids"]]
        return enc["input_ids"], tts

    tr_ids, tr_tt = encode(train)
    rows = [{"input_ids": a, "token_type_ids": b, "labels": index[e.label]} for a, b, e in zip(tr_ids, tr_tt, train)]
    trainer = _trainer(model, rows, s.pad, cfg, s.device, s.dtype, s.out)
    result.update(_train(trainer))
    dv_ids, dv_tt = encode(dev)
    pred = trainer.predict(_Rows([{"input_ids": a, "token_type_ids": b} for a, b in zip(dv_ids, dv_tt)]))
    logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
    preds = np.asarray(logits).argmax(-1).tolist()
    gold = [index[e.label] for e in dev]
    result["accuracy"] = accuracy(preds, gold)
    with open(s.out / "predictions.jsonl", "w") as f:
        for e, p in zip(dev, preds):
            f.write(json.dumps({"label": e.label, "prediction": labels[p]}) + "\n")
    return model


def _run_qa(cfg: FinetuneConfig, s: _Setup, result: dict[str, Any]) -> Any:
    """Train extractive QA on windows of the contexts, decode the dev answers (SQuAD EM/F1, predictions.jsonl);
    returns the model."""
    from transformers import AutoModelForQuestionAnswering

    train, dev = read_qa(cfg.train), read_qa(cfg.dev)
    model = AutoModelForQuestionAnswering.from_pretrained(cfg.model, trust_remote_code=s.remote)
    tr_f = qa_features(s.tok, train, s.max_len, cfg.doc_stride, cfg.max_query_length)
    dv_f = qa_features(s.tok, dev, s.max_len, cfg.doc_stride, cfg.max_query_length)
    rows = [
        {
            "input_ids": f.input_ids,
            "token_type_ids": f.token_type_ids,
            "start_positions": f.start,
            "end_positions": f.end,
        }
        for f in tr_f
    ]
    trainer = _trainer(model, rows, s.pad, cfg, s.device, s.dtype, s.out)
    result.update(_train(trainer))
    pred = trainer.predict(_Rows([{"input_ids": f.input_ids, "token_type_ids": f.token_type_ids} for f in dv_f]))
    start_logits, end_logits = (np.asarray(x, dtype=np.float32) for x in pred.predictions[:2])
    starts = [start_logits[i, : len(f.input_ids)].tolist() for i, f in enumerate(dv_f)]
    ends = [end_logits[i, : len(f.input_ids)].tolist() for i, f in enumerate(dv_f)]
    preds = decode_qa(dv_f, starts, ends, dev, cfg.n_best, cfg.max_answer_length)
    result.update(squad_metrics(preds, {e.qid: e.answers for e in dev}))
    result.update(train_windows=len(tr_f), dev_windows=len(dv_f))
    with open(s.out / "predictions.jsonl", "w") as f:
        for e in dev:
            f.write(json.dumps({"id": e.qid, "prediction": preds[e.qid], "answers": e.answers}) + "\n")
    return model


def run(cfg: FinetuneConfig) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` on the task and write metrics.json (and the model with --save-model): set up, run
    the task, save."""
    from tools.device import precision_name

    s = _setup(cfg)
    result: dict[str, Any] = {
        "task": cfg.task,
        "model": cfg.model,
        "max_length": s.max_len,
        "device": str(s.device),
        "precision": precision_name(s.dtype),
        "trainer": "transformers.Trainer",
    }
    model = (_run_classification if cfg.task == "classification" else _run_qa)(cfg, s, result)
    if cfg.save_model:
        model.save_pretrained(s.out / "model")
        s.tok.save_pretrained(s.out / "model")
    result["config"] = asdict(cfg)
    (s.out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`FinetuneConfig` field (name, type, default, choices, docstring as help)."""
    p = argparse.ArgumentParser(prog="python -m tools.finetune", description=__doc__, formatter_class=HelpFormatter)
    add_flags(p, FinetuneConfig)
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.finetune", _main, argv)


def _main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    try:
        cfg = FinetuneConfig(**vars(ns))
        result = run(cfg)
    except ValueError as e:  # the config's checks (DataError is a UserError already)
        if isinstance(e, UserError):
            raise
        return report("tools.finetune", str(e))
    keys = ("accuracy",) if cfg.task == "classification" else ("exact_match", "f1")
    print(json.dumps({k: result[k] for k in ("task", "steps", "train_loss_first", "train_loss_last", *keys)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
