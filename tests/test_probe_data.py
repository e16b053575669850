"""tools.evaluate.probe_data: the probe tasks come from the held-out documents only (train/dev disjoint), read back
through evdata's GLUE TSV reader, are balanced, carry no length or word-count cue, and are reproducible."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tools.evaluate import probe_data as pd

WORDS = "river town bridge mill chapel market garden lantern ledger kettle harbour meadow orchard".split()


def _corpus(tmp_path: Path, docs: int = 40) -> Path:
    """JSON lines, one document per line; every sentence names its document and position (doc7 s3), so where an
    example came from is visible in its text."""
    path = tmp_path / "corpus" / "articles.jsonl"
    path.parent.mkdir()
    with open(path, "w") as f:
        for d in range(docs):
            n = 6 + d % 5
            sents = [
                f"The {WORDS[(d + i) % len(WORDS)]} of doc{d} s{i} stood near the {WORDS[(3 * d + i) % len(WORDS)]} "
                f"and the old {WORDS[(d * i) % len(WORDS)]}."
                for i in range(n)
            ]
            f.write(json.dumps({"title": f"Doc {d}", "text": " ".join(sents)}) + "\n")
    return path.parent


def _doc_of(text: str) -> int:
    return int(text.split("doc")[1].split()[0])


def _make(tmp_path: Path, out: str = "probe", **kw) -> dict:
    corpus = kw.pop("corpus", None) or _corpus(tmp_path)
    cfg = pd.ProbeDataConfig(corpus=[str(corpus)], output_dir=str(tmp_path / out), split="50,50,0", **kw)
    return pd.make_probes(cfg)


def test_held_out_documents_only_disjoint_and_read_by_the_glue_reader(tmp_path):
    from tools.evaluate.data import load_split
    from tools.evaluate.examples import TextExample

    m = _make(tmp_path)
    assert m["corpus_documents"] == 40 and m["held_out_documents"] == [20, 40]  # split 50,50,0: documents 20..39
    train_docs, dev_docs = set(m["train_documents"]), set(m["dev_documents"])
    assert not train_docs & dev_docs and train_docs | dev_docs == set(range(20, 40)) and len(dev_docs) == 7
    out = tmp_path / "probe"
    for task in ("probe_pair", "probe_single"):
        for split, docs in (("train", train_docs), ("validation", dev_docs)):
            exs = load_split(task, out, split)
            assert exs and all(isinstance(e, TextExample) for e in exs)
            texts = [e.text_a for e in exs] + [e.text_b for e in exs if e.text_b is not None]
            assert {_doc_of(t) for t in texts} <= docs  # never a training-range document, never the other split
            n = m["examples"][task]["train" if split == "train" else "dev"]
            assert len(exs) == n["total"] and sum(e.label == 1 for e in exs) == n["label_1"] == n["total"] // 2
            if task == "probe_pair":
                assert all(_doc_of(e.text_a) == _doc_of(e.text_b) for e in exs)  # a sentence and its twin
            else:
                assert all(e.text_b is None for e in exs)
    header = (out / "probe_pair" / "dev.tsv").read_text().splitlines()[0]
    assert header == "\t".join(pd.PAIR_HEADER) == "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"  # MRPC's
    assert (out / "probe_single" / "train.tsv").read_text().splitlines()[0] == "sentence\tlabel"  # SST-2's


def test_pairs_carry_no_cue_but_the_order(tmp_path):
    """Each pair is a held-out sentence and its shuffled twin (same words, same ends), in both orders; label 1 iff
    #1 is the sentence as written; every string occurs once under each label and once on each side."""
    from tools.evaluate.data import load_split

    m = _make(tmp_path)
    sentences = {s for d in pd.held_out_documents(pd.ProbeDataConfig(corpus=[str(tmp_path / "corpus")],
                 output_dir=str(tmp_path / "z"), split="50,50,0"))[0] for s in d.sentences}  # fmt: skip
    for split in ("train", "validation"):
        exs = load_split("probe_pair", tmp_path / "probe", split)
        rows = Counter()
        for e in exs:
            a, b = e.text_a.split(), e.text_b.split()
            assert sorted(a) == sorted(b) and a != b and a[0] == b[0] and a[-1] == b[-1]
            assert (e.text_a in sentences) == (e.label == 1) != (e.text_b in sentences)
            rows[(e.text_a, e.text_b, e.label)] += 1
        assert all(rows[(b, a, 1 - y)] == 1 for (a, b, y), n in rows.items() if n == 1)
        assert all(n == 1 for n in rows.values())
    assert m["examples"]["probe_pair"]["dev"]["total"] > 0


