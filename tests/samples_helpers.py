"""Shards for the sample/loader tests and benchmark: synthetic ones with known contents, and real ones
tokenized from the shared corpus (one sequence per sentence, one document per book or <doc>), written with
our Megatron-compatible builder. Kept independent of the preprocess CLI on purpose (small and fast)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import numpy as np

from data_pipeline.indexed import IndexedDatasetBuilder, best_dtype

FIRST_ID = 1000  # synthetic token ids start above BERT's specials/unused slots


def synthetic_shard(prefix: Path, docs: list[list[int]], vocab_size: int = 30522) -> Path:
    """Each token's id encodes its flat position: ``FIRST_ID + pos % (vocab_size - FIRST_ID)``."""
    span = vocab_size - FIRST_ID
    pos = 0
    with IndexedDatasetBuilder(prefix, best_dtype(vocab_size)) as b:
        for doc in docs:
            for n in doc:
                b.add_item(FIRST_ID + (np.arange(pos, pos + n) % span))
                pos += n
            b.end_document()
    return prefix


_PG_START = re.compile(r"^\s*\*{3}\s*START OF.*$", re.IGNORECASE | re.MULTILINE)
_PG_END = re.compile(r"^\s*\*{3}\s*END OF.*$", re.IGNORECASE | re.MULTILINE)


def book_paragraphs(text: str) -> list[str]:
    """Body of a Gutenberg book (between the START/END markers), one string per paragraph."""
    m = _PG_START.search(text)
    if m:
        text = text[m.end() :]
    m = _PG_END.search(text)
    if m:
        text = text[: m.start()]
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def wiki_documents(text: str) -> list[list[str]]:
    """WikiExtractor ``<doc>`` bodies as lists of paragraphs (title line dropped)."""
    out = []
    for body in re.findall(r"<doc[^>]*>(.*?)</doc>", text, flags=re.S):
        lines = [ln.strip() for ln in body.strip().split("\n")[1:] if ln.strip()]
        if lines:
            out.append(lines)
    return out


def tokenized_shard(prefix: Path, documents: Iterable[list[str]], tokenizer) -> Path:
    """Split paragraphs into sentences with blingfire, tokenize, write one sentence per sequence."""
    from blingfire import text_to_sentences

    with IndexedDatasetBuilder(prefix, best_dtype(tokenizer.vocab_size)) as b:
        for paragraphs in documents:
            sents = [s for p in paragraphs for s in text_to_sentences(p).split("\n") if s.strip()]
            if not sents:
                continue
            for ids in tokenizer.encode_batch(sents):
                b.add_item(np.asarray(ids, dtype=np.int64))
            b.end_document()
    return prefix


def books_shard(prefix: Path, corpus: Path, tokenizer, names: list[str] | None = None) -> Path:
    files = sorted((corpus / "books").glob("pg*.txt"))
    if names is not None:
        files = [f for f in files if any(n in f.name for n in names)]
    return tokenized_shard(prefix, (book_paragraphs(f.read_text(encoding="utf-8")) for f in files), tokenizer)


def wiki_shard(prefix: Path, corpus: Path, tokenizer, files: list[str] | None = None) -> Path:
    paths = sorted((corpus / "wiki" / "wikiextractor" / "AA").glob("wiki_*"))
    if files is not None:
        paths = [p for p in paths if p.name in files]
    docs = (d for p in paths for d in wiki_documents(p.read_text(encoding="utf-8")))
    return tokenized_shard(prefix, docs, tokenizer)
