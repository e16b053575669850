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

from data_pipeline.readers import KIND_WIKITEXT, BadInputLog
from data_pipeline.text import split_lines, split_sentences
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
    _STATE["tokenizer"] = tokenizer or build_tokenizer(settings.tokenizer_type, settings.vocab_file,
                                                      settings.tokenizer_model)


def _units(text: str, kind: str, split: bool, keep_newlines: bool) -> list[str]:
    if kind == KIND_WIKITEXT:
        text = wikitext_to_text(text)
    paras = split_lines(text)
    if not split:
        return ["\n".join(paras)] if paras else []
    out: list[str] = []
    for p in paras:
        sents = split_sentences(p)
        if keep_newlines and sents:
            sents[-1] += "\n"
        out.extend(sents)
    return out


def encode_chunk(chunk: Chunk) -> ChunkResult:
    st: EncodeSettings = _STATE["settings"]
    tok: Tokenizer = _STATE["tokenizer"]
    dtype = np.dtype(st.dtype)
    keys: dict[str, KeyResult] = {}
    for key in st.json_keys:
        units: list[str] = []
        per_piece: list[int] = []
        for piece in chunk.pieces:
            text = piece.texts.get(key)
            us = _units(text, piece.kind, st.split_sentences, st.keep_newlines) if text else []
            units.extend(us)
            per_piece.append(len(us))
        ids = tok.encode_batch(units) if units else []
        lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
        upp = np.asarray(per_piece, dtype=np.int32)
        if len(lengths) and (lengths == 0).any():  # Megatron drops empty sentences too
            keep = lengths > 0
            owner = np.repeat(np.arange(len(upp)), upp)
            upp = np.bincount(owner[keep], minlength=len(upp)).astype(np.int32)
            lengths = lengths[keep]
        keys[key] = KeyResult(tokens, lengths, upp)
    return ChunkResult(chunk.file_idx, keys, chunk.last, chunk.reader_log, chunk.nchars, len(chunk.pieces),
                       [p.doc_end for p in chunk.pieces], [p.where for p in chunk.pieces])
