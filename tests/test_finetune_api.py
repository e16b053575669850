"""tools.finetune.finetune, the API over the canonical examples: every kind learns a toy task above chance through
HF's Trainer (classification, regression, multiple choice, extractive QA with unanswerable questions), the compute
is counted exactly, SQuAD 2.0's null score is BERT's, and every model family fine-tunes at its N with the padding its
layout needs."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from tests.test_finetune import _export, _single_token_words, _tokenizer
from tools import finetune as ft
from tools.evaluate.examples import ChoiceExample, QAExample, QAPredictions, TextExample

BLOCKBERT = {
    "kernel": "block_gather",
    "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
}
FAMILIES = {
    "dense": {},
    "blockbert": {"attention": BLOCKBERT},
    "sparsebert_mask": {"attention": {"kernel": "dense", "token_mask": {"pattern": "bigbird"}}},
    "diet": {"position": {"type": "diet_rel", "max_distance": 8}, "segment": "per_head"},
}
"""One export per model family (stock BERT, BlockBERT, a SparseBERT fixed token mask, DIET positions+segments)."""


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return _tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def words(tok):
    return _single_token_words(tok, 30)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("exports")
    return {name: _export(root / name, tok, **kw) for name, kw in FAMILIES.items()}


def _marker_sentences(words, n: int, seed: int) -> list[TextExample]:
    """Label 1 iff the sentence holds the first marker word (else the second); chance is 0.5."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = i % 2
        ws = rng.sample(words[2:22], 5)
        ws.insert(rng.randrange(6), words[1 - label])
        out.append(TextExample(f"s{seed}-{i}", " ".join(ws), None, label))
    return out


def _cfg(tmp: Path, **kw) -> ft.FinetuneConfig:
    return ft.FinetuneConfig(output_dir=str(tmp), **{"batch_size": 16, "lr": 3e-3, "epochs": 10, **kw})


def _accuracy(pred, exs) -> float:
    return sum(int(p == e.label) for p, e in zip(pred, exs)) / len(exs)


# ------------------------------------------------------------------------------------------------ the four kinds
def test_classification_learns_and_counts_its_compute(tmp_path, exports, words):
    """>= 29 of 32 right has probability < 1e-6 at chance. Compute: 64 examples x 10 epochs / 16 = 40 steps, 640
    rows; tokens = the padded batches' sizes (recomputed from the tokenizer)."""
    train, dev = _marker_sentences(words, 64, 0), _marker_sentences(words, 32, 1)
    model = exports["dense"]
    r = ft.finetune(model, "classification", train, {"dev": dev, "empty": []}, _cfg(tmp_path), num_labels=2)
    assert r.steps == 40 and r.train_examples == 640
    assert r.info["padding"] == "longest" and r.info["max_length"] == 64
    assert r.predictions["empty"] == []
    assert len(r.predictions["dev"]) == 32 and _accuracy(r.predictions["dev"], dev) >= 29 / 32
    assert r.train_loss_last < 0.5 * r.train_loss_first and r.train_seconds > 0
    # every sentence has 6 single-token words: [CLS] + 6 + [SEP] = 8 tokens, so each padded batch is 8 wide
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(model)
    assert {len(t(e.text_a)["input_ids"]) for e in train} == {8}
    assert r.train_tokens == 640 * 8
    assert set(p.name for p in tmp_path.iterdir()) <= {"trainer"}  # nothing outside output_dir, nothing much in it


def test_regression_learns_a_similarity_score(tmp_path, exports, words):
    """STS-B's head (one output, MSE): the target is 1.0 when the sentence holds the marker word, else 0.0 (a score
    scaled to the toy model: Adam moves a weight ~lr a step, so a tiny model in 40 steps cannot reach STS-B's 0..5);
    the predictions must correlate with it on unseen sentences (Pearson > 0.8; scipy; P < 1e-7 at random)."""
    from scipy.stats import pearsonr

    rng = random.Random(2)

    def rows(n, tag):
        out = []
        for i in range(n):
            ws = rng.sample(words[2:22], 5)
            if i % 2:
                ws.insert(rng.randrange(6), words[0])
            out.append(TextExample(f"{tag}{i}", " ".join(ws), None, 1.0 * (i % 2)))
        return out

    train, dev = rows(64, "t"), rows(32, "d")
    r = ft.finetune(exports["dense"], "regression", train, {"dev": dev}, _cfg(tmp_path), num_labels=1)
    pred = r.predictions["dev"]
    assert len(pred) == 32 and all(isinstance(p, float) for p in pred)
    assert r.info["head"] == "BertForSequenceClassification"
    assert pearsonr(pred, [e.label for e in dev])[0] > 0.8


