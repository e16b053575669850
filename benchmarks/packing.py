"""Packing benchmark: fill and mid-sentence starts of every sample mode at N = 128 / 512 / 1024, and what an
unpadded (varlen) attention kernel would save on packed and on padded batches, timed on this machine's CPU.

    .venv/bin/python -m benchmarks.packing                       # shards built once from ../shared/corpus
    .venv/bin/python -m benchmarks.packing --work-dir DIR --seq-lengths 512

Per shard, mode and N: samples, index build seconds (no cache), fill (real tokens incl. specials / N, what the
trainer's batches hold), the share of samples whose text starts inside a sentence, and for packed-docs the
documents (pieces) per sample. The attention part takes the first B samples of packed-docs and doc-sentences at
one N and times forward + backward of the dense kernel over the padded ``[B, H, N, N]`` problem (packed: with the
document mask) against what a varlen kernel computes: one SDPA call per document, no padding, no cross-document
scores (emulated by a loop of SDPA forward + backward calls over each document's own q/k/v, so the per-call
overhead counts against it).
Prints one JSON object; figures go to docs/samples.md with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.dataloader import CORPUS, _corpus_shards
from data_pipeline.datasets import ShardSplit
from data_pipeline.indexed import IndexedDataset
from data_pipeline.samples import MODES, PACKED, SampleIndexConfig, build_sample_index
from model.attention.module import BlockSparseAttention


def mode_stats(prefix: str, mode: str, N: int) -> dict:
    ds = IndexedDataset(prefix)
    cfg = SampleIndexConfig(seq_length=N, sample_mode=mode)
    t0 = time.perf_counter()
    idx = build_sample_index(ds, (0, ds.num_documents), cfg)
    build = time.perf_counter() - t0
    split = ShardSplit(prefix, (0, ds.num_documents), idx, mode, 101, 102)
    lengths = split.sample_lengths()
    sentence_starts = np.asarray(ds.sequence_pointers) // ds.dtype.itemsize
    out = {
        "samples": len(split),
        "build_s": round(build, 3),
        "fill": round(float(lengths.mean() / N), 4),
        "mid_sentence_start": round(float((~np.isin(split.sample_text_starts(), sentence_starts)).mean()), 4),
    }
    if mode == PACKED:
        out["docs_per_sample"] = round(len(idx) / len(split), 2)
        out["pieces_mid_sentence"] = round(float((~np.isin(idx[:, 0], sentence_starts)).mean()), 4)
    return out


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def attention_times(prefix: str, N: int, B: int, H: int, D: int, repeats: int) -> dict:
    """ms per forward + backward: padded dense (+ document mask) vs per-document unpadded SDPA (varlen)."""
    ds = IndexedDataset(prefix)
    out = {}
    for mode in (PACKED, "doc-sentences"):
        idx = build_sample_index(ds, (0, ds.num_documents), SampleIndexConfig(seq_length=N, sample_mode=mode))
        split = ShardSplit(prefix, (0, ds.num_documents), idx, mode, 101, 102)
        lens = [split.doc_lengths(s) if mode == PACKED else np.array([split.sample_lengths()[s]]) for s in range(B)]
        doc = torch.full((B, N), -1, dtype=torch.int64)
        for b, ls in enumerate(lens):
            doc[b, : int(ls.sum())] = torch.from_numpy(np.repeat(np.arange(len(ls)), ls))
        kpm = doc >= 0
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, generator=g, requires_grad=True) for _ in range(3))
        mod = BlockSparseAttention(None, kernel="dense", max_seq_length=N)

        def padded():
            o = mod(q, k, v, key_padding_mask_BN=kpm, doc_ids_BN=doc if mode == PACKED else None)
            o.sum().backward()

        segs = [(b, int(s), int(s + n)) for b, ls in enumerate(lens) for s, n in zip(np.cumsum(ls) - ls, ls)]
        # each document its own contiguous leaf tensors, as a varlen kernel reads them (slicing the padded q/k/v
        # here would make every slice's backward write a full-size zero gradient)
        docs_qkv = [[t[b : b + 1, :, s:e].detach().clone().requires_grad_() for t in (q, k, v)] for b, s, e in segs]

        def varlen():
            for dq, dk, dv in docs_qkv:
                F.scaled_dot_product_attention(dq, dk, dv).sum().backward()

        real = int(kpm.sum())
        same_doc_scores = sum((e - s) ** 2 for _, s, e in segs)
        out[mode] = {
            "fill": round(real / (B * N), 4),
            "documents": len(segs),
            "scores_varlen_over_padded": round(same_doc_scores / (B * N * N), 4),
            "padded_dense_ms": round(1e3 * _time(padded, repeats), 1),
            "varlen_loop_ms": round(1e3 * _time(varlen, repeats), 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    from common.error_exit import run_entry

    return run_entry("benchmarks.packing", _main, argv)


def _main(argv: list[str]) -> int:
    from common.outputs import check_dir_writable
    from data_pipeline.tokenization import build_tokenizer

    p = argparse.ArgumentParser(
        prog="benchmarks.packing", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vocab-file", default=str(CORPUS / "vocab" / "bert-base-uncased" / "vocab.txt"))
    p.add_argument("--work-dir", default="/tmp/sparsebert_bench_samples")
    p.add_argument("--seq-lengths", type=int, nargs="+", default=[128, 512, 1024])
    p.add_argument("--attention-seq-length", type=int, default=512)
    p.add_argument("--attention-batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attention-only", action="store_true", help="skip the fill table")
    args = p.parse_args(argv)
    build_tokenizer("BertWordPieceLowerCase", args.vocab_file)  # before preprocessing the corpus with it
    check_dir_writable(args.work_dir, "--work-dir")
    result: dict = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "load_average_before": os.getloadavg(),
    }
    shards = _corpus_shards(Path(args.work_dir), args.vocab_file)
    for name, (prefix, _) in shards.items() if not args.attention_only else ():
        result[name] = {f"{mode}@{N}": mode_stats(prefix, mode, N) for N in args.seq_lengths for mode in MODES}
    result["attention"] = {
        name: attention_times(prefix, args.attention_seq_length, args.attention_batch, 12, 64, args.repeats)
        for name, (prefix, _) in shards.items()
    }
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
