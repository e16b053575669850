"""tools/evaluate/data.py and tasks.py: every supported layout read from small files written here (GLUE's TSV
directories with their quirks, HF ``datasets`` parquet and save_to_disk exports written by ``datasets`` itself,
SWAG's CSV, SQuAD v1.1/v2.0 JSON, MRQA jsonl.gz, XNLI), the bad-input errors, and the registry's GLUE average
against the papers' printed averages (issue #54)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from common.errors import UserError
from tools.evaluate import data as D
from tools.evaluate.examples import KINDS, ChoiceExample, QAExample, TextExample
from tools.evaluate.tasks import SUITES, TASKS, columns, suite_average

REPO = Path(__file__).resolve().parents[1]


def _tsv(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


MNLI_HEAD = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
             "sentence2_parse\tsentence1\tsentence2")  # fmt: skip


def _glue(root: Path) -> Path:
    """A GLUE directory as the official download script lays it out, two or three lines a file."""
    _tsv(root / "CoLA/dev.tsv", ["gj04\t1\t\tOur friends won't buy this analysis.",
                                 "gj04\t0\t*\tThey drank the pub."])  # fmt: skip
    _tsv(root / "CoLA/train.tsv", ['cj99\t1\t\tA "quoted" sentence.'])
    # stray quotes: a field that starts with one must not swallow the next lines
    _tsv(root / "SST-2/dev.tsv", ["sentence\tlabel", "\" the movie 's charm\t1", 'it \'s "charming" .\t0'])
    _tsv(root / "SST-2/train.tsv", ["sentence\tlabel", "fine\t1"])
    mrpc = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t702876\t702977\tHe said.\tHe stated.",
            "0\t2108705\t2108831\tYes.\tNo .",
            '1\t1355540\t1355592\tHe said it doesn \'t fit .\t" The pie business won\'t fit .']  # fmt: skip
    _tsv(root / "MRPC/dev.tsv", mrpc)
    _tsv(root / "MRPC/train.tsv", mrpc)
    _tsv(
        root / "STS-B/dev.tsv",
        [
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
            "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man.\tA guy.\t5.000",
        ],
    )
    _tsv(root / "QQP/dev.tsv", ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "1\t1\t2\tWhy?\tHow?\t0"])
    for name, extra in (("dev_matched", "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"),
                        ("dev_mismatched", "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"),
                        ("train", "\tlabel1\tgold_label")):  # fmt: skip
        n = extra.count("\t")
        rows = [
            f"{i}\t1\t1e\tgov\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tP{name}{i}\tH{name}{i}" + "\t".join([""] + [lab] * n)
            for i, lab in enumerate(("neutral", "contradiction", "entailment"))
        ]
        _tsv(root / f"MNLI/{name}.tsv", [MNLI_HEAD + extra, *rows])
    _tsv(root / "QNLI/dev.tsv", ["index\tquestion\tsentence\tlabel", "0\tWho?\tHim.\tnot_entailment"])
    _tsv(root / "RTE/dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tA b.\tA.\tentailment"])
    _tsv(root / "WNLI/dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tI.\tYou.\t1"])
    return root


def test_glue_tsv_every_task_with_its_quirks(tmp_path):
    root = _glue(tmp_path / "glue_data")
    cola = D.load_split("cola", root, "validation")
    assert cola == [TextExample("cola-validation-0", "Our friends won't buy this analysis.", None, 1),
                    TextExample("cola-validation-1", "They drank the pub.", None, 0)]  # fmt: skip
    assert D.load_split("cola", root, "train")[0].text_a == 'A "quoted" sentence.'
    sst = D.load_split("sst2", root, "validation")
    assert [(e.text_a, e.label) for e in sst] == [("\" the movie 's charm", 1), ('it \'s "charming" .', 0)]
    mrpc = D.load_split("mrpc", root, "validation")  # the header's byte-order mark is not part of "Quality"
    assert [(e.text_a, e.text_b, e.label) for e in mrpc][:2] == [("He said.", "He stated.", 1), ("Yes.", "No .", 0)]
    assert mrpc[2].text_b == "\" The pie business won't fit ." and len(mrpc) == 3  # MRPC's own stray quote
    assert D.load_split("stsb", root, "validation")[0] == TextExample("stsb-validation-0", "A man.", "A guy.", 5.0)
    assert D.load_split("qqp", root, "validation")[0].label == 0
    for split in ("train", "validation_matched", "validation_mismatched"):
        mnli = D.load_split("mnli", root, split)
        tag = {"train": "train", "validation_matched": "dev_matched", "validation_mismatched": "dev_mismatched"}[split]
        assert [(e.text_a, e.text_b, e.label) for e in mnli] == [(f"P{tag}{i}", f"H{tag}{i}", lab)
                                                                 for i, lab in enumerate((1, 2, 0))]  # fmt: skip
    assert D.load_split("qnli", root, "validation")[0].label == TASKS["qnli"].label_names.index("not_entailment")
    assert D.load_split("rte", root, "validation")[0].label == 0
    assert D.load_split("wnli", root, "validation")[0].label == TASKS["wnli"].label_names.index("entailment")
    assert len(D.load_split("mnli", root, "train", limit=2)) == 2
    assert D.load_split("cola", root / "CoLA", "validation") == cola  # --data-dir may be the task's own directory


def test_probe_tasks_read_mrpc_and_sst2_layouts(tmp_path):
    _tsv(tmp_path / "probe_pair/dev.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\ta\tb\tOne.\tTwo."])
    _tsv(tmp_path / "probe_single/train.tsv", ["sentence\tlabel", "Some held-out text.\t0"])
    assert D.load_split("probe_pair", tmp_path, "validation") == [TextExample("probe_pair-validation-0", "One.",
                                                                              "Two.", 1)]  # fmt: skip
    assert D.load_split("probe_single", tmp_path, "train")[0].text_a == "Some held-out text."


@pytest.mark.parametrize(
    "path, lines, message",
    [
        ("RTE/dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tentailment", "1\tcut line"],
         r"RTE/dev.tsv:3: 2 tab-separated field\(s\), rte needs at least 4"),
        ("RTE/dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tmaybe"],
         r"RTE/dev.tsv:2: label 'maybe' is not one of rte's labels"),
        ("RTE/dev.tsv", ["index\tpremise\thypothesis\tlabel", "0\tA.\tB.\tentailment"],
         r"RTE/dev.tsv:1: no column 'sentence1' in the header"),
        ("STS-B/dev.tsv", ["sentence1\tsentence2\tscore", "A.\tB.\thigh"], r"STS-B/dev.tsv:2: label 'high' is not a"),
        ("CoLA/dev.tsv", ["gj04\t1\tsentence without the fourth field"], r"CoLA/dev.tsv:1: 3 tab-separated"),
        ("RTE/dev.tsv", ["index\tsentence1\tsentence2\tlabel"], r"RTE/dev.tsv: holds no examples; re-extract"),
    ],
)  # fmt: skip
def test_malformed_tsv_names_file_and_line(tmp_path, path, lines, message):
    _tsv(tmp_path / path, lines)
    task = {"RTE": "rte", "STS-B": "stsb", "CoLA": "cola"}[path.split("/")[0]]
    with pytest.raises(D.DataError, match=message) as e:
        D.load_split(task, tmp_path, "validation")
    assert isinstance(e.value, UserError) and ("re-extract" in str(e.value) or "fix" in str(e.value)
                                               or "official" in str(e.value))  # fmt: skip


def test_missing_task_and_bad_arguments_are_one_clear_error(tmp_path):
    with pytest.raises(D.DataError, match=r"task mrpc, split validation: no data found under .*MRPC/dev.tsv.*"
                                          r"docs/evaluation_data.md"):  # fmt: skip
        D.load_split("mrpc", tmp_path, "validation")
    with pytest.raises(D.DataError, match="no such directory"):
        D.load_split("mrpc", tmp_path / "absent", "validation")
    with pytest.raises(D.DataError, match="task mnli has no split 'validation'; choose one of: train, "
                                          "validation_matched, validation_mismatched"):  # fmt: skip
        D.load_split("mnli", tmp_path, "validation")
    with pytest.raises(UserError, match="unknown task 'glue'"):
        D.load_split("glue", tmp_path, "validation")
    with pytest.raises(D.DataError, match="SQuAD/dev-v2.0.json|dev-v2.0.json"):
        D.load_split("squad2", tmp_path, "validation")
    with pytest.raises(D.DataError, match=r"MRQA.*NewsQA.jsonl"):
        D.load_split("mrqa_newsqa", tmp_path, "validation")


# ------------------------------------------------------------------------------------------ Hugging Face exports
def test_hf_parquet_and_save_to_disk_read_as_the_tsv(tmp_path):
    """``datasets`` writes the Hub's parquet layout (glue/<config>/<split>-*.parquet) and save_to_disk directories;
    they read as the same examples as GLUE's TSVs (ClassLabel order = ours), and a foreign label order is refused."""
    datasets = pytest.importorskip("datasets")
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    nli = Features({"premise": Value("string"), "hypothesis": Value("string"), "idx": Value("int32"),
                    "label": ClassLabel(names=list(TASKS["mnli"].label_names))})  # fmt: skip
    rows = {"premise": ["P0", "P1", "P2"], "hypothesis": ["H0", "H1", "H2"], "idx": [0, 1, 2], "label": [1, 2, 0]}
    DatasetDict({s: Dataset.from_dict(rows, features=nli) for s in ("train", "validation_matched")}).save_to_disk(
        str(tmp_path / "glue" / "mnli")
    )
    got = D.load_split("mnli", tmp_path, "validation_matched")
    assert [(e.text_a, e.text_b, e.label) for e in got] == [("P0", "H0", 1), ("P1", "H1", 2), ("P2", "H2", 0)]
    assert len(D.load_split("mnli", tmp_path, "train", limit=2)) == 2

    cola = Features({"sentence": Value("string"), "label": ClassLabel(names=["unacceptable", "acceptable"]),
                     "idx": Value("int32")})  # fmt: skip
    d = tmp_path / "glue" / "cola"
    Dataset.from_dict({"sentence": ["Good.", "Bad it."], "label": [1, 0], "idx": [0, 1]}, features=cola).to_parquet(
        str(d / "validation-00000-of-00001.parquet")
    )
    Dataset.from_dict({"sentence": ["Test."], "label": [-1], "idx": [0]}, features=cola).to_parquet(
        str(d / "train-00000-of-00001.parquet")
    )
    assert [(e.text_a, e.label) for e in D.load_split("cola", tmp_path, "validation")] == [("Good.", 1), ("Bad it.", 0)]
    assert D.load_split("cola", tmp_path, "train")[0].label is None  # -1: unlabelled

    stsb = tmp_path / "glue" / "stsb" / "validation"
    stsb.mkdir(parents=True)  # refs/convert/parquet's layout: <config>/<split>/0000.parquet
    Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [3.8]}).to_parquet(str(stsb / "0000.parquet"))
    assert D.load_split("stsb", tmp_path, "validation") == [TextExample("stsb-validation-0", "a", "b", 3.8)]

    wrong = Features({"sentence1": Value("string"), "sentence2": Value("string"),
                      "label": ClassLabel(names=["not_entailment", "entailment"])})  # fmt: skip
    Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [0]}, features=wrong).to_parquet(
        str(tmp_path / "glue" / "rte" / "validation-00000-of-00001.parquet")
    )
    with pytest.raises(D.DataError, match=r"label names \['not_entailment', 'entailment'\] are not rte's"):
        D.load_split("rte", tmp_path, "validation")
    assert datasets.load_from_disk(str(tmp_path / "glue" / "mnli"))["train"].num_rows == 3  # the real layout