@pytest.mark.parametrize("window", [None, 3])
def test_shuffled_sentences_keep_words_length_and_ends(tmp_path, window):
    """None (the default): the inner words permuted (most of them move); 3: one window of 3 words permuted."""
    from tools.evaluate.data import load_split

    _make(tmp_path, window=window)
    exs = load_split("probe_single", tmp_path / "probe", "train")
    intact = {e.text_a for e in exs if e.label == 1}
    moved = []
    for e in exs:
        if e.label == 0:
            assert e.text_a not in intact
            original = next(t for t in intact if sorted(t.split()) == sorted(e.text_a.split()))
            w, o = e.text_a.split(), original.split()
            assert w[0] == o[0] and w[-1] == o[-1] and len(w) == len(o)
            diff = [k for k in range(len(w)) if w[k] != o[k]]
            assert 2 <= len(diff)
            if window is not None:
                assert diff[-1] - diff[0] < window
            moved.append(len(diff) / (len(w) - 2))
    if window is None:  # a full shuffle moves most inner words, not just a window's worth
        assert sum(moved) / len(moved) > 0.6


def test_same_seed_same_bytes_other_seed_other_files(tmp_path):
    corpus = _corpus(tmp_path)
    _make(tmp_path, "a", corpus=corpus)
    _make(tmp_path, "b", corpus=corpus)
    _make(tmp_path, "c", corpus=corpus, seed=7)
    for task in ("probe_pair", "probe_single"):
        for f in ("train.tsv", "dev.tsv"):
            a, b, c = ((tmp_path / d / task / f).read_bytes() for d in "abc")
            assert a == b and a != c


def test_refusals(tmp_path):
    from common.errors import UserError

    corpus = _corpus(tmp_path)
    _make(tmp_path, corpus=corpus)
    with pytest.raises(UserError, match="already exist"):
        _make(tmp_path, corpus=corpus)
    with pytest.raises(pd.ProbeDataError, match="validation document"):
        pd.make_probes(pd.ProbeDataConfig(corpus=[str(corpus)], output_dir=str(tmp_path / "x"), split="100,0,0"))
    with pytest.raises(ValueError, match="--dev-fraction"):
        pd.ProbeDataConfig(corpus=[str(corpus)], output_dir=str(tmp_path / "x"), dev_fraction=1.0)
    assert pd.main(["--corpus", str(tmp_path / "nowhere"), "--output-dir", str(tmp_path / "y")]) == 2


def test_document_order_is_the_shards(tmp_path):
    """Document k here is document k of a shard that data_pipeline.preprocess wrote from the same corpus (its
    sentences, tokenized, are that document's sequences); --data-path refuses a shard of another corpus."""
    from data_pipeline.indexed import IndexedDataset
    from data_pipeline.preprocess import main as preprocess
    from data_pipeline.train_tokenizer import main as train_tokenizer

    corpus = _corpus(tmp_path)
    tok_dir = tmp_path / "tok"
    assert train_tokenizer(["--input", str(corpus), "--output-dir", str(tok_dir), "--model-type", "wordpiece",
                            "--vocab-size", "300"]) == 0  # fmt: skip
    prefix = tmp_path / "shard" / "c"
    assert preprocess(["--input", str(corpus), "--output-prefix", str(prefix), "--tokenizer-type",
                       "BertWordPieceLowerCase", "--vocab-file", str(tok_dir / "vocab.txt"), "--split-sentences",
                       "--workers", "1"]) == 0  # fmt: skip
    shard = f"{prefix}_text_sentence"
    cfg = pd.ProbeDataConfig(corpus=[str(corpus)], output_dir=str(tmp_path / "p"), split="50,50,0", data_path=shard)
    held, total = pd.held_out_documents(cfg)
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(tok_dir / "vocab.txt"), lowercase=True)
    ds = IndexedDataset(shard)
    for doc in held:
        s0 = int(ds.document_indices[doc.index])
        for k, sentence in enumerate(doc.sentences):
            assert ds[s0 + k].tolist() == tok.encode(sentence, add_special_tokens=False).ids
    (tmp_path / "o").mkdir()
    other = _corpus(tmp_path / "o", docs=30)
    bad = pd.ProbeDataConfig(corpus=[str(other)], output_dir=str(tmp_path / "q"), split="50,50,0", data_path=shard)
    with pytest.raises(pd.ProbeDataError, match="holds 40 documents, --corpus gives 30"):
        pd.held_out_documents(bad)
