"""Every Unicode whitespace and control character, inside and between words, goes through our cleaning, sentence
splitting and per-sentence tokenization and gives exactly the ids the tokenizer gives for the raw text: our
pre-splitting may only cut where BERT's normaliser sees whitespace, and only delete what it deletes."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from data_pipeline.encode import Chunk, EncodeSettings, Piece, encode_chunk, init_worker
from data_pipeline.tokenization import build_tokenizer
from tests import train_utils as tu


def _special_chars() -> list[str]:
    """Whitespace by Python or Unicode, every control, format and separator character (Cc, Cf, Z*), and samples of
    private-use and unassigned code points."""
    out = []
    for cp in range(sys.maxunicode + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue  # surrogates cannot be encoded
        c = chr(cp)
        cat = unicodedata.category(c)
        if c.isspace() or cat[0] == "Z" or (cat in ("Cc", "Cf")):
            out.append(c)
    # private use (Co) and unassigned (Cn) are "other" too, for BERT's normaliser: a few of each
    return out + ["\ue000", "\uf8ff", "\U000f0000", "\u0378", "\ufffe", "\U0010ffff"]


CHARS = _special_chars()


def _tokenizers(tmp_path, corpus_dir):
    toks = {"small": build_tokenizer("BertWordPieceLowerCase", vocab_file=str(tu.write_vocab(tmp_path / "v.txt")))}
    for name, kind in (("bert-base-uncased", "BertWordPieceLowerCase"), ("bert-base-cased", "BertWordPieceCase")):
        p = corpus_dir / "vocab" / name / "vocab.txt"
        if p.is_file():
            toks[name] = build_tokenizer(kind, vocab_file=str(p))
    return toks


def _pipeline_ids(tok, text: str, split: bool) -> list[int]:
    """Token ids of one JSON document through our encoder (cleaning, sentence cuts, per-sentence encoding)."""
    init_worker(
        EncodeSettings(
            tokenizer_type="x",
            vocab_file=None,
            tokenizer_model=None,
            json_keys=("text",),
            split_sentences=split,
            keep_newlines=False,
            dtype="int32",
        ),
        tokenizer=tok,
    )
    res = encode_chunk(Chunk(0, [Piece({"text": text}, "json", True, "line 1")]))
    return res.keys["text"].tokens.tolist()


@pytest.mark.parametrize("split", [False, True], ids=["document", "sentence"])
def test_every_whitespace_and_control_character_keeps_the_tokenizers_ids(tmp_path, split):
    from tests.conftest import CORPUS

    assert len(CHARS) > 240 and "\x85" in CHARS and "\u2028" in CHARS and "\u200b" in CHARS
    toks = _tokenizers(tmp_path, CORPUS)
    bad = {}
    for name, tok in toks.items():
        words = ("w1", "w2", "w3") if name == "small" else ("alpha", "Beta", "gamma")
        for c in CHARS:
            text = f"{words[0]}{c}{words[1]}. {words[2]} {c} {words[0]}.{c}{words[1]}"
            want = tok.encode(text)
            got = _pipeline_ids(tok, text, split)
            if got != want:
                bad.setdefault(name, []).append(f"U+{ord(c):04X} {unicodedata.name(c, '?')}")
    assert not bad, f"ids differ from the tokenizer's for: {bad}"