def test_hf_squad_and_swag_exports(tmp_path):
    pytest.importorskip("datasets")
    from datasets import Dataset

    sq = {"id": ["q1", "q2"], "title": ["t", "t"], "context": ["Paris is in France.", "x"],
          "question": ["Where?", "Unanswerable?"],
          "answers": [{"text": ["France"], "answer_start": [12]}, {"text": [], "answer_start": []}]}  # fmt: skip
    Dataset.from_dict(sq).save_to_disk(str(tmp_path / "squad_v2" / "squad_v2" / "validation"))
    got = D.load_split("squad2", tmp_path, "validation")
    assert got == [QAExample("q1", "Where?", "Paris is in France.", ("France",), (12,)),
                   QAExample("q2", "Unanswerable?", "x", (), (), True)]  # fmt: skip
    sw = {"sent1": ["A man sits."], "sent2": ["He"], **{f"ending{k}": [f"e{k}"] for k in range(4)}, "label": [2],
          "video-id": ["v"], "fold-ind": ["1"], "startphrase": ["A man sits. He"], "gold-source": ["gold"]}  # fmt: skip
    Dataset.from_dict(sw).to_parquet(str(tmp_path / "swag" / "regular" / "validation-00000-of-00001.parquet"))
    assert D.load_split("swag", tmp_path, "validation") == [ChoiceExample("swag-validation-0", "A man sits.", "He",
                                                                          ("e0", "e1", "e2", "e3"), 2)]  # fmt: skip


