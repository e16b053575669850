"""tools/finetune.py: SQuAD v1.1 metrics against hand-computed cases, sliding-window span mapping, bad data, and
end-to-end runs on the shipped tiny datasets (classification on a stock BERT export, QA on a BlockBERT export)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import ModelConfig
from tools import finetune as ft
from tools.evaluate import metrics
from tools.evaluate.examples import QAExample, QAPredictions, TextExample
from tools.hf_export.export import write_hf

DATA = Path(__file__).resolve().parents[1] / "run_scripts" / "finetune_data"


# ------------------------------------------------------------------------------------------------ metrics
def test_cli_scores_every_kind_through_the_evaluate_metrics():
    """The CLI's scores come from tools.evaluate.metrics (one home): accuracy and Pearson/Spearman agree with
    scikit-learn/scipy; QA with hand-computed SQuAD v1.1 values; --with-negative gives the SQuAD 2.0 parts."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score

    gold, pred = [1, 0, 1, 1], [1, 1, 1, 0]
    dev = [TextExample(str(i), "a", None, g) for i, g in enumerate(gold)]
    assert ft.cli_scores("classification", dev, pred, with_negative=False) == {
        "accuracy": pytest.approx(100 * accuracy_score(gold, pred))
    }
    gold_r, pred_r = [0.0, 1.5, 3.0, 4.5, 5.0], [0.3, 1.0, 3.5, 4.0, 4.9]
    dev_r = [TextExample(str(i), "a", None, g) for i, g in enumerate(gold_r)]
    m = ft.cli_scores("regression", dev_r, pred_r, with_negative=False)
    assert m["pearson"] == pytest.approx(100 * pearsonr(gold_r, pred_r)[0])
    assert m["spearman"] == pytest.approx(100 * spearmanr(gold_r, pred_r)[0])
    qa = [
        QAExample("q1", "?", "c", ("twelve", "12"), (0, 0)),
        QAExample("q2", "?", "c", ("old mill wheel",), (0,)),
        QAExample("q3", "?", "c", ("barley",), (0,)),
    ]
    preds = QAPredictions({"q1": "twelve", "q2": "the old mill", "q3": "oats"}, {"q1": -1.0, "q2": -1.0, "q3": -1.0})
    m = ft.cli_scores("extractive_qa", qa, preds, with_negative=False)
    # q1 EM 1 F1 1; q2 EM 0 F1 2*(1)*(2/3)/(5/3) = 0.8; q3 0
    assert m["exact"] == pytest.approx(100 / 3) and m["f1"] == pytest.approx(100 * 1.8 / 3)
    qa2 = [*qa, QAExample("q4", "?", "c", (), (), is_impossible=True)]
    preds2 = QAPredictions({**preds.text, "q4": "x"}, {**preds.null_odds, "q4": 2.0})
    m = ft.cli_scores("extractive_qa", qa2, preds2, with_negative=True)
    assert m["HasAns_exact"] == pytest.approx(100 / 3) and m["NoAns_exact"] == 100.0  # null_odds 2 > 0: no answer
    assert m["exact"] == pytest.approx(100 * 2 / 4) and "best_f1_thresh" in m


