"""Every task's metrics as its benchmark defines them, all in percent (as the papers print them; the two SQuAD 2.0
thresholds excepted, which are null-odds values): accuracy, binary F1 (GLUE's positive class: label 1, MRPC's
"equivalent", QQP's "duplicate"), Matthews correlation (CoLA), Pearson/Spearman correlation (STS-B) through
scikit-learn and scipy; SQuAD v1.1 exact match / F1 as its official evaluation script computes them (MRQA's official
evaluation uses the same definitions, per dataset); SQuAD v2.0 as the official v2.0 script does, with the no-answer
threshold picked on the dev set."""

from __future__ import annotations

import collections
import math
import re
import string
from typing import Mapping, Sequence

from tools.evaluate.examples import Example, Predictions, QAExample, QAPredictions
from tools.evaluate.tasks import Task, get_task


def score(task: str | Task, examples: Sequence[Example], predictions: Predictions) -> dict[str, float]:
    """Every metric of ``task.metrics`` over ``examples`` (their gold labels/answers) and the model's
    ``predictions`` (examples.Predictions, in the examples' order; QA: by question id), in percent.

    squad2 (the official v2.0 evaluation): ``exact``/``f1`` (and their ``HasAns_``/``NoAns_`` parts) predict
    "no answer" where ``null_odds > 0.0`` (BERT's default null_score_diff_threshold); ``best_exact``/``best_f1``
    with ``best_exact_thresh``/``best_f1_thresh``: the best over every threshold, picked on these examples. mrqa:
    overall ``exact``/``f1``, plus ``<dataset>/exact`` and ``<dataset>/f1`` when the examples span several
    datasets. Every dict also has ``total``, the number of examples scored (squad2: ``HasAns_total`` and
    ``NoAns_total`` too)."""
    t = get_task(task)
    if t.kind == "extractive_qa":
        if not isinstance(predictions, QAPredictions):
            raise TypeError(f"task {t.name}: predictions must be a QAPredictions, not {type(predictions).__name__}")
        qa = [e for e in examples if isinstance(e, QAExample)]
        if len(qa) != len(examples):
            raise TypeError(f"task {t.name}: every example must be a QAExample")
        out = squad_v2(qa, predictions) if t.with_negative else squad_v1(qa, predictions.text)
        if t.suite == "mrqa":
            out.update(per_dataset(qa, predictions.text))
        return out
    preds = list(predictions)  # type: ignore[arg-type]
    if len(preds) != len(examples):
        raise ValueError(f"task {t.name}: {len(preds)} predictions for {len(examples)} examples")
    gold = [e.label for e in examples]  # type: ignore[union-attr]
    if any(g is None for g in gold):
        raise ValueError(f"task {t.name}: an example has no gold label (unlabelled split); score a labelled one")
    fns = {"accuracy": accuracy, "f1": binary_f1, "matthews": matthews, "pearson": pearson, "spearman": spearman}
    out = {m: fns[m](gold, preds) for m in t.metrics}
    out["total"] = float(len(examples))
    return out


# --------------------------------------------------------------------------------- classification and regression
def accuracy(gold: Sequence[int], pred: Sequence[int]) -> float:
    from sklearn.metrics import accuracy_score

    return 100.0 * float(accuracy_score(gold, pred))


def binary_f1(gold: Sequence[int], pred: Sequence[int]) -> float:
    """F1 of the positive class, label 1 (GLUE's MRPC "equivalent", QQP "duplicate")."""
    from sklearn.metrics import f1_score

    return 100.0 * float(f1_score(gold, pred, pos_label=1, average="binary", zero_division=0.0))


def matthews(gold: Sequence[int], pred: Sequence[int]) -> float:
    from sklearn.metrics import matthews_corrcoef

    return 100.0 * float(matthews_corrcoef(gold, pred))


def pearson(gold: Sequence[float], pred: Sequence[float]) -> float:
    """Pearson correlation (percent); 0 when either side is constant (it is undefined there, scipy says nan)."""
    from scipy.stats import pearsonr

    return 100.0 * float(pearsonr(gold, pred)[0]) if _varies(gold, pred) else 0.0


def spearman(gold: Sequence[float], pred: Sequence[float]) -> float:
    """Spearman rank correlation (percent; ties get their average rank); 0 when either side is constant."""
    from scipy.stats import spearmanr

    return 100.0 * float(spearmanr(gold, pred)[0]) if _varies(gold, pred) else 0.0


def _varies(gold: Sequence[float], pred: Sequence[float]) -> bool:
    return len(set(gold)) > 1 and len(set(pred)) > 1