def test_hf_xnli_one_config_per_language(tmp_path):
    pytest.importorskip("datasets")
    from datasets import ClassLabel, Dataset, Features, Value

    feats = Features({"premise": Value("string"), "hypothesis": Value("string"),
                      "label": ClassLabel(names=list(TASKS["xnli"].label_names))})  # fmt: skip

    def export(lang: str) -> None:
        rows = {"premise": [f"{lang} p"], "hypothesis": [f"{lang} h"], "label": [2]}
        Dataset.from_dict(rows, features=feats).to_parquet(str(tmp_path / "xnli" / lang / "validation-0.parquet"))

    export("de")
    assert D.load_split("xnli", tmp_path, "validation_de") == [TextExample("xnli-validation_de-0", "de p", "de h", 2)]
    with pytest.raises(D.DataError, match=r"no validation split for ar, bg, el, en,.* pools all 15 languages"):
        D.load_split("xnli", tmp_path, "validation")
    for lang in D.XNLI_LANGUAGES:
        export(lang)
    pooled = D.load_split("xnli", tmp_path, "validation")
    assert [e.text_a for e in pooled] == [f"{lang} p" for lang in D.XNLI_LANGUAGES]
    assert len({e.id for e in pooled}) == 15 and len(D.load_split("xnli", tmp_path, "validation", limit=3)) == 3


