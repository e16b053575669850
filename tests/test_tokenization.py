"""Tokenizer interface: ids identical to Hugging Face BertTokenizerFast / tokenizers, special ids, offsets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data_pipeline.tokenization import TokenizerError, build_tokenizer

TEXTS = [
    "Hello world, this is BERT's tokenizer.",
    "Café über naïve Zoë — 日本語 text",
    "",
    "A very long word: " + "x" * 150 + " then normal words.",
    "tab\there\x07bell and\u00a0nbsp",
]


@pytest.fixture(scope="module")
def uncased(bert_uncased_vocab):
    return build_tokenizer("BertWordPieceLowerCase", str(bert_uncased_vocab))


def test_vocab_is_loaded_and_special_ids_match_bert(uncased):
    # transformers 5 silently ignored vocab_file= and built a 5-token vocab: guard against it
    assert uncased.vocab_size == 30522
    assert (uncased.pad_id, uncased.unk_id, uncased.cls_id, uncased.sep_id, uncased.mask_id) == (0, 100, 101, 102, 103)
    assert uncased.encode("the") == [1996]


def test_ids_equal_tokenizers_library_and_transformers(uncased, bert_uncased_vocab, corpus):
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    ref = BertWordPieceTokenizer(str(bert_uncased_vocab), lowercase=True)
    hf = BertTokenizerFast(str(bert_uncased_vocab), do_lower_case=True)
    lines = (corpus / "megatron-shards" / "wiki60.jsonl").read_text(encoding="utf-8").splitlines()[:5]
    texts = TEXTS + [json.loads(line)["text"] for line in lines]
    ours = uncased.encode_batch(texts)
    assert ours == [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    assert ours == [hf(t, add_special_tokens=False).input_ids for t in texts]


def test_offsets_path_gives_same_ids_and_token_starts(uncased):
    res = uncased.encode_batch_with_starts(TEXTS)
    for text, ids, (ids2, starts) in zip(TEXTS, uncased.encode_batch(TEXTS), res):
        assert ids2 == ids and len(starts) == len(ids)
        assert np.all(np.diff(starts) >= 0)
        assert all(0 <= s < len(text) for s in starts)


def test_cased_vocab(corpus):
    p = corpus / "vocab" / "bert-base-cased" / "vocab.txt"
    if not p.is_file():
        pytest.skip("cased vocab absent")
    t = build_tokenizer("BertWordPieceCase", str(p))
    assert t.vocab_size == 28996 and t.encode("The the") == [1109, 1103]


def test_word_start_mask_and_tokens(uncased):
    mask = uncased.word_start_mask()
    ids = uncased.encode("unaffable tokenization")
    toks = uncased.tokens(ids)
    assert [mask[i] for i in ids] == [not t.startswith("##") for t in toks]
    assert any(t.startswith("##") for t in toks)
    assert uncased.decode(ids) == "unaffable tokenization"


def test_missing_or_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(TokenizerError, match="--vocab-file"):
        build_tokenizer("BertWordPieceLowerCase", str(tmp_path / "nope.txt"))
    with pytest.raises(TokenizerError, match="--tokenizer-model"):
        build_tokenizer("SentencePieceTokenizer", tokenizer_model=str(tmp_path / "nope.model"))
    with pytest.raises(TokenizerError, match="unknown --tokenizer-type"):
        build_tokenizer("GPT2BPETokenizer")
    bad = tmp_path / "vocab.txt"
    bad.write_text("hello\nworld\n")
    with pytest.raises(TokenizerError, match=r"no \[PAD\]"):
        build_tokenizer("BertWordPieceLowerCase", str(bad))


def test_special_token_literals_and_lazy_transformers_object(uncased, bert_uncased_vocab, tmp_path):
    from transformers import BertTokenizerFast

    text = "a [MASK] b [SEP] [CLS]x"
    assert uncased.encode(text) == BertTokenizerFast(str(bert_uncased_vocab))(text, add_special_tokens=False).input_ids
    files = uncased.save(tmp_path)  # builds the transformers tokenizer on demand
    assert any(str(f).endswith("tokenizer.json") for f in files)
    again = BertTokenizerFast.from_pretrained(str(tmp_path))
    assert again(text, add_special_tokens=False).input_ids == uncased.encode(text)