def _choices(words, n: int, seed: int) -> list[ChoiceExample]:
    """SWAG-shaped: 4 endings, the right one holds the marker word; chance is 0.25."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = rng.randrange(4)
        endings = []
        for j in range(4):
            ws = rng.sample(words[1:22], 3)
            if j == label:
                ws[rng.randrange(3)] = words[0]
            endings.append(" ".join(ws))
        out.append(
            ChoiceExample(f"c{seed}-{i}", " ".join(rng.sample(words[1:22], 4)), words[23], tuple(endings), label)
        )
    return out


def test_multiple_choice_learns_on_a_blockbert_export(tmp_path, exports, words):
    """The custom-code AutoModelForMultipleChoice head; >= 24 of 32 right is far above chance (0.25: P < 1e-9).
    BlockBERT pads every ending to N = 64: tokens = rows x 4 endings x 64."""
    train, dev = _choices(words, 64, 3), _choices(words, 32, 4)
    r = ft.finetune(exports["blockbert"], "multiple_choice", train, {"dev": dev}, _cfg(tmp_path), num_labels=0)
    assert r.info["head"] == "SparseBertForMultipleChoice" and r.info["padding"] == "max_length"
    assert r.train_examples == 640 and r.train_tokens == 640 * 4 * 64
    assert _accuracy(r.predictions["dev"], dev) >= 24 / 32
    assert r.train_loss_last < 0.5 * r.train_loss_first


def _squad2(words, n: int, seed: int) -> list[QAExample]:
    """Answerable iff the context holds the marker word, which is the answer."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ws = rng.sample(words[2:22], 7)
        if i % 2:
            out.append(QAExample(f"q{seed}-{i}", "where is it ?", " ".join(ws), (), (), is_impossible=True))
            continue
        at = rng.randrange(8)
        ws.insert(at, words[0])
        start = len(" ".join(ws[:at])) + (1 if at else 0)
        out.append(QAExample(f"q{seed}-{i}", "where is it ?", " ".join(ws), (words[0],), (start,)))
    return out


def test_extractive_qa_with_unanswerable_questions(tmp_path, exports, words):
    """SQuAD 2.0 on the Trainer: unanswerable questions train towards [CLS]; after training null_odds > 0 on
    >= 14 of 16 unanswerable and < 0 on >= 14 of 16 answerable dev questions, and the span is right on >= 14."""
    train, dev = _squad2(words, 96, 5), _squad2(words, 32, 6)
    with pytest.raises(ft.DataError, match=r"train\[1\] .*has no answer: pass with_negative=True"):
        ft.finetune(exports["dense"], "extractive_qa", train, {}, _cfg(tmp_path), num_labels=0)
    r = ft.finetune(
        exports["dense"], "extractive_qa", train, {"dev": dev}, _cfg(tmp_path), num_labels=0, with_negative=True
    )
    p = r.predictions["dev"]
    assert isinstance(p, QAPredictions) and set(p.text) == set(p.null_odds) == {e.id for e in dev}
    assert r.info["windows"] == {"train": 96, "dev": 32}
    neg = [p.null_odds[e.id] > 0 for e in dev if e.is_impossible]
    pos = [p.null_odds[e.id] < 0 for e in dev if not e.is_impossible]
    right = [p.text[e.id] == e.answers[0] for e in dev if not e.is_impossible]
    assert sum(neg) >= 14 and sum(pos) >= 14 and sum(right) >= 14, (neg, pos, right)


