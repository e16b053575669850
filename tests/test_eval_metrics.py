"""tools/evaluate/metrics.py against independent implementations: confusion-matrix and rank formulas in numpy for
the GLUE metrics, hand-checked SQuAD v1.1/v2.0 cases, and the SQuAD 2.0 threshold search against a brute force over
every candidate threshold (issue #54)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import rankdata

from tools.evaluate import metrics as M
from tools.evaluate.examples import ChoiceExample, QAExample, QAPredictions, TextExample
from tools.evaluate.tasks import TASKS


def _texts(labels) -> list[TextExample]:
    return [TextExample(str(i), "a", None, lab) for i, lab in enumerate(labels)]


def _mcc(y, p) -> float:
    tp, tn = np.sum((y == 1) & (p == 1)), np.sum((y == 0) & (p == 0))
    fp, fn = np.sum((y == 0) & (p == 1)), np.sum((y == 1) & (p == 0))
    den = math.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    return 0.0 if den == 0 else float(tp * tn - fp * fn) / den


def _f1(y, p) -> float:
    tp, fp, fn = np.sum((y == 1) & (p == 1)), np.sum((y == 0) & (p == 1)), np.sum((y == 1) & (p == 0))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_the_confusion_matrix_formulas(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 200))
    y, p = rng.integers(0, 2, n), rng.integers(0, 2, n)
    for name in ("cola", "mrpc", "qqp", "sst2"):
        got = M.score(name, _texts(y.tolist()), p.tolist())
        assert set(TASKS[name].metrics) | {"total"} == set(got) and got["total"] == n
        want = {"accuracy": 100 * np.mean(y == p), "f1": 100 * _f1(y, p), "matthews": 100 * _mcc(y, p)}
        for m in TASKS[name].metrics:
            assert got[m] == pytest.approx(want[m], abs=1e-9), (name, m)
    y3, p3 = rng.integers(0, 3, n), rng.integers(0, 3, n)
    assert M.score("mnli", _texts(y3.tolist()), p3.tolist())["accuracy"] == pytest.approx(100 * np.mean(y3 == p3))


@pytest.mark.parametrize("seed", range(5))
def test_regression_metrics_match_numpy_correlations(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 300))
    y = np.round(rng.uniform(0, 5, n), 1)  # STS-B's scores: ties on purpose
    p = y + rng.normal(0, 1.5, n)
    got = M.score("stsb", _texts(y.tolist()), p.tolist())
    assert got["pearson"] == pytest.approx(100 * np.corrcoef(y, p)[0, 1], abs=1e-9)
    assert got["spearman"] == pytest.approx(100 * np.corrcoef(rankdata(y), rankdata(p))[0, 1], abs=1e-9)
    assert M.score("stsb", _texts([1.0, 1.0, 1.0]), [0.1, 0.5, 0.2])["pearson"] == 0.0  # constant: undefined -> 0


def test_multiple_choice_accuracy_and_input_checks():
    exs = [ChoiceExample(str(i), "c", "p", ("a", "b", "c", "d"), i % 4) for i in range(8)]
    assert M.score("swag", exs, [0, 1, 2, 3, 0, 0, 0, 0])["accuracy"] == 62.5
    with pytest.raises(ValueError, match="3 predictions for 8 examples"):
        M.score("swag", exs, [0, 1, 2])
    with pytest.raises(ValueError, match="no gold label"):
        M.score("sst2", _texts([1, None]), [1, 1])
    with pytest.raises(TypeError, match="QAPredictions"):
        M.score("squad1", [], [0])


def _qa(qid, answers, impossible=False, dataset="") -> QAExample:
    return QAExample(qid, "q?", "ctx", tuple(answers), tuple(range(len(answers))), impossible, dataset)


def test_squad_v1_normalisation_and_f1_hand_checked():
    assert M.normalize_answer("The  Cat, sat!") == "cat sat" and M.normalize_answer("an apple") == "apple"
    assert M.f1_v1("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)  # P 1, R 1/2
    assert M.f1_v1("", "") == 0.0 and M.f1_v2("", "") == 1.0  # the two scripts differ only there
    exs = [_qa("a", ["Denver Broncos", "The Denver Broncos"]), _qa("b", ["Carolina Panthers"]), _qa("c", ["1990"])]
    preds = {"a": "denver broncos!", "b": "the Panthers", "c": "in 1991"}
    got = M.score("squad1", exs, QAPredictions(preds, {}))
    assert got["exact"] == pytest.approx(100 / 3) and got["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)
    with pytest.raises(ValueError, match="no prediction for question 'c'"):
        M.score("squad1", exs, QAPredictions({"a": "x", "b": "y"}, {}))


def test_mrqa_reports_per_dataset_scores_when_examples_span_several():
    exs = [_qa("1", ["x y"], dataset="NewsQA"), _qa("2", ["z"], dataset="NewsQA"), _qa("3", ["w"], dataset="SearchQA")]
    preds = QAPredictions({"1": "x", "2": "z", "3": "v"}, {})
    got = M.score("mrqa_newsqa", exs, preds)
    assert got["NewsQA/exact"] == 50.0 and got["NewsQA/f1"] == pytest.approx(100 * (2 / 3 + 1) / 2)
    assert got["SearchQA/exact"] == 0.0 and got["exact"] == pytest.approx(100 / 3)
    assert "NewsQA/exact" not in M.score("mrqa_newsqa", exs[:2], preds)


def test_squad_v2_hand_checked():
    """Four questions, scored by hand with the official script's rules. At threshold 0: a answered (right), b
    "no answer" (wrong), c and d "no answer" (right): exact = f1 = 75. Sweeping the threshold up in null-odds order
    a(-5) b(2) d(2.5) c(3), from "no answer" everywhere (2 of 4): exact 3, 3, 2, 1 -> best 75 at -5; f1 3, 3.8 (b's
    span "the Carolina Panthers team": P 2/3, R 1, F1 0.8), 2.8, 1.8 -> best 95 at 2."""
    exs = [_qa("a", ["Denver Broncos"]), _qa("b", ["Carolina Panthers"]), _qa("c", [], True), _qa("d", [], True)]
    preds = QAPredictions(
        {"a": "Denver Broncos", "b": "the Carolina Panthers team", "c": "Levi's Stadium", "d": "Santa Clara"},
        {"a": -5.0, "b": 2.0, "c": 3.0, "d": 2.5},
    )
    got = M.score("squad2", exs, preds)
    want = {"exact": 75.0, "f1": 75.0, "HasAns_exact": 50.0, "HasAns_f1": 50.0, "NoAns_exact": 100.0,
            "NoAns_f1": 100.0, "best_exact": 75.0, "best_exact_thresh": -5.0, "best_f1": 95.0, "best_f1_thresh": 2.0,
            "total": 4.0, "HasAns_total": 2.0, "NoAns_total": 2.0}  # fmt: skip
    assert got == pytest.approx(want)
    assert set(TASKS["squad2"].metrics) <= set(got)
    # "no answer" everywhere best: the threshold lies below every null-odds value and reproduces the score
    only_neg = M.score("squad2", exs[2:], QAPredictions(preds.text, {"c": -1.0, "d": 0.5}))
    assert only_neg["best_exact"] == 100.0 and only_neg["best_exact_thresh"] < -1.0
    assert only_neg["exact"] == 50.0  # c answered at threshold 0 (null_odds -1 <= 0): wrong


def _brute(exs, preds, which):
    cands = sorted({float(v) for v in preds.null_odds.values()})
    cands = [math.nextafter(cands[0], -math.inf)] + cands
    return max(M.squad_v2(exs, preds, threshold=t)[which] for t in cands)


@pytest.mark.parametrize("seed", range(20))
def test_squad_v2_threshold_search_equals_brute_force_over_every_threshold(seed):
    rng = np.random.default_rng(seed)
    words = ["red", "blue", "green", "the", "cat", "dog"]
    exs, text, odds = [], {}, {}
    for i in range(int(rng.integers(1, 25))):
        impossible = bool(rng.random() < 0.4)
        golds = [] if impossible else [" ".join(rng.choice(words, int(rng.integers(1, 4)))) for _ in range(2)]
        exs.append(_qa(str(i), golds, impossible))
        text[str(i)] = " ".join(rng.choice(words, int(rng.integers(1, 4))))
        odds[str(i)] = float(rng.integers(-3, 4))  # few values: ties on purpose
    preds = QAPredictions(text, odds)
    got = M.squad_v2(exs, preds)
    for name in ("exact", "f1"):
        assert got[f"best_{name}"] == pytest.approx(_brute(exs, preds, name), abs=1e-9)
        again = M.squad_v2(exs, preds, threshold=got[f"best_{name}_thresh"])  # the threshold reproduces its score
        assert again[name] == pytest.approx(got[f"best_{name}"], abs=1e-9)
        assert got[f"best_{name}"] >= got[name] - 1e-9
