"""train_tokenizer: WordPiece vocab usable by BertTokenizerFast; SentencePiece unigram/BPE with our special tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipeline.tokenization import build_tokenizer
from data_pipeline.train_tokenizer import TrainTokenizerConfig, main

SAMPLE = Path(__file__).resolve().parents[1] / "run_scripts" / "sample_data" / "corpus"


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
