"""The worker side of preprocessing: a chunk of document pieces in, flat token arrays out.

A *piece* is a whole small document or a paragraph-aligned slice of a big one (a book), so one huge
file still spreads over all workers. A *chunk* is a batch of pieces from one input file, tokenised
with one ``encode_batch`` call. Results go back as numpy arrays (cheap to pickle), in order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import chain

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one worker = one core

import numpy as np

from data_pipeline.readers import KIND_WIKITEXT
from data_pipeline.text import sentence_starts, split_lines
from data_pipeline.tokenization import Tokenizer, build_tokenizer
from data_pipeline.wikitext import wikitext_to_text


@dataclass
class Piece:
    texts: dict[str, str]
    kind: str
    doc_end: bool  # last piece of its document
    where: str


@dataclass
class Chunk:
    file_idx: int
    pieces: list[Piece]
    last: bool = False  # last chunk of its input file
    reader_log: dict | None = None  # the reader's bad-input log, on the last chunk
    nchars: int = 0


@dataclass
class KeyResult:
    tokens: np.ndarray  # all units' tokens, back to back
    lengths: np.ndarray  # int32 tokens per unit (sentence, or document piece)
    units_per_piece: np.ndarray  # int32, how many units each piece produced


@dataclass
class ChunkResult:
    file_idx: int
    keys: dict[str, KeyResult]
    last: bool
    reader_log: dict | None
    nchars: int
    npieces: int
    doc_ends: list[bool] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)


@dataclass
class EncodeSettings:
    """What the workers need to know (picklable, small)."""

    tokenizer_type: str
    vocab_file: str | None
    tokenizer_model: str | None
    json_keys: tuple[str, ...]
    split_sentences: bool
    keep_newlines: bool
    dtype: str


_STATE: dict = {}


def init_worker(settings: EncodeSettings, tokenizer: Tokenizer | None = None) -> None:
    """Pool initializer (also called in-process for ``--workers 1``)."""
    _STATE["settings"] = settings
    _STATE["tokenizer"] = tokenizer or build_tokenizer(
        settings.tokenizer_type, settings.vocab_file, settings.tokenizer_model
    )


def doc_text(text: str, kind: str) -> str:
    """Cleaned document text: paragraphs, one per line."""
    if kind == KIND_WIKITEXT:
        text = wikitext_to_text(text)
    return "\n".join(split_lines(text))


def _sentences(doc: str, keep_newlines: bool) -> list[str]:
    """Sentences of a cleaned document: cut at blingfire's sentence starts and at paragraph starts, but
    only where whitespace precedes the cut, so the sentences' tokens concatenated are the document's
    tokens for any tokenizer that splits words at whitespace (WordPiece, SentencePiece)."""
    cuts = [c for c in sentence_starts(doc).tolist() if doc[c - 1].isspace()]
    bounds = [0, *cuts, len(doc)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        s = doc[a:b]
        t = s.strip()
        if t:
            out.append(t + "\n" if keep_newlines and s.endswith("\n") else t)
    return out


def _encode_key(
    tok: Tokenizer, docs: list[str], split: bool, keep_newlines: bool, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, unit lengths, units per doc) for one key of a chunk: one ``encode_batch`` call over all
    documents (or all sentences) of the chunk."""
    if split:
        units, upp_list = [], []
        for d in docs:
            ss = _sentences(d, keep_newlines) if d else []
            units.extend(ss)
            upp_list.append(len(ss))
        upp = np.asarray(upp_list, dtype=np.int32)
    else:
        units = docs
        upp = np.ones(len(docs), dtype=np.int32)
    ids = tok.encode_batch(units) if units else []
    lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
    tokens = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    # empty sentences (and a document that tokenizes to nothing) give no sequence, as in Megatron's encoder
    # (`if len(sentence_ids) > 0`); the document itself is still closed by the writer, so it stays countable
    if len(lengths) and (lengths == 0).any():
        keep = lengths > 0
        owner = np.repeat(np.arange(len(upp)), upp)
        upp = np.bincount(owner[keep], minlength=len(upp)).astype(np.int32)
        lengths = lengths[keep]
    return tokens, lengths, upp


def encode_chunk(chunk: Chunk) -> ChunkResult:
    st: EncodeSettings = _STATE["settings"]
    tok: Tokenizer = _STATE["tokenizer"]
    dtype = np.dtype(st.dtype)
    keys: dict[str, KeyResult] = {}
    for key in st.json_keys:
        docs = [doc_text(p.texts[key], p.kind) if p.texts.get(key) else "" for p in chunk.pieces]
        tokens, lengths, upp = _encode_key(tok, docs, st.split_sentences, st.keep_newlines, dtype)
        keys[key] = KeyResult(tokens, lengths, upp)
    return ChunkResult(
        chunk.file_idx,
        keys,
        chunk.last,
        chunk.reader_log,
        chunk.nchars,
        len(chunk.pieces),
        [p.doc_end for p in chunk.pieces],
        [p.where for p in chunk.pieces],
    )
