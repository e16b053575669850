"""train_tokenizer: WordPiece vocab usable by BertTokenizerFast; SentencePiece unigram/BPE with our special tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.tokenization import build_tokenizer
from data_pipeline.train_tokenizer import TrainTokenizerConfig, main

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"


def test_wordpiece_vocab_round_trips_through_bert_tokenizer_fast(tmp_path):
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    assert main(["--input", str(SAMPLE), "--output-dir", str(tmp_path), "--vocab-size", "800"]) == 0
    vocab = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 300 < len(vocab) <= 800 and len(set(vocab)) == len(vocab)
    assert any(v.startswith("##") for v in vocab)
    tok = build_tokenizer("BertWordPieceLowerCase", str(tmp_path / "vocab.txt"))
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    text = "The clockmaker of Harrowgate repaired the weathered lantern."
    ids = tok.encode(text)
    assert ids == BertTokenizerFast(str(tmp_path / "vocab.txt"))(text, add_special_tokens=False).input_ids
    assert ids == BertWordPieceTokenizer(str(tmp_path / "vocab.txt")).encode(text, add_special_tokens=False).ids
    assert tok.unk_id not in ids  # trained on this very text: everything is covered
    meta = json.loads((tmp_path / "tokenizer_meta.json").read_text())
    assert "BertWordPieceLowerCase" in meta["use_with"]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_models(tmp_path, model_type):
    assert (
        main(
            [
                "--input",
                str(SAMPLE / "wikiextractor"),
                "--output-dir",
                str(tmp_path),
                "--model-type",
                model_type,
                "--vocab-size",
                "400",
            ]
        )
        == 0
    )
    tok = build_tokenizer("SentencePieceTokenizer", tokenizer_model=str(tmp_path / "spm.model"))
    assert tok.vocab_size == 400
    assert (tok.pad_id, tok.unk_id) == (0, 1) and {tok.cls_id, tok.sep_id, tok.mask_id} == {2, 3, 4}
    text = "The river rises near the market square."
    assert tok.decode(tok.encode(text)) == text
    assert tok.word_start_mask()[tok.encode("river")[0]]


def test_config_is_validated():
    with pytest.raises(ValueError, match="--model-type"):
        TrainTokenizerConfig(input=["x"], output_dir="o", model_type="wordlevel")
    with pytest.raises(ValueError, match="--vocab-size"):
        TrainTokenizerConfig(input=["x"], output_dir="o", vocab_size=3)


def _train(out: Path, *extra: str, inputs: tuple[str, ...] = (str(SAMPLE),)) -> int:
    return main(["--input", *inputs, "--output-dir", str(out), "--vocab-size", "4000", *extra])


def test_same_corpus_same_vocab_bytes(tmp_path):
    """Hugging Face's WordPiece trainer numbers the ## pieces in hash-map order (huggingface/tokenizers#1794):
    before the alphabet was fixed up front, three runs moved 255-318 of 1,528 ids. Three runs in fresh processes
    (each gets its own hash seeds) must write the same bytes."""
    outs = []
    for i in range(3):
        out = tmp_path / f"run{i}"
        r = subprocess.run(
            [sys.executable, "-m", "data_pipeline.train_tokenizer", "--input", str(SAMPLE), "--output-dir", str(out)]
            + ["--vocab-size", "4000"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        outs.append((out / "vocab.txt").read_bytes())
    assert outs[0] == outs[1] == outs[2]
    vocab = outs[0].decode().splitlines()
    assert len(vocab) > 1000 and len(set(vocab)) == len(vocab)


def test_existing_vocab_is_kept(tmp_path, capsys):
    assert _train(tmp_path) == 0
    before = (tmp_path / "vocab.txt").read_bytes()
    capsys.readouterr()
    # a misspelled --input: refused, and the vocab stays (it was overwritten by a 5-line vocab, exit 0)
    assert _train(tmp_path, "--overwrite", inputs=(str(SAMPLE) + "-typo",)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--input" in err and "no such file or directory" in err
    # an existing vocab without --overwrite: refused, naming the file and the flag
    assert _train(tmp_path, inputs=(str(SAMPLE / "wiki"),)) == 2
    err = capsys.readouterr().err
    assert "vocab.txt" in err and "--overwrite" in err
    assert (tmp_path / "vocab.txt").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    # --overwrite replaces it
    assert _train(tmp_path, "--overwrite", inputs=(str(SAMPLE / "wiki"),)) == 0
    assert (tmp_path / "vocab.txt").read_bytes() != before


def test_output_that_is_an_input_is_refused(tmp_path, capsys):
    corpus = tmp_path / "vocab.txt"  # a text corpus that happens to sit where the vocab would go
    corpus.write_text("the river rises near the market square\n" * 20)
    assert _train(tmp_path, "--overwrite", inputs=(str(corpus),)) == 2
    assert "is the input --input" in capsys.readouterr().err
    assert corpus.read_text().startswith("the river")


def test_empty_corpus_is_refused(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("\n\n")
    for model_type in ("wordpiece", "unigram"):
        out = tmp_path / model_type
        assert _train(out, "--model-type", model_type, inputs=(str(tmp_path / "empty.txt"),)) == 2
        assert "no text found" in capsys.readouterr().err
        assert not out.exists() or not any(out.iterdir())