# ------------------------------------------------------------------------------------------------ data
def _tokenizer(tmp: Path):
    """A WordPiece vocabulary trained on the shipped examples (no download, no corpus needed)."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    texts = []
    for name in ("cls_train", "cls_dev", "pair_train", "qa_train", "qa_dev"):
        for _, o in ft.read_jsonl(DATA / f"{name}.jsonl"):
            texts += [v for k, v in o.items() if isinstance(v, str)]
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(
        texts, vocab_size=400, min_frequency=1, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    tmp.mkdir(parents=True, exist_ok=True)
    wp.save_model(str(tmp))
    return BertTokenizerFast(vocab=str(tmp / "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return _tokenizer(tmp_path_factory.mktemp("tok"))


def test_shipped_datasets_parse():
    assert len(ft.read_classification(DATA / "cls_train.jsonl")) == 24
    pairs = ft.read_classification(DATA / "pair_train.jsonl")
    assert all(p.text_b for p, _ in pairs)
    nested, flat = ft.read_qa(DATA / "qa_train.jsonl"), ft.read_qa(DATA / "qa_dev.jsonl")
    for ex in nested + flat:
        assert ex.context[ex.starts[0] : ex.starts[0] + len(ex.answers[0])] == ex.answers[0]


def test_bad_data_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"sentence1": "ok", "label": 1}\n{not json\n')
    with pytest.raises(ft.DataError, match=r"bad\.jsonl:2:2: not valid JSON \(Expecting property name"):
        ft.read_classification(bad)
    bad.write_text('{"sentence1": "ok", "label": 1}\n[1]\n')
    with pytest.raises(ft.DataError, match=r"bad\.jsonl:2: expected a JSON object, got a list"):
        ft.read_classification(bad)
    bad.write_text('{"sentence2": "no first sentence", "label": 1}\n')
    with pytest.raises(ft.DataError, match=r"bad\.jsonl:1: .*'sentence1'"):
        ft.read_classification(bad)
    bad.write_text(
        json.dumps({"context": "abc def", "question": "q?", "answers": {"text": ["def"], "answer_start": [1]}}) + "\n"
    )
    with pytest.raises(ft.DataError, match=r"bad\.jsonl:1: answer 'def' is not at character 1"):
        ft.read_qa(bad)


@pytest.mark.parametrize("max_length,stride,overlapping", [(40, 16, True), (64, 128, False), (512, 128, True)])
def test_windows_map_gold_spans_back_to_the_exact_answer(tok, max_length, stride, overlapping):
    examples = ft.read_qa(DATA / "qa_train.jsonl") + ft.read_qa(DATA / "qa_dev.jsonl")
    feats = ft.qa_features(tok, examples, max_length, stride, 64)
    by_ex: dict[int, list] = {}
    for f in feats:
        by_ex.setdefault(f.example, []).append(f)
        assert len(f.input_ids) <= max_length
        assert f.input_ids[0] == tok.cls_token_id and f.input_ids[-1] == tok.sep_token_id
        if f.start:
            ex = examples[f.example]
            assert ex.context[f.offsets[f.start][0] : f.offsets[f.end][1]] == ex.answers[0]
            assert f.token_type_ids[f.start] == 1
    for i, ex in enumerate(examples):
        fs = by_ex[i]
        if overlapping:  # stride >= capacity makes disjoint windows: an answer on a boundary is in none (as BERT)
            assert any(f.start for f in fs), f"gold answer of {ex.id} is in no window"
        n_ctx = len(tok(ex.context, add_special_tokens=False)["input_ids"])
        firsts = [next(o for o in f.offsets if o is not None) for f in fs]
        ctx_ids = tok(ex.context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        starts = [ctx_ids.index(tuple(o)) for o in firsts]
        assert starts[0] == 0
        q = len(fs[0].input_ids) - 3 - sum(o is not None for o in fs[0].offsets)
        capacity = max_length - q - 3
        assert all(b - a == min(stride, capacity) for a, b in zip(starts, starts[1:]))  # BERT run_squad stride
        last = fs[-1]
        assert starts[-1] + sum(o is not None for o in last.offsets) == n_ctx  # the whole context is covered
        # every context token is "max context" in exactly one window: the most centred one (BERT's rule)
        seen: dict[tuple[int, int], list[tuple[float, bool]]] = {}
        for f, st in zip(fs, starts):
            ctx_pos = [p for p, o in enumerate(f.offsets) if o is not None]
            n = len(ctx_pos)
            for j, p in enumerate(ctx_pos):
                seen.setdefault(f.offsets[p], []).append((min(j, n - 1 - j) + 0.01 * n, f.max_context[p]))
        for views in seen.values():
            assert sum(flag for _, flag in views) == 1
            best = max(range(len(views)), key=lambda v: views[v][0])
            assert views[best][1]
    if max_length == 40:
        assert len(feats) > len(examples)  # the long paragraph really needed several windows


def test_decode_picks_best_valid_span_across_windows(tok):
    examples = ft.read_qa(DATA / "qa_dev.jsonl")
    feats = ft.qa_features(tok, examples, 40, 16, 64)
    starts, ends = [], []
    for f in feats:
        s, e = [-100.0] * len(f.input_ids), [-100.0] * len(f.input_ids)
        s[0] = e[0] = 50.0  # [CLS] scores high but is never a valid answer
        if f.start:
            s[f.start], e[f.end] = 10.0, 10.0
        elif len(f.input_ids) > 10:
            s[-2], e[-3] = 30.0, 30.0  # end before start: must be skipped
        starts.append(s)
        ends.append(e)
    preds = ft.decode_qa(feats, starts, ends, examples, n_best=20, max_answer_length=30)
    assert preds.text == {ex.id: ex.answers[0] for ex in examples}
    assert metrics.squad_v1(examples, preds.text) == {"exact": 100.0, "f1": 100.0, "total": len(examples)}


# ------------------------------------------------------------------------------------------------ end to end
def _export(tmp: Path, tok, **kw) -> Path:
    cfg = ModelConfig.from_dict(
        {
            **dict(
                vocab_size=len(tok),
                hidden_size=32,
                num_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
            ),
            **kw,
        }
    )
    torch.manual_seed(0)
    m = BertForPreTraining(cfg)
    tmp.mkdir(parents=True)
    write_hf(m.state_dict(), cfg, m.layout_state(), tmp)
    tok.save_pretrained(str(tmp))
    return tmp


def _recomputed(out: Path, task: str) -> dict:
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    if task == "qa":
        n = len(rows)
        em = sum(max(metrics.exact_v1(r["prediction"], a) for a in r["answers"]) for r in rows)
        f1 = sum(max(metrics.f1_v1(r["prediction"], a) for a in r["answers"]) for r in rows)
        return {"exact": 100 * em / n, "f1": 100 * f1 / n}
    return {"accuracy": 100 * sum(r["prediction"] == r["label"] for r in rows) / len(rows)}


def test_finetune_classification_end_to_end_on_stock_bert(tmp_path, tok, capsys):
    model = _export(tmp_path / "dense", tok)
    assert json.loads((model / "config.json").read_text())["model_type"] == "bert"
    out = tmp_path / "cls"
    assert (
        ft.main(
            [
                "--model",
                str(model),
                "--task",
                "classification",
                "--train",
                str(DATA / "cls_train.jsonl"),
                "--dev",
                str(DATA / "cls_dev.jsonl"),
                "--output-dir",
                str(out),
                "--max-steps",
                "4",
                "--batch-size",
                "8",
                "--lr",
                "1e-3",
            ]
        )
        == 0
    )
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 4 and m["max_length"] == 64
    assert m["accuracy"] == pytest.approx(_recomputed(out, "classification")["accuracy"])
    assert 0.0 <= m["accuracy"] <= 100.0
    assert '"accuracy"' in capsys.readouterr().out


def test_finetune_qa_end_to_end_on_blockbert_custom_code(tmp_path, tok):
    model = _export(
        tmp_path / "blockbert",
        tok,
        attention={
            "kernel": "block_gather",
            "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
        },
    )
    assert "auto_map" in json.loads((model / "config.json").read_text())
    out = tmp_path / "qa"
    assert (
        ft.main(
            [
                "--model",
                str(model),
                "--task",
                "qa",
                "--train",
                str(DATA / "qa_train.jsonl"),
                "--dev",
                str(DATA / "qa_dev.jsonl"),
                "--output-dir",
                str(out),
                "--max-steps",
                "3",
                "--batch-size",
                "8",
                "--lr",
                "1e-3",
                "--doc-stride",
                "32",
            ]
        )
        == 0
    )
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 3 and m["dev_windows"] > 5  # the long paragraph was split into windows at N = 64
    again = _recomputed(out, "qa")
    assert m["exact"] == pytest.approx(again["exact"]) and m["f1"] == pytest.approx(again["f1"])
    assert 0.0 <= m["exact"] <= m["f1"] <= 100.0
    assert (
        ft.main(
            [
                "--model",
                str(model),
                "--task",
                "qa",
                "--train",
                str(DATA / "qa_train.jsonl"),
                "--dev",
                str(DATA / "qa_dev.jsonl"),
                "--output-dir",
                str(out),
                "--no-trust-remote-code",
            ]
        )
        == 2
    )


# ------------------------------------------------------------------------------------------------ learning
def _single_token_words(tok, n: int) -> list[str]:
    """Words of the toy vocabulary that are one token each (so a span is one token)."""
    words = sorted(w for w in tok.get_vocab() if w.isalpha() and len(w) > 2 and len(tok.tokenize(w)) == 1)
    assert len(words) >= n, "the toy vocabulary is too small"
    return words[:n]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_finetune_learns_a_separable_classification_task(tmp_path, tok):
    """Stock BERT export on the Trainer: sentences labelled by which of two marker words they contain. Chance is
    0.5; >= 29 of 32 dev sentences right has probability < 1e-6 without learning."""
    import random

    words = _single_token_words(tok, 22)
    markers, filler = {"yes": words[0], "no": words[1]}, words[2:]
    rng = random.Random(0)

    def rows(n):
        out = []
        for i in range(n):
            label = "yes" if i % 2 == 0 else "no"
            ws = rng.sample(filler, 5)
            ws.insert(rng.randrange(6), markers[label])
            out.append({"sentence1": " ".join(ws), "label": label})
        return out

    train, dev = _write_jsonl(tmp_path / "train.jsonl", rows(64)), _write_jsonl(tmp_path / "dev.jsonl", rows(32))
    model = _export(tmp_path / "dense", tok)
    out = tmp_path / "out"
    assert (
        ft.main(
            [
                "--model",
                str(model),
                "--task",
                "classification",
                "--train",
                str(train),
                "--dev",
                str(dev),
                "--output-dir",
                str(out),
                "--epochs",
                "15",
                "--batch-size",
                "16",
                "--lr",
                "3e-3",
            ]
        )
        == 0
    )
    m = json.loads((out / "metrics.json").read_text())
    assert m["trainer"] == "transformers.Trainer" and m["steps"] == 60
    assert m["train_loss_last"] < 0.5 * m["train_loss_first"]
    assert m["accuracy"] >= 100 * 29 / 32, m


def test_finetune_learns_extractive_qa_on_custom_code(tmp_path, tok):
    """A BlockBERT export (remote code, padded to its N=64) on the Trainer with gradient accumulation (40 steps: EM
    100 in 15 s of CPU, single-threaded): the answer is the first word of
    the context. Picking a span at random among ~20 candidates gives EM near 0; the model must reach >= 80."""
    import random

    words = _single_token_words(tok, 30)
    rng = random.Random(1)

    def rows(n, prefix):
        out = []
        for i in range(n):
            ws = rng.sample(words, 8)
            out.append(
                {
                    "id": f"{prefix}{i}",
                    "question": "what is first ?",
                    "context": " ".join(ws),
                    "answers": {"text": [ws[0]], "answer_start": [0]},
                }
            )
        return out

    train, dev = (
        _write_jsonl(tmp_path / "train.jsonl", rows(64, "t")),
        _write_jsonl(tmp_path / "dev.jsonl", rows(20, "d")),
    )
    model = _export(
        tmp_path / "blockbert",
        tok,
        attention={
            "kernel": "block_gather",
            "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
        },
    )
    out = tmp_path / "out"
    assert (
        ft.main(
            [
                "--model",
                str(model),
                "--task",
                "qa",
                "--train",
                str(train),
                "--dev",
                str(dev),
                "--output-dir",
                str(out),
                "--max-steps",
                "40",
                "--batch-size",
                "8",
                "--gradient-accumulation-steps",
                "2",
                "--lr",
                "3e-3",
            ]
        )
        == 0
    )
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 40 and m["config"]["gradient_accumulation_steps"] == 2
    assert m["exact"] >= 80.0, m


def test_command_line_runs_every_kind_and_squad2_data(tmp_path, tok):
    """--task regression / multiple_choice / extractive_qa --with-negative: each runs (2 steps: 4 and then 2 of the
    6 rows), writes predictions for every dev line and metrics.json with the compute; an unanswerable line without
    --with-negative is refused."""
    words = _single_token_words(tok, 12)
    model = _export(tmp_path / "dense", tok)
    reg = [{"sentence1": " ".join(words[i : i + 4]), "label": i / 2} for i in range(6)]
    mc = [
        {"context": words[i], "prefix": words[i + 1], "endings": words[i + 2 : i + 6], "label": i % 4} for i in range(6)
    ]
    qa = [
        {
            "id": f"q{i}",
            "question": "which ?",
            "context": " ".join(words[i : i + 5]),
            "answers": {"text": [words[i]], "answer_start": [0]},
        }
        for i in range(5)
    ] + [
        {
            "id": "none",
            "question": "which ?",
            "context": " ".join(words[:5]),
            "answers": {"text": [], "answer_start": []},
        }
    ]
    for task, rows, extra in (
        ("regression", reg, []),
        ("multiple_choice", mc, []),
        ("extractive_qa", qa, ["--with-negative"]),
    ):
        data = _write_jsonl(tmp_path / f"{task}.jsonl", rows)
        out = tmp_path / task
        argv = [
            "--model",
            str(model),
            "--task",
            task,
            "--train",
            str(data),
            "--dev",
            str(data),
            "--output-dir",
            str(out),
        ]
        assert ft.main([*argv, "--max-steps", "2", "--batch-size", "4", *extra]) == 0, task
        m = json.loads((out / "metrics.json").read_text())
        assert m["steps"] == 2 and m["train_examples"] == 6 and m["train_tokens"] > 0 and m["kind"] == task
        preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert len(preds) == 6, task
        if task == "regression":
            assert {"pearson", "spearman"} <= set(m), m
        if task == "multiple_choice":
            assert m["accuracy"] == pytest.approx(100 * sum(p["prediction"] == p["label"] for p in preds) / 6)
        if task == "extractive_qa":
            assert all(isinstance(p["null_odds"], float) for p in preds) and "f1" in m
            assert m["NoAns_total"] == 1 and m["HasAns_total"] == 5 and "best_f1_thresh" in m  # official SQuAD 2.0
            assert ft.main([*argv, "--max-steps", "2"]) == 2  # the empty answer needs --with-negative