# ------------------------------------------------------------------------------------------------ SQuAD v1.1, MRQA
def normalize_answer(s: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and the articles a/an/the removed, whitespace
    collapsed."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


_PUNCT = frozenset(string.punctuation)


def exact_v1(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_v1(prediction: str, gold: str) -> float:
    """SQuAD v1.1's token F1 (its definition: no overlap -> 0, even when both sides are empty)."""
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _prediction(preds: Mapping[str, str], qid: str) -> str:
    if qid not in preds:
        raise ValueError(f"no prediction for question {qid!r}: the predictions must cover every example")
    return preds[qid]


def squad_v1(examples: Sequence[QAExample], preds: Mapping[str, str]) -> dict[str, float]:
    """SQuAD v1.1's official ``exact_match``/``f1`` (here ``exact``/``f1``): per question the best over its gold
    answers, averaged, in percent."""
    em = f1 = 0.0
    for e in examples:
        p = _prediction(preds, e.id)
        em += max(exact_v1(p, g) for g in e.answers) if e.answers else 0.0
        f1 += max(f1_v1(p, g) for g in e.answers) if e.answers else 0.0
    n = max(len(examples), 1)
    return {"exact": 100.0 * em / n, "f1": 100.0 * f1 / n, "total": float(len(examples))}


def per_dataset(examples: Sequence[QAExample], preds: Mapping[str, str]) -> dict[str, float]:
    """MRQA's per-dataset scores, ``<dataset>/exact`` and ``<dataset>/f1``, when the examples span several."""
    groups: dict[str, list[QAExample]] = {}
    for e in examples:
        groups.setdefault(e.dataset, []).append(e)
    if len(groups) < 2:
        return {}
    out: dict[str, float] = {}
    for name, group in groups.items():
        s = squad_v1(group, preds)
        out[f"{name}/exact"], out[f"{name}/f1"] = s["exact"], s["f1"]
    return out


# ------------------------------------------------------------------------------------------------------ SQuAD v2.0
def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_v2(prediction: str, gold: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(prediction))


def f1_v2(prediction: str, gold: str) -> float:
    """SQuAD v2.0's token F1: an empty side scores 1 exactly when both are empty ("no answer" right)."""
    g, p = _tokens(gold), _tokens(prediction)
    if not g or not p:
        return float(g == p)
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _raw_v2(e: QAExample, pred: str) -> tuple[float, float]:
    """Exact and F1 of the non-null ``pred`` against ``e``'s golds (an unanswerable question's gold is "")."""
    golds = [a for a in e.answers if normalize_answer(a)] or [""]
    return max(exact_v2(pred, g) for g in golds), max(f1_v2(pred, g) for g in golds)


def squad_v2(examples: Sequence[QAExample], preds: QAPredictions, threshold: float = 0.0) -> dict[str, float]:
    """The official SQuAD v2.0 evaluation (na_prob = ``null_odds``): "no answer" where ``null_odds > threshold``
    (scoring 1 on an unanswerable question and 0 on an answerable one), else the span ``preds.text`` scored
    against the golds. ``best_*``: the best score over every threshold, and that threshold (the largest null-odds
    value answered; below every value when "no answer" everywhere is best). Ties in null_odds move together (a
    threshold answers all or none of them), where the official script's sweep could count half a tie."""
    if not examples:
        raise ValueError("no examples to score")
    raw = {}
    for e in examples:
        text = _prediction(preds.text, e.id)
        if e.id not in preds.null_odds:
            raise ValueError(f"no null_odds for question {e.id!r}: the predictions must cover every example")
        raw[e.id] = _raw_v2(e, text)
    has = {e.id: bool(e.answers) for e in examples}  # the official script: a question with answers has one
    odds = {e.id: float(preds.null_odds[e.id]) for e in examples}

    def at(threshold: float, which: int, ids: Sequence[str]) -> float:
        return 100.0 * sum(float(not has[q]) if odds[q] > threshold else raw[q][which] for q in ids) / len(ids)

    ids = [e.id for e in examples]
    out = {"exact": at(threshold, 0, ids), "f1": at(threshold, 1, ids), "total": float(len(ids))}
    for part, sel in (("HasAns", [q for q in ids if has[q]]), ("NoAns", [q for q in ids if not has[q]])):
        if sel:
            out[f"{part}_exact"], out[f"{part}_f1"] = at(threshold, 0, sel), at(threshold, 1, sel)
            out[f"{part}_total"] = float(len(sel))
    for which, name in ((0, "exact"), (1, "f1")):
        out[f"best_{name}"], out[f"best_{name}_thresh"] = best_threshold(ids, raw, has, odds, which)
    return out


def best_threshold(ids: Sequence[str], raw: Mapping[str, tuple[float, float]], has: Mapping[str, bool],
                   odds: Mapping[str, float], which: int) -> tuple[float, float]:  # fmt: skip
    """(best score in percent, its threshold): one pass over the questions in rising null-odds order, starting
    from "no answer" everywhere (every unanswerable question right) and answering one tie group at a time."""
    total = sum(1.0 for q in ids if not has[q])
    best, best_t = total, math.nextafter(min(odds[q] for q in ids), -math.inf)
    order = sorted(ids, key=lambda q: odds[q])
    i = 0
    while i < len(order):
        t = odds[order[i]]
        while i < len(order) and odds[order[i]] == t:
            q = order[i]
            total += raw[q][which] - float(not has[q])  # answered now: its span's score replaces "no answer"'s
            i += 1
        if total > best:
            best, best_t = total, t
    return 100.0 * best / len(ids), best_t