def test_hf_mrqa_export_rows_of_one_subset(tmp_path):
    """The Hub's mrqa: every dataset in one table told apart by `subset`; detected_answers a struct of lists."""
    pytest.importorskip("datasets")
    from datasets import Dataset, Features, Sequence, Value

    span = Sequence({"start": Value("int32"), "end": Value("int32")})
    tokens = Sequence({"tokens": Value("string"), "offsets": Value("int32")})
    feats = Features({"subset": Value("string"), "context": Value("string"), "context_tokens": tokens,
                      "qid": Value("string"), "question": Value("string"), "question_tokens": tokens,
                      "detected_answers": Sequence({"text": Value("string"), "char_spans": span, "token_spans": span}),
                      "answers": Sequence(Value("string"))})  # fmt: skip
    ctx = "The Eiffel tower is in paris, France."
    det = {"text": ["Paris"], "char_spans": [{"start": [23], "end": [27]}], "token_spans": [{"start": [5], "end": [5]}]}
    rows = [{"subset": s, "context": ctx, "context_tokens": {"tokens": [], "offsets": []}, "qid": f"{s}-q",
             "question": "Where?", "question_tokens": {"tokens": [], "offsets": []}, "detected_answers": det,
             "answers": ["Lutetia", "Paris"]} for s in ("SQuAD", "NewsQA")]  # fmt: skip
    Dataset.from_list(rows, features=feats).to_parquet(str(tmp_path / "mrqa" / "validation-00000-of-00001.parquet"))
    assert D.load_split("mrqa_newsqa", tmp_path, "validation") == [
        QAExample("NewsQA-q", "Where?", ctx, ("Paris", "Lutetia"), (23, -1), False)
    ]
    assert D.load_split("mrqa_squad", tmp_path, "validation")[0].dataset == "SQuAD"
    with pytest.raises(D.DataError, match=r"no rows of HotpotQA \(its subsets: NewsQA, SQuAD\)"):
        D.load_split("mrqa_hotpotqa", tmp_path, "validation")


