"""Issue 34: bad input never destroys data and never passes silently. Real commands on tiny data: existing outputs
are kept without --overwrite, an output is never an input, shards that hold no text or only [UNK] are refused,
shards are tied to their vocabulary, and every refusal is one line with exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.preprocess import main as preprocess_main
from data_pipeline.train_tokenizer import main as tokenizer_main
from tools.inspect_dataset import main as inspect_main
from tools.merge_shards import main as merge_main

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory) -> tuple[Path, Path]:
    """Two vocabularies trained here: on the whole sample corpus, and a smaller one on its wiki part."""
    tmp = tmp_path_factory.mktemp("vocab")
    assert tokenizer_main(["--input", str(SAMPLE), "--output-dir", str(tmp / "a"), "--vocab-size", "4000"]) == 0
    small = ["--input", str(SAMPLE / "jsonl"), "--output-dir", str(tmp / "b"), "--vocab-size", "900"]
    assert tokenizer_main(small) == 0
    return tmp / "a" / "vocab.txt", tmp / "b" / "vocab.txt"


def preprocess(inputs, prefix: Path, vocab: Path, *extra) -> int:
    args = ["--input", *map(str, inputs if isinstance(inputs, list) else [inputs]), "--output-prefix", str(prefix)]
    args += ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", str(vocab), "--no-progress", *extra]
    return preprocess_main(args)


def one_error_line(err: str) -> str:
    """The stderr of a refusal: exactly one `PROG: error: ...` line and no traceback."""
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def shard_bytes(prefix: Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


# ------------------------------------------------------------------------------------------- preprocess
def test_preprocess_keeps_an_existing_shard(vocabs, tmp_path, capsys):
    """It replaced a 424-document shard with a 20-document one and printed nothing."""
    vocab = vocabs[0]
    assert preprocess(SAMPLE, tmp_path / "p", vocab) == 0
    before = shard_bytes(tmp_path / "p_text_document")
    capsys.readouterr()
    assert preprocess(SAMPLE / "jsonl", tmp_path / "p", vocab) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "p_text_document.bin" in line and "--overwrite" in line and "--output-prefix" in line
    assert shard_bytes(tmp_path / "p_text_document") == before
    assert preprocess(SAMPLE / "jsonl", tmp_path / "p", vocab, "--overwrite") == 0
    assert shard_bytes(tmp_path / "p_text_document") != before


def test_preprocess_output_that_is_an_input_is_refused(vocabs, tmp_path, capsys):
    text = tmp_path / "p_text_document.bin"  # a text file where the shard would go, given as the input
    text.write_text("The river rises near the market square.\n")
    assert preprocess(text, tmp_path / "p", vocabs[0], "--overwrite", "--input-format", "text") == 2
    assert "is the input --input" in one_error_line(capsys.readouterr().err)
    assert text.read_text().startswith("The river")


def test_preprocess_refuses_inputs_without_text(vocabs, tmp_path, capsys):
    """An all-malformed jsonl file and a parquet file without the text column gave 0-document shards (exit 0),
    which training then rejected with a traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "cut\n{"title": "no text key"}\n{oops\n')
    pq.write_table(pa.table({"body": ["hello world", "more words"]}), tmp_path / "x.parquet")
    for src in (bad, tmp_path / "x.parquet"):
        capsys.readouterr()
        assert preprocess(src, tmp_path / src.stem, vocabs[0]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert "0 documents" in line and "--json-keys" in line
        assert not list(tmp_path.glob(f"{src.stem}_text_*"))
        report = json.loads((tmp_path / "reports" / f"{src.stem}.report.json").read_text())
        assert report["status"].startswith("failed")


def test_preprocess_refuses_all_unk(tmp_path, capsys):
    """A vocabulary of special tokens only (what an empty corpus used to give) wrote 100% [UNK] shards."""
    vocab = tmp_path / "specials.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    assert preprocess(SAMPLE / "jsonl", tmp_path / "u", vocab) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "are [UNK]" in line and "specials.txt" in line and "train_tokenizer" in line
    assert not list(tmp_path.glob("u_text_*"))


# ------------------------------------------------------------------------------------------- the vocabulary
def test_shards_are_tied_to_their_vocabulary(vocabs, tmp_path, capsys):
    """Old shards plus a new vocab trained silently on the wrong tokens; the fingerprint in the report is
    compared by tools.inspect_dataset (both commands) and by build_datasets (the trainer's path)."""
    from data_pipeline.data_config import DataConfig, DataConfigError
    from data_pipeline.datasets import build_datasets
    from data_pipeline.tokenization import build_tokenizer

    made, other = vocabs
    assert preprocess(SAMPLE / "jsonl", tmp_path / "s", made, "--split-sentences") == 0
    prefix = str(tmp_path / "s_text_sentence")
    report = json.loads((tmp_path / "reports" / "s.report.json").read_text())
    assert report["tokenizer"]["fingerprint"] == build_tokenizer("BertWordPieceLowerCase", str(made)).fingerprint()
    capsys.readouterr()
    assert inspect_main([prefix, "--vocab-file", str(made), "--num-docs", "1"]) == 0
    assert inspect_main([prefix, "--vocab-file", str(other)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(made) in line and "fingerprint" in line
    samples = ["samples", "--data-path", prefix, "--seq-length", "64", "--tokenizer-type", "BertWordPieceLowerCase"]
    assert inspect_main([*samples, "--vocab-file", str(other), "--stats"]) == 2
    assert "fingerprint" in one_error_line(capsys.readouterr().err)
    config = DataConfig(data_path=[prefix], seq_length=64)
    with pytest.raises(DataConfigError, match="fingerprint"):
        build_datasets(config, build_tokenizer("BertWordPieceLowerCase", str(other)))
    # the same ids from another file (a copy) are the same vocabulary
    copy = tmp_path / "copy.txt"
    shutil.copyfile(made, copy)
    assert inspect_main([prefix, "--vocab-file", str(copy), "--num-docs", "0"]) == 0
    # Megatron's reader opens the shards: the report lives in reports/, not beside them
    assert sorted(p.name for p in tmp_path.glob("s_*")) == ["s_text_sentence.bin", "s_text_sentence.idx"]


# ------------------------------------------------------------------------------------------- merge_shards
def test_merge_shards_guard(vocabs, tmp_path, capsys):
    assert preprocess(SAMPLE / "jsonl", tmp_path / "a", vocabs[0]) == 0
    assert preprocess(SAMPLE / "wikiextractor", tmp_path / "b", vocabs[0]) == 0
    a, b = str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document")
    before = shard_bytes(tmp_path / "a_text_document")
    capsys.readouterr()
    assert merge_main(["--inputs", a, b, "--output-prefix", a, "--overwrite"]) == 2
    assert "is the input --inputs" in one_error_line(capsys.readouterr().err)
    assert shard_bytes(tmp_path / "a_text_document") == before
    assert merge_main(["--inputs", a, b, "--output-prefix", str(tmp_path / "m")]) == 0
    merged = shard_bytes(tmp_path / "m")
    assert merge_main(["--inputs", b, "--output-prefix", str(tmp_path / "m")]) == 2
    assert "--overwrite" in one_error_line(capsys.readouterr().err)
    assert shard_bytes(tmp_path / "m") == merged
    assert merge_main(["--inputs", b, "--output-prefix", str(tmp_path / "m"), "--overwrite"]) == 0
    assert shard_bytes(tmp_path / "m") == shard_bytes(tmp_path / "b_text_document")


# ------------------------------------------------------------------------------------------- the error rule
def test_debug_flag_shows_the_traceback(tmp_path):
    cmd = [sys.executable, "-m", "tools.inspect_dataset", str(tmp_path / "missing")]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("tools.inspect_dataset: error: ") and r.stderr.count("\n") == 1
    r = subprocess.run([*cmd, "--debug"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" in r.stderr and "tools.inspect_dataset: error: " in r.stderr
    env = {"SPARSE_BERT_DEBUG": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "Traceback" in r.stderr
