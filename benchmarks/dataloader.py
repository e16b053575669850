"""Dataloader benchmark: sample-index build time against reading the corpus once, and loader samples/s.

    .venv/bin/python -m benchmarks.dataloader                      # builds shards from ../shared/corpus
    .venv/bin/python -m benchmarks.dataloader --data-path PREFIX --vocab-file VOCAB

Without ``--data-path`` the WikiExtractor set and the books of the shared corpus are preprocessed once
(``python -m data_pipeline.preprocess --split-sentences``) into ``--work-dir`` and reused on later runs.
Prints one JSON object; figures go to docs/samples.md with the machine they were measured on.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from data_pipeline.batching import build_dataloader
from data_pipeline.data_config import DataConfig
from data_pipeline.datasets import build_datasets
from data_pipeline.indexed import IndexedDataset, shard_exists
from data_pipeline.samples import SampleIndexConfig, build_sample_index
from data_pipeline.tokenization import build_tokenizer

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("SPARSEBERT_CORPUS", REPO.parent / "shared" / "corpus"))


def _corpus_shards(work_dir: Path, vocab_file: str) -> dict[str, tuple[str, list[Path]]]:
    """Shards of the shared corpus made by our preprocess CLI (once; reused from work_dir)."""
    import subprocess
    import sys

    work_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    wiki_files = sorted((CORPUS / "wiki" / "wikiextractor" / "AA").glob("wiki_*"))
    book_files = sorted((CORPUS / "books").glob("*.txt"))
    for name, files, fmt in (("wiki", wiki_files, "wikiextractor"), ("books", book_files, "text")):
        prefix = work_dir / f"{name}_text_sentence"
        if not shard_exists(prefix):
            t0 = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "data_pipeline.preprocess",
                    "--input",
                    *map(str, files),
                    "--input-format",
                    fmt,
                    "--split-sentences",
                    "--tokenizer-type",
                    "BertWordPieceLowerCase",
                    "--vocab-file",
                    vocab_file,
                    "--output-prefix",
                    str(work_dir / name),
                    "--workers",
                    "2",
                    "--no-progress",
                ],
                check=True,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
            )
            print(f"[bench] preprocessed {name} into {prefix} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        out[name] = (str(prefix), files)
    return out


def _read_text_once(files: list[Path]) -> float:
    t0 = time.perf_counter()
    n = 0
    for f in files:
        n += len(f.read_text(encoding="utf-8"))
    return time.perf_counter() - t0


def _read_tokens_once(prefix: str) -> float:
    t0 = time.perf_counter()
    ds = IndexedDataset(prefix)
    total = 0
    step = 1 << 22
    for i in range(0, ds.num_tokens, step):
        total += int(np.asarray(ds.tokens[i : i + step], dtype=np.int64).sum())
    return time.perf_counter() - t0


def bench_index(prefix: str, files: list[Path], repeats: int = 3) -> dict:
    ds = IndexedDataset(prefix)
    res = {
        "tokens": ds.num_tokens,
        "sentences": len(ds),
        "documents": ds.num_documents,
        "read_text_s": min(_read_text_once(files) for _ in range(repeats)) if files else None,
        "read_tokens_s": min(_read_tokens_once(prefix) for _ in range(repeats)),
    }
    for mode in ("doc-sentences", "full-sentences", "nsp"):
        for N in (128, 512):
            cfg = SampleIndexConfig(seq_length=N, sample_mode=mode)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                idx = build_sample_index(ds, (0, ds.num_documents), cfg)
                best = min(best, time.perf_counter() - t0)
            lens = idx[:, 1] - idx[:, 0] + idx[:, 3] - idx[:, 2] + (3 if mode == "nsp" else 2)
            res[f"{mode}@{N}"] = {
                "samples": int(len(idx)),
                "build_s": round(best, 4),
                "fill": round(float(lens.mean() / N), 4),
            }
    return res


def bench_loader(
    prefix: str, tokenizer, seq_length: int, mbs: int, workers: int, batches: int, mode: str, wwm: bool, cache_dir: str
) -> dict:
    cfg = DataConfig(
        data_path=[prefix],
        split="1,0,0",
        seq_length=seq_length,
        sample_mode=mode,
        whole_word_masking=wwm,
        cache_dir=cache_dir,
    )
    train = build_datasets(cfg, tokenizer, num_samples=(10**9, 0, 0))[0]
    loader = build_dataloader(
        train, tokenizer, cfg, micro_batch_size=mbs, dp_rank=0, dp_world_size=1, num_workers=workers
    )
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    it = iter(loader)
    warm = 4 * max(workers, 1)
    for _ in range(warm):
        next(it)
    t1 = time.perf_counter()
    n = 0
    for _ in range(batches):
        b = next(it)
        n += b["input_ids"].shape[0]
    t2 = time.perf_counter()
    it.close()  # shuts the workers down, so their CPU time is counted
    import gc

    gc.collect()
    cpu = _cpu_seconds() - cpu0
    per_sample = cpu / ((warm + batches) * mbs)
    return {
        "mode": mode,
        "whole_word_masking": wwm,
        "seq_length": seq_length,
        "micro_batch": mbs,
        "workers": workers,
        "samples_per_s": round(n / (t2 - t1)),
        "startup_s": round(t1 - t0, 2),
        "cpu_us_per_sample": round(per_sample * 1e6, 1),
        # what 2 dedicated cores would sustain if the CPU were not shared (all processes' CPU time)
        "samples_per_s_per_2_cpu_s": round(2 / per_sample),
    }


def _cpu_seconds() -> float:
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    from common.error_exit import run_entry

    return run_entry("benchmarks.dataloader", _main, argv)


def _main(argv: list[str]) -> int:
    from common.outputs import check_dir_writable
    from data_pipeline.indexed import IndexedDataset

    p = argparse.ArgumentParser(
        prog="benchmarks.dataloader", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-path", default=None, help="an existing shard prefix (default: build from the corpus)")
    p.add_argument("--vocab-file", default=str(CORPUS / "vocab" / "bert-base-uncased" / "vocab.txt"))
    p.add_argument("--work-dir", default="/tmp/sparsebert_bench_samples")
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--skip-index", action="store_true")
    args = p.parse_args(argv)

    tok = build_tokenizer("BertWordPieceLowerCase", args.vocab_file)
    if args.data_path:
        IndexedDataset(args.data_path)  # a missing or broken shard is one line, before the work
    check_dir_writable(args.work_dir, "--work-dir")
    result: dict = {"machine": "2-core CPU dev box, shared, no GPU", "load_average_before": os.getloadavg()}
    if args.data_path:
        shards = {"given": (args.data_path, [])}
    else:
        shards = _corpus_shards(Path(args.work_dir), args.vocab_file)
    if not args.skip_index:
        for name, (prefix, files) in shards.items():
            result[f"index_{name}"] = bench_index(prefix, files)
    prefix = shards.get("wiki", shards.get("given"))[0]
    cache = str(Path(args.work_dir) / "cache")
    result["loader"] = [
        bench_loader(
            prefix, tok, args.seq_length, args.micro_batch_size, args.num_workers, args.batches, mode, wwm, cache
        )
        for mode, wwm in (("doc-sentences", False), ("doc-sentences", True), ("nsp", False))
    ]
    result["loader"].append(
        bench_loader(
            prefix, tok, args.seq_length, args.micro_batch_size, 0, args.batches // 2, "doc-sentences", False, cache
        )
    )
    result["load_average_after"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
