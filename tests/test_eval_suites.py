"""Issue #54's "Done when" commands for real: ``python -m tools.evaluate`` over a dense and a BlockBERT custom-code
export, on tiny data written in the official formats (GLUE TSV with MNLI's matched/mismatched and STS-B, SQuAD v2.0
JSON with unanswerable questions, MRQA jsonl.gz of two datasets), narrowed to one grid point and one seed. Checks the
table: one column per model, the rows and metrics the papers print, the narrowed marking, the compute, and that every
number in it is the score of the predictions the run kept (recomputed here with scikit-learn / scipy / the official
SQuAD 2.0 definitions through tools/evaluate/metrics.py)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from tests.test_finetune import _export, _single_token_words, _tokenizer
from tests.test_finetune_api import BLOCKBERT

MAXPOS = 128
"""The exports' max positions: SparseBERT's GLUE protocol fine-tunes at 128."""


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return _tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def words(tok):
    return _single_token_words(tok, 30)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tok):
    """A stock-BERT export and a BlockBERT custom-code export (2 chunks of 64 at N=128, tiles of 16), both tiny."""
    root = tmp_path_factory.mktemp("exports")
    kw = dict(max_position_embeddings=MAXPOS, num_layers=1)
    bb = _export(root / "bb", tok, attention=BLOCKBERT, **kw)
    return {"dense": _export(root / "dense", tok, **kw), "blockbert": bb}


def _run(argv: list[str], capsys) -> str:
    from tools.evaluate import __main__ as entry

    assert entry.main(argv) == 0
    return capsys.readouterr().out


def _models(exports) -> list[str]:
    return ["--model", f"dense={exports['dense']}", "--model", f"blockbert={exports['blockbert']}"]


def _kept(out: Path, tag: str, task: str) -> Path:
    (run,) = sorted(out.glob(f"{tag}/{task}/*/seed*"))
    return run


# --------------------------------------------------------------------------------------------------- GLUE
def _glue(root: Path, words: list[str]) -> Path:
    """MNLI (train, dev_matched, dev_mismatched; gold_label names) and STS-B (score floats), GLUE's TSV layout."""
    rng = random.Random(0)
    labels = ("entailment", "neutral", "contradiction")

    def sent() -> str:
        return " ".join(rng.sample(words[3:], 4))

    def tsv(path: Path, header: list[str], rows: list[list[str]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")

    head = ["index", "genre", "sentence1", "sentence2", "gold_label"]
    for name, n in (("train", 24), ("dev_matched", 12), ("dev_mismatched", 10)):
        rows = []
        for i in range(n):
            lab = i % 3
            rows.append([str(i), "fiction", sent(), f"{words[lab]} {sent()}", labels[lab]])
        tsv(root / "MNLI" / f"{name}.tsv", head, rows)
    head = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"]
    for name, n in (("train", 24), ("dev", 12)):
        rows = []
        for i in range(n):
            a = sent()
            s = rng.uniform(0, 5)
            rows.append([str(i), "main-news", "x", "2012", str(i), "none", "none", a, sent(), f"{s:.3f}"])
        tsv(root / "STS-B" / f"{name}.tsv", head, rows)
    return root


def test_sparsebert_glue_with_mnli_and_stsb_on_two_models(tmp_path, exports, words, capsys):
    """The GLUE command narrowed to MNLI and STS-B, one grid point, one seed: a column per model, MNLI's m/mm pair
    and STS-B's Spearman, recomputed from the kept predictions with scikit-learn and scipy."""
    from scipy.stats import spearmanr
    from sklearn.metrics import accuracy_score

    from tools.evaluate.data import load_split

    data, out = _glue(tmp_path / "glue", words), tmp_path / "out"
    argv = ["--protocol", "sparsebert", "--suite", "glue", *_models(exports), "--data-dir", str(data),
            "--output-dir", str(out), "--tasks", "mnli", "stsb", "--lr", "5e-5", "--weight-decay", "0.01",
            "--seeds", "1", "--limit-train", "16", "--limit-eval", "8", "--device", "cpu",
            "--precision", "fp32"]  # fmt: skip
    printed = _run(argv, capsys)
    assert "4 runs now, 0 done before, 0 left" in printed
    report = json.loads((out / "table.json").read_text())
    assert [m["tag"] for m in report["models"]] == ["dense", "blockbert"]
    assert [r["task"] for r in report["tasks"]] == ["mnli", "stsb"]
    assert report["narrowed"] == [
        "glue: only mnli, stsb of mnli, qqp, qnli, sst2, cola, stsb, mrpc, rte",
        "mnli: 1 of 12 grid points",
        "mnli: seeds 1 of 1 2 3",
        "stsb: 1 of 12 grid points",
        "stsb: seeds 1 of 1 2 3",
        "training sets cut to their first 16 examples",
        "dev sets cut to their first 8 examples",
    ]
    assert report["averages"]["glue"] == {"dense": None, "blockbert": None}  # 2 of 8 tasks: no GLUE average
    mnli, stsb = report["tasks"]
    for tag in ("dense", "blockbert"):
        for split in ("validation_matched", "validation_mismatched"):
            dev = load_split("mnli", data, split, limit=8)
            preds = json.loads((_kept(out, tag, "mnli") / f"predictions_{split}.json").read_text())
            assert list(preds) == [ex.id for ex in dev]
            want = 100 * accuracy_score([ex.label for ex in dev], list(preds.values()))
            assert mnli["cells"][tag]["median"][split]["accuracy"] == pytest.approx(want)
        dev = load_split("stsb", data, "validation", limit=8)
        preds = json.loads((_kept(out, tag, "stsb") / "predictions_validation.json").read_text())
        want = 100 * spearmanr([ex.label for ex in dev], list(preds.values())).statistic
        assert stsb["cells"][tag]["median"]["validation"]["spearman"] == pytest.approx(want)
        assert stsb["cells"][tag]["best_point"]["batch_size"] == 32
        result = json.loads((_kept(out, tag, "stsb") / "result.json").read_text())
        assert result["info"]["max_length"] == 128 and result["train_examples"] == 16 * 3  # rows x epochs
    bb = json.loads((_kept(out, "blockbert", "mnli") / "result.json").read_text())
    assert bb["info"]["padding"] == "max_length"  # BlockBERT's layout depends on N: every input padded to 128
    assert bb["train_tokens"] == 16 * 3 * 128
    assert mnli["cells"]["blockbert"]["compute"]["train_tokens"] == bb["train_tokens"]
    md = (out / "table.md").read_text()
    assert "| task | metric | dense | blockbert |" in md
    assert "**Narrowed sweep, not the protocol's:**" in md
    m = mnli["cells"]["dense"]["median"]
    assert f"| MNLI (m/mm) | accuracy | {m['validation_matched']['accuracy']:.1f}/" in md
    assert "| STS-B | spearman |" in md
    assert "GLUE average" in md  # the paper's suite, shown as "-" where columns are missing
    assert "lr 5e-05, bs 32, wd 0.01, 3 ep;" in md


# ------------------------------------------------------------------------------------------------ SQuAD 2.0
def _squad2(root: Path, words: list[str], n_train: int, n_dev: int) -> Path:
    """SQuAD v2.0 JSON: the answer is the word after the first marker; no marker -> unanswerable (is_impossible,
    with plausible_answers as the official files have)."""
    rng = random.Random(1)

    def article(n: int, prefix: str) -> dict:
        paragraphs = []
        for i in range(n):
            ws = rng.sample(words[3:], 8)
            answerable = i % 3 != 2
            if answerable:
                k = rng.randrange(7)
                ws.insert(k, words[0])
                answer = ws[k + 1]
            context = " ".join(ws)
            qa = {"id": f"{prefix}{i}", "question": f"{words[1]} {words[2]} ?"}
            if answerable:
                start = context.index(f"{words[0]} {answer}") + len(words[0]) + 1
                qa.update(answers=[{"text": answer, "answer_start": start}], is_impossible=False)
            else:
                qa.update(answers=[], is_impossible=True,
                          plausible_answers=[{"text": ws[0], "answer_start": 0}])  # fmt: skip
            paragraphs.append({"context": context, "qas": [qa]})
        return {"version": "v2.0", "data": [{"title": "toy", "paragraphs": paragraphs}]}

    root.mkdir(parents=True)
    (root / "train-v2.0.json").write_text(json.dumps(article(n_train, "t")))
    (root / "dev-v2.0.json").write_text(json.dumps(article(n_dev, "d")))
    return root


def test_blockbert_squad2_end_to_end(tmp_path, exports, words, capsys):
    """The SQuAD 2.0 command on both exports (custom-code BlockBERT at its N, windows of stride 128): the row shows
    the best-threshold EM/F1, table.json the official v2.0 breakdown, recomputed from the kept text and null odds."""
    from tools.evaluate.data import load_split
    from tools.evaluate.examples import QAPredictions
    from tools.evaluate.metrics import score

    data, out = _squad2(tmp_path / "squad", words, 12, 9), tmp_path / "out"
    argv = ["--protocol", "blockbert", "--suite", "squad2", *_models(exports), "--data-dir", str(data),
            "--output-dir", str(out), "--lr", "5e-5", "--batch-size", "16", "--seeds", "1", "--epochs", "4",
            "--device", "cpu", "--precision", "fp32"]  # fmt: skip
    printed = _run(argv, capsys)
    assert "2 runs now" in printed and "| SQuAD v2.0 | best_exact/best_f1 |" in printed
    report = json.loads((out / "table.json").read_text())
    assert report["narrowed"] == ["squad2: 1 of 10 grid points", "squad2: seeds 1 of 1 2 3"]
    (row,) = report["tasks"]
    assert row["table_metric"] == "best_f1"
    dev = load_split("squad2", data, "validation")
    assert sum(ex.is_impossible for ex in dev) == 3
    md = (out / "table.md").read_text()
    for tag in ("dense", "blockbert"):
        cell = row["cells"][tag]
        kept = json.loads((_kept(out, tag, "squad2") / "predictions_validation.json").read_text())
        want = score("squad2", dev, QAPredictions(kept["text"], kept["null_odds"]))
        got = cell["median"]["validation"]
        assert got == pytest.approx(want)
        for k in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_f1"):
            assert k in got
        assert got["best_f1"] >= got["f1"] - 1e-9  # the threshold is picked on this dev set
        assert f"{got['best_exact']:.1f}/{got['best_f1']:.1f} [" in md
        assert cell["compute"]["train_tokens"] > 0 and cell["compute"]["train_seconds"] > 0
        result = json.loads((_kept(out, tag, "squad2") / "result.json").read_text())
        assert result["info"]["max_length"] == MAXPOS  # the checkpoint's N
    assert "| task | metric | dense | blockbert |" in md and "**Narrowed sweep" in md
    assert "lr 5e-05, bs 16, wd 0.01, 4 ep;" in md and "tok per run; 1 run, " in md


# ------------------------------------------------------------------------------------------------------ MRQA
def _mrqa(root: Path, words: list[str], datasets: dict[str, str], n: int) -> Path:
    """MRQA's released layout: <split>/<Dataset>.jsonl.gz, a header line, then contexts with their qas (answers
    aliases, detected_answers' inclusive char_spans)."""
    rng = random.Random(2)
    for split in ("train", "dev"):
        (root / split).mkdir(parents=True)
        for file, name in datasets.items():
            lines = [json.dumps({"header": {"dataset": name, "split": split}})]
            for i in range(n):
                ws = rng.sample(words[3:], 8)
                k = rng.randrange(7)
                ws.insert(k, words[0])
                answer = ws[k + 1]
                context = " ".join(ws)
                s = context.index(f"{words[0]} {answer}") + len(words[0]) + 1
                det = {"text": answer, "char_spans": [[s, s + len(answer) - 1]], "token_spans": [[k + 1, k + 1]]}
                qa = {"qid": f"{name}-{split}-{i}", "question": f"{words[1]} ?", "answers": [answer, answer.upper()],
                      "detected_answers": [det]}  # fmt: skip
                lines.append(json.dumps({"id": f"c{i}", "context": context, "qas": [qa]}))
            with gzip.open(root / split / f"{file}.jsonl.gz", "wt") as f:
                f.write("\n".join(lines) + "\n")
    return root


@pytest.mark.extended  # ~15 s CPU (4 QA fine-tunings); the same command path as squad2, MRQA's reader in test_eval_data
def test_blockbert_mrqa_two_datasets(tmp_path, exports, words, capsys):
    """The MRQA command on two of its datasets: one row per dataset with its own EM/F1, recomputed from the kept
    predictions; no MRQA average over fewer datasets than the paper's."""
    from tools.evaluate.data import load_split
    from tools.evaluate.examples import QAPredictions
    from tools.evaluate.metrics import score

    data = _mrqa(tmp_path / "mrqa", words, {"SearchQA": "SearchQA", "TriviaQA-web": "TriviaQA-web"}, 10)
    out = tmp_path / "out"
    argv = ["--protocol", "blockbert", "--suite", "mrqa", *_models(exports), "--data-dir", str(data),
            "--output-dir", str(out), "--tasks", "mrqa_searchqa", "mrqa_triviaqa", "--lr", "5e-5", "--batch-size",
            "16", "--seeds", "1", "--limit-train", "8", "--limit-eval", "6", "--device", "cpu", "--precision",
            "fp32"]  # fmt: skip
    printed = _run(argv, capsys)
    assert "4 runs now" in printed
    report = json.loads((out / "table.json").read_text())
    assert [r["task"] for r in report["tasks"]] == ["mrqa_searchqa", "mrqa_triviaqa"]
    assert report["narrowed"][0].startswith("mrqa: only mrqa_searchqa, mrqa_triviaqa of ")
    md = (out / "table.md").read_text()
    for row in report["tasks"]:
        dev = load_split(row["task"], data, "validation", limit=6)
        assert len({ex.dataset for ex in dev}) == 1
        for tag in ("dense", "blockbert"):
            kept = json.loads((_kept(out, tag, row["task"]) / "predictions_validation.json").read_text())
            want = score(row["task"], dev, QAPredictions(kept["text"], kept["null_odds"]))
            got = row["cells"][tag]["median"]["validation"]
            assert got == pytest.approx(want) and set(got) >= {"exact", "f1"}
            assert f"{got['exact']:.1f}/{got['f1']:.1f} [" in md
    assert "| task | metric | dense | blockbert |" in md
    assert "| exact/f1 |" in md
