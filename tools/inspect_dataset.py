"""``python -m tools.inspect_dataset PREFIX [PREFIX ...]``: what is in a Megatron shard.
``python -m tools.inspect_dataset samples --data-path ... --tokenizer-type ...``: the training samples built from
shards (sample index, fill ratio, masking statistics, decoded masked samples; docs/samples.md).

Prints counts (documents, sequences, tokens), length histograms of sequences and documents, and
decodes the first few documents back to text (with a tokenizer: ``--vocab-file`` or
``--tokenizer-model``; without one, token ids are shown). Works on shards written by us or by Megatron.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

import numpy as np

from common.cli import HelpFormatter, add_flags, build
from common.error_exit import run_entry
from common.outputs import check_dir_writable
from data_pipeline.collate import Collator
from data_pipeline.data_config import DataConfig, DataConfigError
from data_pipeline.datasets import build_datasets, check_shard_vocab
from data_pipeline.indexed import IndexedDataset
from data_pipeline.stats import dataset_stats
from data_pipeline.tokenization import TOKENIZER_TYPES, build_tokenizer


def histogram(values: np.ndarray, bins: int = 10, width: int = 40) -> list[str]:
    """A text histogram on power-of-two bucket edges (lengths span orders of magnitude)."""
    if len(values) == 0:
        return ["  (empty)"]
    hi = max(int(values.max()), 1)
    edges = [0] + [2**k for k in range(0, int(np.ceil(np.log2(hi + 1))) + 1)]
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
    out = [
        f"{prefix}: dtype {ds.dtype}, {ds.num_documents:,} documents, {len(ds):,} sequences, "
        f"{ds.num_tokens:,} tokens{' (multimodal)' if ds.multimodal else ''}"
    ]
    if len(seq):
        out.append(
            f"sequence length: min {seq.min()}, mean {seq.mean():.1f}, median {np.median(seq):.0f}, max {seq.max()}"
        )
        out.append(f"sequences per document: mean {np.diff(docs).mean():.1f}, max {np.diff(docs).max()}")
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
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.inspect_dataset", _main, argv)


def _main(argv: list[str]) -> int:
    if argv[:1] == ["samples"]:
        return samples_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m tools.inspect_dataset", description=__doc__.split("\n\n")[0])
    p.add_argument("prefix", nargs="+", help="shard prefix (path without .bin/.idx)")
    p.add_argument(
        "--tokenizer-type",
        default=None,
        choices=TOKENIZER_TYPES,
        help="default: BertWordPieceLowerCase with --vocab-file, SentencePieceTokenizer with --tokenizer-model",
    )
    p.add_argument("--vocab-file", default=None)
    p.add_argument("--tokenizer-model", default=None)
    p.add_argument("--num-docs", type=int, default=2, help="documents to decode")
    p.add_argument("--max-chars", type=int, default=400)
    a = p.parse_args(argv)
    tok = None
    if a.vocab_file or a.tokenizer_model:
        ttype = a.tokenizer_type or ("BertWordPieceLowerCase" if a.vocab_file else "SentencePieceTokenizer")
        tok = build_tokenizer(ttype, a.vocab_file, a.tokenizer_model)
    for prefix in a.prefix:
        for suffix in (".bin", ".idx"):
            if prefix.endswith(suffix):
                prefix = prefix[: -len(suffix)]
        if tok is not None:
            check_shard_vocab(prefix, tok)  # decoding with another vocabulary would show other words
        print(describe(prefix, tok, a.num_docs, a.max_chars))
    return 0


SAMPLES_OWN_FLAGS = ("tokenizer_type", "vocab_file", "tokenizer_model", "split_name", "stats", "stats_samples", "show")
"""The ``samples`` flags that are not DataConfig fields (every other flag is generated from DataConfig)."""


def samples_parser() -> argparse.ArgumentParser:
    """The ``samples`` command line: every data setting generated from :class:`DataConfig` (common.cli, the
    trainer's names and help texts), plus the tokenizer and what to print."""
    p = argparse.ArgumentParser(
        prog="python -m tools.inspect_dataset samples",
        description="Build (and cache) the sample index of shards; print statistics.",
        formatter_class=HelpFormatter,
    )
    add_flags(p, DataConfig)
    p.add_argument("--split-name", default="train", choices=("train", "valid", "test"), help="which split to describe")
    p.add_argument("--tokenizer-type", required=True, help="data_pipeline.tokenization type")
    p.add_argument("--vocab-file", default=None, help="WordPiece vocab file")
    p.add_argument("--tokenizer-model", default=None, help="SentencePiece / HF tokenizer model")
    p.add_argument("--stats", action="store_true", help="print statistics as JSON")
    p.add_argument(
        "--stats-samples",
        type=int,
        default=20000,
        help="how many samples to mask for the masking statistics (fill ratio uses all)",
    )
    p.add_argument("--show", type=int, default=0, metavar="K", help="decode K masked samples")
    return p


def _samples_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = samples_parser()
    args = p.parse_args(argv)
    if not args.data_path:
        p.error("--data-path is required: a shard prefix, or weights and prefixes (0.25 books 0.75 wiki)")
    return args


def samples_main(argv: Sequence[str] | None = None) -> int:
    """``samples``: build (and cache) the sample index of shards; print statistics or decoded masked samples."""
    return run_entry("tools.inspect_dataset", _samples_main, argv)


def _samples_main(argv: Sequence[str]) -> int:
    args = _samples_args(argv)

    tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_file, args.tokenizer_model)
    if args.cache_dir:  # asked for: refused when unwritable (the default, beside the shards, may be read-only)
        check_dir_writable(args.cache_dir, "--cache-dir")
    try:
        config = build(DataConfig, args)
        t0 = time.perf_counter()
        # verbose: where each index was built and cached, or why it could not be cached (a full or read-only disk)
        splits = dict(zip(("train", "valid", "test"), build_datasets(config, tokenizer, verbose=True)))
        build_s = time.perf_counter() - t0
    except ValueError as e:  # DataConfig's own checks
        raise DataConfigError(str(e)) from None
    ds = splits[args.split_name]
    if ds is None:
        raise DataConfigError(f"--split-name {args.split_name}: that split is empty with --split {args.split}")
    collator = Collator(tokenizer, config)
    if args.stats:
        stats = dataset_stats(ds, collator, max_masked_samples=args.stats_samples)
        stats["index_seconds"] = round(build_s, 4)
        print(json.dumps(stats, indent=1))
    if args.show:
        batch = collator(ds.__getitems__(list(range(min(args.show, len(ds))))))
        for row in range(batch["input_ids"].shape[0]):
            ids = batch["input_ids"][row]
            labels = batch["labels"][row]
            n = int(batch["attention_mask"][row].sum())
            pieces = []
            for pos in range(n):
                tok = tokenizer.id_to_token(int(ids[pos]))
                if int(labels[pos]) != -100:
                    orig = tokenizer.id_to_token(int(labels[pos]))
                    tok = f"<<{tok}|{orig}>>" if tok != orig else f"<<={tok}>>"
                pieces.append(tok)
            nsp = batch.get("next_sentence_label")
            extra = "" if nsp is None else f" next_sentence_label={int(nsp[row])}"
            print(f"--- sample {row} ({n} tokens){extra}")
            print(" ".join(pieces))
    return 0


if __name__ == "__main__":
    sys.exit(main())
