"""``python -m tools.inspect_dataset PREFIX [PREFIX ...]``: what is in a Megatron shard.

Prints counts (documents, sequences, tokens), length histograms of sequences and documents, and
decodes the first few documents back to text (with a tokenizer: ``--vocab-file`` or
``--tokenizer-model``; without one, token ids are shown). Works on shards written by us or by Megatron.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from data_pipeline.indexed import IndexedDataset, IndexedDatasetError
from data_pipeline.tokenization import TOKENIZER_TYPES, TokenizerError, build_tokenizer


def histogram(values: np.ndarray, bins: int = 10, width: int = 40) -> list[str]:
    """A text histogram on power-of-two bucket edges (lengths span orders of magnitude)."""
    if len(values) == 0:
        return ["  (empty)"]
    hi = max(int(values.max()), 1)
    edges = [0] + [2 ** k for k in range(0, int(np.ceil(np.log2(hi + 1))) + 1)]
    counts, _ = np.histogram(values, bins=edges)
    peak = max(int(counts.max()), 1)
    lines = []
    for lo, up, c in zip(edges[:-1], edges[1:], counts):
        if c:
            lines.append(f"  [{lo:>7}, {up:>7}) {int(c):>9,} {'#' * max(1, round(width * c / peak))}")
    return lines


def describe(prefix: str, tokenizer=None, num_docs: int = 2, max_chars: int = 400) -> str:
    ds = IndexedDataset(prefix)
    seq = np.asarray(ds.sequence_lengths)
    docs = np.asarray(ds.document_indices)
    cum = np.concatenate([[0], np.cumsum(seq, dtype=np.int64)])
    doc_tokens = cum[docs[1:]] - cum[docs[:-1]]  # empty documents count 0
    out = [f"{prefix}: dtype {ds.dtype}, {ds.num_documents:,} documents, {len(ds):,} sequences, "
           f"{ds.num_tokens:,} tokens{' (multimodal)' if ds.multimodal else ''}"]
    if len(seq):
        out.append(f"sequence length: min {seq.min()}, mean {seq.mean():.1f}, median {np.median(seq):.0f}, "
                   f"max {seq.max()}")
        out.append("sequences per document: "
                   f"mean {np.diff(docs).mean():.1f}, max {np.diff(docs).max()}")
        out.append("sequence length histogram:")
        out += histogram(seq)
        out.append("document length (tokens) histogram:")
        out += histogram(np.asarray(doc_tokens))
    for d in range(min(num_docs, ds.num_documents)):
        toks = ds.document(d)
        out.append(f"--- document {d}: {len(toks):,} tokens in {int(docs[d + 1] - docs[d])} sequence(s)")
        if tokenizer is not None:
            text = tokenizer.decode(toks[:max_chars].tolist())
            out.append(text[:max_chars] + (" ..." if len(text) > max_chars or len(toks) > max_chars else ""))
        else:
            out.append(" ".join(map(str, toks[:40].tolist())) + (" ..." if len(toks) > 40 else ""))
    ds.close()
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.inspect_dataset", description=__doc__.split("\n\n")[0])
    p.add_argument("prefix", nargs="+", help="shard prefix (path without .bin/.idx)")
    p.add_argument("--tokenizer-type", default=None, choices=TOKENIZER_TYPES,
                   help="default: BertWordPieceLowerCase with --vocab-file, SentencePieceTokenizer with --tokenizer-model")
    p.add_argument("--vocab-file", default=None)
    p.add_argument("--tokenizer-model", default=None)
    p.add_argument("--num-docs", type=int, default=2, help="documents to decode")
    p.add_argument("--max-chars", type=int, default=400)
    a = p.parse_args(argv)
    tok = None
    try:
        if a.vocab_file or a.tokenizer_model:
            ttype = a.tokenizer_type or ("BertWordPieceLowerCase" if a.vocab_file else "SentencePieceTokenizer")
            tok = build_tokenizer(ttype, a.vocab_file, a.tokenizer_model)
        for prefix in a.prefix:
            for suffix in (".bin", ".idx"):
                if prefix.endswith(suffix):
                    prefix = prefix[: -len(suffix)]
            print(describe(prefix, tok, a.num_docs, a.max_chars))
    except (IndexedDatasetError, TokenizerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
