"""End-to-end preprocessing: Megatron parity, determinism across workers/chunking, all formats, bad input."""

from __future__ import annotations

import bz2
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.indexed import IndexedDataset
from data_pipeline.preprocess import main

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"


def run(*args) -> int:
    return main([str(a) for a in args] + ["--no-progress"])


def files_equal(a: str, b: str) -> bool:
    return all(Path(a + ext).read_bytes() == Path(b + ext).read_bytes() for ext in (".bin", ".idx"))


@pytest.fixture(scope="module")
def megatron(corpus: Path) -> Path:
    d = corpus / "megatron-shards"
    if not (d / "wiki60.jsonl").is_file():
        pytest.skip("Megatron reference shards absent")
    return d


def test_document_level_is_byte_identical_to_megatron(megatron, bert_uncased_vocab, tmp_path):
    assert (
        run(
            "--input",
            megatron / "wiki60.jsonl",
            "--output-prefix",
            tmp_path / "w",
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            bert_uncased_vocab,
            "--workers",
            1,
        )
        == 0
    )
    assert files_equal(str(tmp_path / "w_text_document"), str(megatron / "wiki60_text_document"))


def test_sentence_level_tokens_equal_hf_per_document(megatron, bert_uncased_vocab, tmp_path):
    from transformers import BertTokenizerFast

    assert (
        run(
            "--input",
            megatron / "wiki60.jsonl",
            "--output-prefix",
            tmp_path / "s",
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            bert_uncased_vocab,
            "--split-sentences",
            "--workers",
            2,
            "--chunk-chars",
            100_000,
        )
        == 0
    )
    ours = IndexedDataset(tmp_path / "s_text_sentence")
    ref = IndexedDataset(megatron / "wiki60_text_sentence")  # Megatron's own (punkt) sentence shard
    hf = BertTokenizerFast(str(bert_uncased_vocab), do_lower_case=True)
    texts = [json.loads(line)["text"] for line in (megatron / "wiki60.jsonl").read_text(encoding="utf-8").splitlines()]
    assert ours.num_documents == 60
    for d, text in enumerate(texts):
        expect = hf(text, add_special_tokens=False).input_ids
        assert ours.document(d).tolist() == expect == ref.document(d).tolist()
    # really split (about as many sentences as punkt found), no [CLS]/[SEP] wrapping, no empty sentences
    assert 0.9 * len(ref) < len(ours) < 1.1 * len(ref)
    lengths = np.asarray(ours.sequence_lengths)
    assert lengths.min() > 0
    firsts = np.asarray([ours[i][0] for i in range(len(ours))])
    lasts = np.asarray([ours[i][-1] for i in range(len(ours))])
    assert not np.isin(firsts, [101, 102]).any() and not np.isin(lasts, [101, 102]).any()
    # Megatron's reader agrees on our sentence boundaries
    mcore = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    theirs = mcore.IndexedDataset(str(tmp_path / "s_text_sentence"))
    assert len(theirs) == len(ours)
    np.testing.assert_array_equal(theirs[len(ours) // 2], ours[len(ours) // 2])


def test_output_independent_of_workers_and_chunk_size(bert_uncased_vocab, tmp_path):
    common = [
        "--input",
        SAMPLE,
        "--tokenizer-type",
        "BertWordPieceLowerCase",
        "--vocab-file",
        bert_uncased_vocab,
        "--split-sentences",
    ]
    assert run(*common, "--output-prefix", tmp_path / "a", "--workers", 1) == 0
    assert run(*common, "--output-prefix", tmp_path / "b", "--workers", 2, "--chunk-chars", 3000) == 0
    assert files_equal(str(tmp_path / "a_text_sentence"), str(tmp_path / "b_text_sentence"))
    ds = IndexedDataset(tmp_path / "a_text_sentence")
    # 4 books + 120 jsonl + 150 wiki pages + 150 WikiExtractor docs, nothing reported
    assert ds.num_documents == 424
    report = json.loads((tmp_path / "reports" / "a.report.json").read_text())
    assert report["bad_input"] == {} and report["totals"]["text"]["documents"] == 424
    assert not (tmp_path / "a.parts").exists() and not (tmp_path / "a.progress.json").exists()


def test_big_book_is_spread_but_stays_one_document(bert_uncased_vocab, tmp_path):
    from transformers import BertTokenizerFast

    from data_pipeline.readers import BadInputLog, read_documents

    book = next((SAMPLE / "books").glob("book01_*.txt"))
    assert (
        run(
            "--input",
            book,
            "--output-prefix",
            tmp_path / "b",
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            bert_uncased_vocab,
            "--workers",
            2,
            "--chunk-chars",
            2000,
            "--append-eod",
        )
        == 0
    )
    ds = IndexedDataset(tmp_path / "b_text_document")
    assert ds.num_documents == 1 and len(ds) == 1
    (doc,) = read_documents(str(book), "auto", ["text"], BadInputLog())
    hf = BertTokenizerFast(str(bert_uncased_vocab), do_lower_case=True)
    assert ds.document(0).tolist() == hf(doc.texts["text"], add_special_tokens=False).input_ids + [102]


def test_parquet_and_jsonl_give_the_same_shard(bert_uncased_vocab, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (SAMPLE / "jsonl" / "articles.jsonl").read_text(encoding="utf-8").splitlines()]
    pq.write_table(
        pa.table({"text": [r["text"] for r in rows], "title": [r["title"] for r in rows]}),
        tmp_path / "a.parquet",
        row_group_size=17,
    )
    common = [
        "--tokenizer-type",
        "BertWordPieceLowerCase",
        "--vocab-file",
        bert_uncased_vocab,
        "--json-keys",
        "text",
        "title",
    ]
    assert run("--input", SAMPLE / "jsonl" / "articles.jsonl", "--output-prefix", tmp_path / "j", *common) == 0
    assert run("--input", tmp_path / "a.parquet", "--output-prefix", tmp_path / "p", *common) == 0
    for key in ("text", "title"):
        assert files_equal(str(tmp_path / f"j_{key}_document"), str(tmp_path / f"p_{key}_document"))
    assert IndexedDataset(tmp_path / "p_title_document").num_documents == len(rows)


def test_sentencepiece_tokenizer_path(tmp_path):
    from data_pipeline.tokenization import build_tokenizer
    from data_pipeline.train_tokenizer import main as train_main

    assert (
        train_main(
            [
                "--input",
                str(SAMPLE / "jsonl"),
                "--output-dir",
                str(tmp_path / "sp"),
                "--model-type",
                "unigram",
                "--vocab-size",
                "300",
            ]
        )
        == 0
    )
    model = tmp_path / "sp" / "spm.model"
    assert (
        run(
            "--input",
            SAMPLE / "jsonl",
            "--output-prefix",
            tmp_path / "o",
            "--tokenizer-type",
            "SentencePieceTokenizer",
            "--tokenizer-model",
            model,
            "--split-sentences",
        )
        == 0
    )
    ds = IndexedDataset(tmp_path / "o_text_sentence")
    tok = build_tokenizer("SentencePieceTokenizer", tokenizer_model=str(model))
    assert ds.num_documents == 120 and len(ds) > 120
    first = json.loads((SAMPLE / "jsonl" / "articles.jsonl").read_text(encoding="utf-8").splitlines()[0])["text"]
    assert tok.decode(ds.document(0).tolist()).split() == first.split()


def _bad_corpus(tmp: Path) -> Path:
    d = tmp / "bad"
    d.mkdir()
    (d / "a.jsonl").write_bytes(
        b'{"text": "A fine first document. It has two sentences."}\n'
        b'{"text": "oops\n'
        b'{"text": "Invalid \xff\xfe bytes here."}\n'
        b'{"text": "   "}\n'
        b'{"body": "no text key"}\n'
    )
    (d / "b_wiki").write_text(
        '<doc id="1" url="u" title="Lonely Title">\nLonely Title\n</doc>\n'
        '<doc id="2" url="u" title="Real">\nReal\nA real article body.\n</doc>\n',
        encoding="utf-8",
    )
    # recompressed in 100 kB blocks, so the blocks before the cut can still be decompressed
    raw = bz2.compress(bz2.decompress((SAMPLE / "wiki" / "sample-pages-articles.xml.bz2").read_bytes()), 1)
    (d / "c.xml.bz2").write_bytes(raw[: len(raw) * 2 // 3])
    (d / "d_book.txt").write_text("word " * 30_000, encoding="utf-8")  # 150 KB single document
    # a 20 MB single document (mostly blank, so tokenising it stays cheap in a unit test)
    (d / "e_huge.jsonl").write_text(json.dumps({"text": ("Some words here." + " " * 2000 + "\n") * 10_000}) + "\n")
    return d


def test_bad_input_is_reported_and_strict_writes_nothing(bert_uncased_vocab, tmp_path):
    d = _bad_corpus(tmp_path)
    common = [
        "--input",
        d,
        tmp_path / "missing.jsonl",
        "--tokenizer-type",
        "BertWordPieceLowerCase",
        "--vocab-file",
        bert_uncased_vocab,
        "--split-sentences",
        "--max-document-chars",
        100_000,
    ]
    assert run(*common, "--output-prefix", tmp_path / "o", "--workers", 2) == 0
    report = json.loads((tmp_path / "reports" / "o.report.json").read_text())
    counts = {k: v["count"] for k, v in report["bad_input"].items()}
    assert counts == {
        "missing_input": 1,
        "malformed_json": 1,
        "invalid_utf8": 1,
        "empty_document": 2,
        "missing_key": 1,
        "truncated_file": 1,
        "oversized_document": 2,
    }
    ex = report["bad_input"]
    assert ex["malformed_json"]["examples"][0]["where"] == "line 2"
    assert ex["invalid_utf8"]["examples"][0]["where"] == "line 3"
    assert {e["where"] for e in ex["empty_document"]["examples"]} == {"line 4", "doc 'Lonely Title' (line 1)"}
    assert ex["truncated_file"]["examples"][0]["file"].endswith("c.xml.bz2")
    ds = IndexedDataset(tmp_path / "o_text_sentence")
    # a.jsonl: 2 docs; b_wiki: 1; c.xml.bz2: the pages before the cut; the book; the 20 MB document
    assert report["totals"]["text"]["documents"] == ds.num_documents > 5
    assert len(ds.document(ds.num_documents - 1)) == 40_000  # 10,000 x "some words here ."

    assert run(*common, "--output-prefix", tmp_path / "s", "--strict") == 1
    assert json.loads((tmp_path / "reports" / "s.report.json").read_text())["status"].startswith("failed")
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("s"))
    assert leftovers == []  # no shards, parts or progress file (the report is in reports/)


def test_cli_errors_are_clear(bert_uncased_vocab, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_pipeline.preprocess",
            "--input",
            str(tmp_path / "none*"),
            "--output-prefix",
            str(tmp_path / "o"),
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            str(bert_uncased_vocab),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no input files found" in r.stderr and "none*" in r.stderr
    assert (
        run(
            "--input",
            SAMPLE,
            "--output-prefix",
            tmp_path / "o",
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            tmp_path / "nope.txt",
        )
        == 2
    )


def test_inspect_dataset_decodes_and_rejects_corrupt(bert_uncased_vocab, tmp_path, capsys):
    from tools.inspect_dataset import main as inspect_main

    jsonl = SAMPLE / "jsonl" / "articles.jsonl"
    assert (
        run(
            "--input",
            jsonl,
            "--output-prefix",
            tmp_path / "o",
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            bert_uncased_vocab,
            "--split-sentences",
        )
        == 0
    )
    prefix = str(tmp_path / "o_text_sentence")
    assert inspect_main([prefix, "--vocab-file", str(bert_uncased_vocab), "--num-docs", "1"]) == 0
    out = capsys.readouterr().out
    first = json.loads(jsonl.read_text(encoding="utf-8").splitlines()[0])["text"]
    assert "120 documents" in out and "histogram" in out
    assert " ".join(first.lower().split()[:4]) in out
    shutil.copy(prefix + ".idx", tmp_path / "bad.idx")
    Path(tmp_path / "bad.bin").write_bytes(Path(prefix + ".bin").read_bytes()[:-2])
    assert inspect_main([str(tmp_path / "bad")]) == 2
    assert "bad.bin" in capsys.readouterr().err


@pytest.mark.parametrize("split", [False, True], ids=["document", "sentence"])
@pytest.mark.parametrize("eod", [False, True], ids=["no-eod", "eod"])
def test_empty_documents_stay_as_megatron_writes_them(bert_uncased_vocab, tmp_path, split, eod):
    """Megatron's add_document keeps a document with no sequences (document_indices [0, 1, 1, 2] for three lines
    whose middle one is empty): our shard is byte-identical to what megatron.core's own builder writes for the
    same token lists, whitespace-only lines included, with and without --append-eod (no eod on an empty doc)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from transformers import BertTokenizerFast

    texts = ["Alpha beta gamma.", "", "Delta epsilon.", "   \t ", "Zeta."]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    flags = ["--split-sentences"] if split else []
    flags += ["--append-eod"] if eod else []
    assert (
        run(
            "--input",
            tmp_path / "in.jsonl",
            "--output-prefix",
            tmp_path / "ours",
            "--tokenizer-type",
            "BertWordPieceLowerCase",
            "--vocab-file",
            bert_uncased_vocab,
            *flags,
        )
        == 0
    )
    hf = BertTokenizerFast(str(bert_uncased_vocab), do_lower_case=True)
    level = "sentence" if split else "document"
    ref = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16)
    for t in texts:
        ids = hf(t, add_special_tokens=False).input_ids
        if ids and eod:
            ids = ids + [hf.sep_token_id]  # BertWordPiece's eod is [SEP], as in Megatron
        ref.add_document(torch_tensor(ids), [len(ids)] if ids else [])
    ref.finalize(str(tmp_path / "ref.idx"))
    assert files_equal(str(tmp_path / f"ours_text_{level}"), str(tmp_path / "ref"))
    ds = IndexedDataset(tmp_path / f"ours_text_{level}")
    assert ds.num_documents == len(texts) and list(ds.document_indices) == [0, 1, 1, 2, 2, 3]


def torch_tensor(ids):
    import torch

    return torch.tensor(ids, dtype=torch.int64)


def _megatron_merge_datasets(input_dir: Path, output_prefix: Path) -> None:
    """What Megatron-LM's tools/merge_datasets.py (core_v0.16) does with --input DIR: every *file* in DIR must be
    one half of a .bin/.idx pair (its own assert), the pairs are merged in sorted order with add_index."""
    import os

    from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexed
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder, get_bin_path, get_idx_path

    prefixes = set()
    for basename in os.listdir(input_dir):
        prefix, ext = os.path.splitext(basename)
        if prefix in prefixes or not os.path.isfile(os.path.join(input_dir, basename)):
            continue
        pair = ".bin" if ext == ".idx" else ".idx"
        assert os.path.isfile(os.path.join(input_dir, prefix) + pair), (
            f"ERROR: {pair} file not provided for {os.path.join(input_dir, prefix)}"
        )
        prefixes.add(prefix)
    builder = None
    for prefix in sorted(prefixes):
        if builder is None:
            dtype = MIndexed(os.path.join(input_dir, prefix)).index.dtype
            builder = IndexedDatasetBuilder(get_bin_path(str(output_prefix)), dtype=dtype)
        builder.add_index(os.path.join(input_dir, prefix))
    builder.finalize(get_idx_path(str(output_prefix)))


def test_output_directory_merges_with_megatrons_merge_datasets(bert_uncased_vocab, tmp_path):
    """Two preprocess runs into one directory, then a training-style sample index built with the default cache:
    the directory still passes Megatron's merge_datasets.py scan (reports and caches live in sub-directories) and
    the merge equals our tools.merge_shards output byte for byte."""
    from data_pipeline.data_config import DataConfig
    from data_pipeline.datasets import build_datasets
    from data_pipeline.tokenization import build_tokenizer

    out = tmp_path / "shards"
    common = ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", bert_uncased_vocab, "--split-sentences"]
    assert run("--input", SAMPLE / "jsonl", "--output-prefix", out / "a", *common) == 0
    assert run("--input", SAMPLE / "books", "--output-prefix", out / "b", *common) == 0
    tok = build_tokenizer("BertWordPieceLowerCase", str(bert_uncased_vocab))
    build_datasets(DataConfig(data_path=[str(out / "a_text_sentence")], split="1,0,0", seq_length=128), tok)
    assert (out / "reports" / "a.report.json").is_file() and list((out / "cache").glob("a_text_sentence_samples_*"))
    _megatron_merge_datasets(out, tmp_path / "megatron_merged")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.merge_shards",
            "--inputs",
            str(out / "a_text_sentence"),
            str(out / "b_text_sentence"),
            "--output-prefix",
            str(tmp_path / "ours_merged"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert files_equal(str(tmp_path / "megatron_merged"), str(tmp_path / "ours_merged"))