# ---------------------------------------------------------------------------------------- SWAG, SQuAD, MRQA, XNLI
def test_swag_csv(tmp_path):
    path = tmp_path / "SWAG" / "val.csv"
    path.parent.mkdir()
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source", "ending0", "ending1",
                    "ending2", "ending3", "label"])  # fmt: skip
        w.writerow(
            [0, "lsmdc", "5", "x", 'She says "hi", then', "she", "gold", "leaves.", "sits, smiling.", "c", "d", 1]
        )
        w.writerow([1, "anetv", "6", "y", "A man", "he", "gen", "a", "b", "c", "d", 3])
    got = D.load_split("swag", tmp_path, "validation")
    assert got[0] == ChoiceExample("swag-validation-0", 'She says "hi", then', "she",
                                   ("leaves.", "sits, smiling.", "c", "d"), 1)  # fmt: skip
    assert [e.label for e in got] == [1, 3] and len(D.load_split("swag", tmp_path, "validation", limit=1)) == 1
    path.write_text(path.read_text().replace(",3\n", ",7\n"))
    with pytest.raises(D.DataError, match=r"val.csv:3: label '7' is not 0..3"):
        D.load_split("swag", tmp_path, "validation")


def _squad(version: str) -> dict:
    qas = [{"id": "a1", "question": "Who won?", "answers": [{"text": "Denver Broncos", "answer_start": 0},
                                                           {"text": "Broncos", "answer_start": 7}]}]  # fmt: skip
    if version == "v2.0":
        qas[0]["is_impossible"] = False
        qas.append({"id": "a2", "question": "Who lost badly?", "answers": [], "is_impossible": True,
                    "plausible_answers": [{"text": "Carolina", "answer_start": 27}]})  # fmt: skip
    return {"version": version, "data": [{"title": "SB50", "paragraphs": [
        {"context": "Denver Broncos beat the Carolina Panthers.", "qas": qas}]}]}  # fmt: skip


def test_squad_v1_and_v2_official_json(tmp_path):
    (tmp_path / "SQuAD").mkdir()
    (tmp_path / "SQuAD" / "dev-v1.1.json").write_text(json.dumps(_squad("v1.1")))
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(_squad("v2.0")))
    ctx = "Denver Broncos beat the Carolina Panthers."
    v1 = D.load_split("squad1", tmp_path, "validation")
    assert v1 == [QAExample("a1", "Who won?", ctx, ("Denver Broncos", "Broncos"), (0, 7))]
    v2 = D.load_split("squad2", tmp_path, "validation")
    assert v2[1] == QAExample("a2", "Who lost badly?", ctx, (), (), True)  # plausible_answers are never gold
    assert v2[0].dataset == "squad2" and not v2[0].is_impossible
    (tmp_path / "SQuAD" / "dev-v1.1.json").write_text(json.dumps(_squad("v2.0")))
    with pytest.raises(D.DataError, match="unanswerable.*use task squad2"):
        D.load_split("squad1", tmp_path, "validation")
    (tmp_path / "dev-v2.0.json").write_text('{"data": [\n{"title": "x",, }]}')
    with pytest.raises(D.DataError, match=r"dev-v2.0.json:2: not valid JSON"):
        D.load_split("squad2", tmp_path, "validation")
    (tmp_path / "dev-v2.0.json").write_text(json.dumps({"data": [{"paragraphs": [{"context": "c", "qas": [{}]}]}]}))
    with pytest.raises(D.DataError, match=r"data\[0\].paragraphs\[0\].qas\[0\]: missing or malformed field 'answers'"):
        D.load_split("squad2", tmp_path, "validation")