def test_null_score_is_the_minimum_over_windows_and_odds_subtract_the_best_span(tok):
    """BERT's run_squad: null = min over windows of [CLS] start+end; null_odds = null - best valid span anywhere."""
    ex = QAExample("x", "q ?", " ".join(["alpha"] * 3 + ["beta"] * 60), ("beta",), (18,))
    feats = ft.qa_features(tok, [ex], 24, 8, 8)
    assert len(feats) >= 3
    starts, ends = [], []
    for k, f in enumerate(feats):
        s, e = [-50.0] * len(f.input_ids), [-50.0] * len(f.input_ids)
        s[0], e[0] = 2.0 + k, 1.0 + k  # windows' null scores 3, 5, 7, ...: the minimum is 3
        first = next(p for p, ok in enumerate(f.max_context) if ok)
        if k == 1:
            s[first], e[first] = 4.0, 2.5  # the best span: 6.5, in the second window
        if k == 2:
            s[first], e[first] = 1.0, 1.0
        starts.append(s)
        ends.append(e)
    p = ft.decode_qa(feats, starts, ends, [ex], n_best=20, max_answer_length=30)
    assert p.null_odds["x"] == pytest.approx(3.0 - 6.5)
    f1 = feats[1]
    first = next(q for q, ok in enumerate(f1.max_context) if ok)
    assert p.text["x"] == ex.context[f1.offsets[first][0] : f1.offsets[first][1]]


def test_bad_examples_are_named_before_training(tmp_path, exports, words):
    train = _marker_sentences(words, 8, 0)
    cfg = _cfg(tmp_path)
    with pytest.raises(ft.DataError, match="kind must be one of"):
        ft.finetune(exports["dense"], "ner", train, {}, cfg, num_labels=2)
    with pytest.raises(ft.DataError, match=r"train\[0\].*a multiple_choice run needs ChoiceExamples"):
        ft.finetune(exports["dense"], "multiple_choice", train, {}, cfg, num_labels=0)
    with pytest.raises(ft.DataError, match=r"train\[1\].*label 1 is not a class index in \[0, 1\)|num_labels >= 2"):
        ft.finetune(exports["dense"], "classification", train, {}, cfg, num_labels=1)
    unlabelled = [TextExample("u", "a b", None, None)]
    with pytest.raises(ft.DataError, match=r"train\[0\] \(id u\) has no label"):
        ft.finetune(exports["dense"], "classification", unlabelled, {}, cfg, num_labels=2)
    with pytest.raises(ft.DataError, match="not found"):
        ft.finetune(tmp_path / "nope", "classification", train, {}, cfg, num_labels=2)
    with pytest.raises(ValueError, match="--padding must be one of"):
        ft.FinetuneConfig(output_dir=str(tmp_path), padding="none")


# ------------------------------------------------------------------------------------------------ every family
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_fine_tunes_at_its_n_with_the_padding_its_layout_needs(tmp_path, exports, words, family):
    """Loss falls and dev accuracy is far above chance; BlockBERT (whose chunks are length/num_blocks long) is padded
    to N, every other family (whose shorter-input pattern is a prefix of its N-token one) to the batch's longest."""
    train, dev = _marker_sentences(words, 64, 7), _marker_sentences(words, 32, 8)
    r = ft.finetune(exports[family], "classification", train, {"dev": dev}, _cfg(tmp_path), num_labels=2)
    assert r.info["padding"] == ("max_length" if family == "blockbert" else "longest")
    assert r.train_tokens == 640 * (64 if family == "blockbert" else 8)
    assert r.train_loss_last < 0.5 * r.train_loss_first
    assert _accuracy(r.predictions["dev"], dev) >= 29 / 32


def test_length_dependent_layout_is_blockberts_and_padding_to_n_keeps_its_logits(exports, tok):
    """Padding an input to N gives BlockBERT other logits than leaving it short (its chunks move), and the same
    logits for a family that slices its N-token pattern (a SparseBERT mask): why ``auto`` pads BlockBERT only."""
    from transformers import AutoModel

    text = "the question is what follows the word"
    for family, dependent in (("blockbert", True), ("sparsebert_mask", False), ("dense", False)):
        m = AutoModel.from_pretrained(exports[family], trust_remote_code=True).eval()
        assert ft.length_dependent_layout(m, 64) is dependent, family
        short = tok(text, return_tensors="pt")
        full = tok(text, return_tensors="pt", padding="max_length", max_length=64)
        n = short["input_ids"].shape[1]
        with torch.no_grad():
            a = m(**short).last_hidden_state[0, :n]
            b = m(**full).last_hidden_state[0, :n]
        same = bool((a - b).abs().max() <= 1e-4)
        assert same is (not dependent), (family, float((a - b).abs().max()))
        assert math.isfinite(float(a.sum()))
