"""Cleaning and sentence splitting: abbreviations, whitespace-only cuts (token parity), Gutenberg trimming."""

from __future__ import annotations

import numpy as np

from data_pipeline.encode import _sentences
from data_pipeline.text import (
    chunk_text,
    sentence_starts,
    split_lines,
    split_sentences,
    trim_gutenberg,
    unwrap_paragraphs,
)
from data_pipeline.wikitext import wikitext_to_text

ABBREV = (
    "Dr. Smith went to Washington D.C. on Jan. 5. He arrived at 5 p.m. and met Mr. Jones, e.g. the mayor. "
    "Then they left."
)


def test_abbreviations_do_not_end_sentences():
    assert split_sentences(ABBREV) == [
        "Dr. Smith went to Washington D.C. on Jan. 5.",
        "He arrived at 5 p.m. and met Mr. Jones, e.g. the mayor.",
        "Then they left.",
    ]


def _pieces(doc: str, cuts) -> list[str]:
    b = [0, *cuts, len(doc)]
    return [doc[x:y] for x, y in zip(b[:-1], b[1:])]


def test_sentence_starts_cut_at_sentences_and_paragraphs_with_unicode_offsets():
    doc = "Zoë met Dr. Ünal in Köln. They talked.\nNew paragraph here. Last one!"
    pieces = _pieces(doc, sentence_starts(doc))
    assert [p.strip() for p in pieces] == [
        "Zoë met Dr. Ünal in Köln.",
        "They talked.",
        "New paragraph here.",
        "Last one!",
    ]
    assert "".join(pieces) == doc


def test_sentence_splitting_keeps_document_tokens(bert_uncased_vocab):
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast(str(bert_uncased_vocab), do_lower_case=True)
    paras = [
        "Then he left!Next day it rained. It was 5 p.m. on the 3rd.",
        "A\u00a0non-breaking space. Fine.",
        "Quotes: \u201cWhere?\u201d asked Ada. \u201cHere.\u201d",
        "x" * 120 + ". Short.",
    ]
    doc = "\n".join(paras)
    whole = tok(doc, add_special_tokens=False).input_ids
    sents = _sentences(doc, keep_newlines=True)  # the pipeline's path
    assert sum(s.endswith("\n") for s in sents) == len(paras) - 1  # paragraph ends (the last has no newline)
    assert "Then he left!Next day it rained." in [s.strip() for s in sents]  # no cut without whitespace
    assert [i for s in sents for i in tok(s, add_special_tokens=False).input_ids] == whole
    per_para = [s for p in paras for s in split_sentences(p)]
    assert [i for s in per_para for i in tok(s, add_special_tokens=False).input_ids] == whole


def test_split_lines_and_unwrap():
    assert split_lines("  a  b \r\n\n\tc\x07d\u00a0e \n") == ["a b", "cd e"]
    book = "Line one of\na paragraph.\n\n\nSecond\nparagraph.\n"
    assert unwrap_paragraphs(book) == ["Line one of a paragraph.", "Second paragraph."]


def test_chunk_text_cuts_at_whitespace_and_reassembles():
    rng = np.random.default_rng(1)
    words = ["".join(rng.choice(list("abcdef"), rng.integers(1, 9))) for _ in range(5000)]
    text = ""
    for w in words:
        text += w + rng.choice([" ", "\n", "  "])
    pieces = chunk_text(text, 500)
    assert "".join(pieces) == text
    assert all(len(p) <= 500 for p in pieces)
    for a, b in zip(pieces[:-1], pieces[1:]):
        assert a[-1].isspace() or b[0].isspace()
    assert chunk_text("x" * 2000, 100) == ["x" * 2000]  # no whitespace: one word, kept whole


def test_gutenberg_trimming_on_real_books(corpus):
    books = sorted((corpus / "books").glob("pg*.txt"))
    assert books
    for p in books:
        body, found = trim_gutenberg(p.read_text(encoding="utf-8"))
        assert found, p
        assert "START OF" not in body.upper()[:500]
        upper = body.upper()
        assert "END OF THE PROJECT GUTENBERG" not in upper and "END OF THIS PROJECT GUTENBERG" not in upper
        assert "Project Gutenberg License" not in body, p


def test_text_without_markers_passes_whole():
    assert trim_gutenberg("just a book") == ("just a book", False)


def test_wikitext_to_text_uses_the_parser():
    wt = (
        "{{Infobox town|name=X}}'''Albedo''' is the [[reflection|diffuse reflection]] of light"
        "<ref>{{cite book|title=T}}</ref>.<!-- hidden -->\n== History ==\n* First item [http://x.org a site].\n"
        '{| class="wikitable"\n|-\n| cell || 1\n|}\n[[File:A.jpg|thumb|Caption]] [[Category:Optics]] [[de:Albedo]]'
    )
    text = wikitext_to_text(wt)
    assert text.split("\n") == ["Albedo is the diffuse reflection of light.", "History", "First item a site."]