def _mrqa(path: Path, lines: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for obj in lines:
            f.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")


def test_mrqa_jsonl_gz(tmp_path):
    ctx = "The Eiffel tower is in paris, France."
    para = {
        "id": "p1",
        "context": ctx,
        "context_tokens": [],
        "qas": [
            {
                "qid": "q1",
                "question": "Where?",
                "question_tokens": [],
                "answers": ["Lutetia", "Paris", "France"],
                "detected_answers": [
                    {"text": "Paris", "char_spans": [[23, 27]], "token_spans": [[5, 5]]},
                    {"text": "France", "char_spans": [[30, 35]], "token_spans": [[7, 7]]},
                ],
            },
            {
                "qid": "q2",
                "question": "What?",
                "question_tokens": [],
                "answers": ["Eiffel tower"],
                "detected_answers": [{"text": "Eiffel tower", "char_spans": [[4, 15]], "token_spans": [[1, 2]]}],
            },
        ],
    }
    _mrqa(tmp_path / "MRQA" / "dev" / "NewsQA.jsonl.gz", [{"header": {"dataset": "NewsQA", "split": "dev"}}, para])
    got = D.load_split("mrqa_newsqa", tmp_path, "validation")
    # every `answers` alias is gold; located ones first, at their detected span (case-insensitive), -1 if absent
    assert got[0] == QAExample("q1", "Where?", ctx, ("Paris", "France", "Lutetia"), (23, 30, -1), False)
    assert got[0].dataset == "NewsQA" and got[1].starts == (4,) and ctx[4:16] == "Eiffel tower"
    assert len(D.load_split("mrqa_newsqa", tmp_path, "validation", limit=1)) == 1
    _mrqa(tmp_path / "dev" / "NaturalQuestions.jsonl.gz", [{"header": {"dataset": "NaturalQuestionsShort"}}, para])
    assert D.load_split("mrqa_naturalquestions", tmp_path, "validation")[1].dataset == "NaturalQuestionsShort"
    _mrqa(tmp_path / "MRQA" / "train" / "NewsQA.jsonl.gz", [{"header": {"dataset": "NewsQA"}}, para, "{not json"])
    with pytest.raises(D.DataError, match=r"train/NewsQA.jsonl.gz:3: not a JSON line"):
        D.load_split("mrqa_newsqa", tmp_path, "train")
    _mrqa(tmp_path / "MRQA" / "train" / "NewsQA.jsonl.gz", [{"header": {}}, {"context": "c", "qas": [{"qid": 1}]}])
    with pytest.raises(D.DataError, match=r"NewsQA.jsonl.gz:2: missing or malformed field 'question'"):
        D.load_split("mrqa_newsqa", tmp_path, "train")


def test_xnli_dev_per_language_and_mnli_train(tmp_path):
    head = "language\tgold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\t" \
           "sentence1\tsentence2\tpromptID\tpairID\tgenre"  # fmt: skip
    rows = [f"{lang}\t{lab}\t\t\t\t\t{lang} p\t{lang} h\t1\t1\tfacetoface"
            for lang, lab in (("de", "neutral"), ("en", "entailment"), ("de", "contradiction"))]  # fmt: skip
    _tsv(tmp_path / "XNLI-1.0" / "xnli.dev.tsv", [head, *rows])
    _glue(tmp_path)
    assert [e.label for e in D.load_split("xnli", tmp_path, "validation")] == [1, 0, 2]
    with pytest.raises(D.DataError, match=r"xnli.dev.tsv: holds no rows of language 'sw'"):
        D.load_split("xnli", tmp_path, "validation_sw")
    de = D.load_split("xnli", tmp_path, "validation_de")
    assert [(e.text_a, e.label) for e in de] == [("de p", 1), ("de p", 2)]
    train = D.load_split("xnli", tmp_path, "train")
    assert [(e.text_a, e.label) for e in train] == [
        (e.text_a, e.label) for e in D.load_split("mnli", tmp_path, "train")
    ]


# Every registered task in its official layout, written from the official files' own headers (independent of the
# reader's layout table): GLUE's download, XNLI 1.0, swagaf, SQuAD, MRQA's released file names
OFFICIAL = {
    "cola": ("CoLA", None, "src\t{y}\t\t{a}"),
    "sst2": ("SST-2", "sentence\tlabel", "{a}\t{y}"),
    "mrpc": ("MRPC", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "{y}\t1\t2\t{a}\t{b}"),
    "stsb": ("STS-B", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
             "0\tg\tf\t2012\t0\tn\tn\t{a}\t{b}\t{y}"),
    "qqp": ("QQP", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "0\t1\t2\t{a}\t{b}\t{y}"),
    "mnli": ("MNLI", MNLI_HEAD + "\tlabel1\tgold_label", "0\t1\t1e\tgov\t\t\t\t\t{a}\t{b}\t{y}\t{y}"),
    "qnli": ("QNLI", "index\tquestion\tsentence\tlabel", "0\t{a}\t{b}\t{y}"),
    "rte": ("RTE", "index\tsentence1\tsentence2\tlabel", "0\t{a}\t{b}\t{y}"),
    "wnli": ("WNLI", "index\tsentence1\tsentence2\tlabel", "0\t{a}\t{b}\t{y}"),
    "probe_pair": ("probe_pair", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "{y}\t1\t2\t{a}\t{b}"),
    "probe_single": ("probe_single", "sentence\tlabel", "{a}\t{y}"),
}  # fmt: skip
TSV_FILE = {"train": "train.tsv", "validation": "dev.tsv", "validation_matched": "dev_matched.tsv",
            "validation_mismatched": "dev_mismatched.tsv"}  # fmt: skip
MRQA_FILES = {"mrqa_squad": "SQuAD", "mrqa_newsqa": "NewsQA", "mrqa_triviaqa": "TriviaQA-web",
              "mrqa_searchqa": "SearchQA", "mrqa_hotpotqa": "HotpotQA",
              "mrqa_naturalquestions": "NaturalQuestionsShort"}  # fmt: skip


def _write_official(root: Path, name: str, split: str) -> None:
    t = TASKS[name]
    if name in OFFICIAL:
        d, head, row = OFFICIAL[name]
        y = "2.5" if t.kind == "regression" else t.label_names[-1]
        _tsv(root / d / TSV_FILE[split], ([head] if head else []) + [row.format(a="A x.", b="B y.", y=y)])
    elif name == "xnli":
        head = "language\tgold_label\ts1bp\ts2bp\ts1p\ts2p\tsentence1\tsentence2\tpromptID\tpairID\tgenre"
        f = {"validation": "xnli.dev.tsv", "test": "xnli.test.tsv"}.get(split)
        if f is None:
            return _write_official(root, "mnli", "train")
        _tsv(root / "XNLI" / f, [head, "en\tcontradiction\t\t\t\t\tA x.\tB y.\t1\t1\tfiction"])
    elif name == "swag":
        f = {"train": "train.csv", "validation": "val.csv"}[split]
        _tsv(root / "swagaf" / "data" / f, [",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,"
                                           "ending2,ending3,label", "0,v,1,A x. B,A x.,B,gold,a,b,c,y.,3"])  # fmt: skip
    elif t.suite in ("squad1", "squad2"):
        v = "v2.0" if t.with_negative else "v1.1"
        doc = _squad(v)
        doc["data"][0]["paragraphs"][0]["qas"] = doc["data"][0]["paragraphs"][0]["qas"][-1:]
        (root / f"{'train' if split == 'train' else 'dev'}-{v}.json").write_text(json.dumps(doc))
    else:
        q = {
            "qid": "q",
            "question": "B y?",
            "answers": ["x"],
            "detected_answers": [{"text": "x", "char_spans": [[2, 2]]}],
        }
        sub = "train" if split == "train" else "dev"
        _mrqa(root / sub / f"{MRQA_FILES[name]}.jsonl.gz", [{"header": {"dataset": MRQA_FILES[name]}},
                                                            {"context": "A x.", "qas": [q]}])  # fmt: skip


@pytest.mark.parametrize("name", list(TASKS))
def test_every_registered_task_reads_its_official_layout(tmp_path, name):
    t = TASKS[name]
    for split in ("train", *t.eval_splits):
        _write_official(tmp_path, name, split)
        (ex,) = D.load_split(name, tmp_path, split)
        if t.kind in ("classification", "regression"):
            assert (ex.text_a, ex.label) == ("A x.", 2.5 if t.kind == "regression" else len(t.label_names) - 1)
            assert ex.text_b == (None if name in ("cola", "sst2", "probe_single") else "B y.")
        elif t.kind == "multiple_choice":
            assert (ex.context, ex.prefix, ex.endings, ex.label) == ("A x.", "B", ("a", "b", "c", "y."), 3)
        elif t.suite == "mrqa":
            assert (ex.answers, ex.starts, ex.dataset) == (("x",), (2,), MRQA_FILES[name])
        else:
            assert ex.is_impossible == t.with_negative and bool(ex.answers) != t.with_negative


# ----------------------------------------------------------------------------------------------------- registry
def test_registry_is_consistent_and_every_task_has_a_layout():
    assert all(t in TASKS for suite in SUITES.values() for t in suite)
    for t in TASKS.values():
        assert t.kind in KINDS and t.table_metric in t.metrics and D.layouts_text(t), t.name
        assert t.suite in SUITES and (t.name in SUITES[t.suite] or t.name == "wnli")
    assert TASKS["swag"].num_choices == 4 and TASKS["squad2"].with_negative and not TASKS["squad1"].with_negative


# SparseBERT Table 1 (dev and test) and Table 3 rows, as printed: MNLI-m, MNLI-mm, QQP, QNLI, SST-2, CoLA, STS-B,
# MRPC, RTE, and the printed average (the first row: 83.79 as nine columns, 83.56 with MNLI as one)
PAPER_ROWS = [
    (85.4, 85.8, 88.2, 91.5, 92.9, 62.1, 88.8, 90.4, 69.0, 83.8),
    (84.6, 85.2, 87.7, 91.1, 92.7, 62.0, 88.9, 89.3, 68.9, 83.4),
    (84.6, 83.4, 71.2, 90.5, 93.5, 52.1, 85.8, 88.9, 66.4, 79.6),
    (85.5, 84.9, 71.3, 91.1, 93.4, 53.3, 86.3, 88.9, 67.9, 80.3),
    (81.9, 81.9, 87.1, 89.0, 91.7, 58.4, 86.6, 86.1, 52.7, 79.5),
    (80.5, 81.0, 86.8, 88.4, 91.8, 57.9, 86.9, 81.7, 65.3, 80.1),
    (82.2, 82.6, 87.3, 89.7, 92.4, 57.3, 86.5, 89.2, 70.8, 82.0),
]


@pytest.mark.parametrize("row", PAPER_ROWS)
def test_glue_average_reproduces_the_papers_printed_averages(row):
    scores = dict(zip(columns("glue"), row[:-1]))
    assert columns("glue")[:3] == ("mnli-m", "mnli-mm", "qqp")
    # the papers average unrounded scores: within 0.1 of the printed one (the other reading, MNLI's m/mm averaged
    # into one of eight columns, misses Table 1's 83.8 by 0.24)
    assert abs(suite_average("glue", scores) - row[-1]) <= 0.1 + 1e-9
    with pytest.raises(UserError, match="missing: rte"):
        suite_average("glue", {k: v for k, v in scores.items() if k != "rte"})


def test_docs_table_is_generated_from_the_registry():
    doc = (REPO / "docs" / "evaluation_data.md").read_text(encoding="utf-8")
    assert D.splice_docs(doc) == doc, (
        "docs/evaluation_data.md is stale: run `python -m tools.evaluate.data --write docs/evaluation_data.md`"
    )
    assert all(f"`{name}`" in D.docs_table() for name in TASKS)
