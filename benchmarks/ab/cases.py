"""The A/B's case bodies, run as a script in a fresh process per (side, case, round):
``python benchmarks/ab/cases.py --root ROOT --case NAME``. ROOT (the working tree or the base commit's worktree) goes
first on ``sys.path`` and is the working directory, so the product code that runs is that side's; this file imports
nothing of the harness. Prints one JSON line: ``{"value": seconds or ratio}`` or ``{"skip": why}``.

Cases call product APIs that exist at bf3efde (model/, data_pipeline/); a case whose API a side lacks says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ATTN = {"H": 12, "N": 3072, "D": 64}
"""The issue #53 attention shape: 12 heads, N=3072, head 64, fp32, batch 1, forward + backward."""
FAMILY_N = 512
"""The other layout families run at N=512 (every family's default block divides it; at N=3072 each takes minutes on
a busy 2-core host)."""
BLOCKBERT_SPLITS = {2: "10:2", 3: "8:2:2"}


def corpus() -> Path | None:
    """The shared corpus (SPARSEBERT_CORPUS or /work/shared/corpus), None when absent."""
    p = Path(os.environ.get("SPARSEBERT_CORPUS", "/work/shared/corpus"))
    return p if (p / "vocab" / "bert-base-uncased" / "vocab.txt").exists() else None


def _time(fn, reps: int) -> float:
    fn()  # warm-up: plans, caches, allocator
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _attention_ratio(sparsity, N: int, reps: int) -> float:
    """block_gather fwd+bwd over dense SDPA fwd+bwd on the same q/k/v, interleaved, median of the per-rep ratios."""
    import torch
    import torch.nn.functional as F

    from model.attention import BlockSparseAttention

    H, D = ATTN["H"], ATTN["D"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, generator=g).requires_grad_() for _ in range(3))
    mod = BlockSparseAttention(sparsity, "block_gather", N)

    def run(f):
        f(q, k, v).sum().backward()
        q.grad = k.grad = v.grad = None

    def dense(a, b, c):
        return F.scaled_dot_product_attention(a, b, c)

    run(mod)
    run(dense)
    ratios = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run(dense)
        t1 = time.perf_counter()
        run(mod)
        ratios.append((time.perf_counter() - t1) / (t1 - t0))
    return statistics.median(ratios)


def blockbert(n: int, reps: int) -> float:
    from model.attention import BlockBERTSparsityConfig

    return _attention_ratio(BlockBERTSparsityConfig(ATTN["H"], n, BLOCKBERT_SPLITS[n]), ATTN["N"], reps)


def layout_family(mode: str, reps: int) -> float | str:
    from model.attention.layouts import BLOCK_LAYOUTS

    if mode not in BLOCK_LAYOUTS:
        return f"layout mode {mode!r} is not registered on this side"
    return _attention_ratio(BLOCK_LAYOUTS[mode](ATTN["H"]), FAMILY_N, reps)


def train_step(sparsity: dict | None, reps: int) -> float:
    """One optimizer step (forward, MLM loss, backward, AdamW) of a 2-layer, 128-wide, 4-head model with a 2,048
    word vocabulary, batch 2 x 512."""
    import torch

    from model.bert import BertForPreTraining
    from model.config import AttentionConfig, ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=2048,
        hidden_size=128,
        num_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        attention=AttentionConfig(kernel="auto", sparsity=sparsity),
    )
    model = BertForPreTraining(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, cfg.vocab_size, (2, 512))
    labels = torch.full_like(ids, -100)
    labels[:, ::7] = ids[:, ::7]

    def step():
        opt.zero_grad(set_to_none=True)
        model(ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
        opt.step()

    return _time(step, reps)


def dataloader(reps: int) -> float | str:
    """Batches of 8 x 512 from the corpus's Megatron shards (sentence level), in-process (num_workers=0): the
    sample index build plus 250 batches of masking and collation (~0.2 s: 40 batches, ~40 ms, were within the noise of a
    loaded host)."""
    root = corpus()
    if root is None:
        return "no shared corpus (SPARSEBERT_CORPUS)"
    from data_pipeline.batching import build_dataloader
    from data_pipeline.data_config import DataConfig
    from data_pipeline.datasets import build_datasets
    from data_pipeline.tokenization import build_tokenizer

    tok = build_tokenizer("BertWordPieceLowerCase", str(root / "vocab" / "bert-base-uncased" / "vocab.txt"))
    prefix = str(root / "megatron-shards" / "wiki60_text_sentence")

    def run():
        with tempfile.TemporaryDirectory() as cache:
            cfg = DataConfig(data_path=[prefix], split="1,0,0", seq_length=512, cache_dir=cache)
            train = build_datasets(cfg, tok, num_samples=(10**6, 0, 0))[0]
            it = iter(build_dataloader(train, tok, cfg, micro_batch_size=8, dp_rank=0, dp_world_size=1, num_workers=0))
            for _ in range(250):
                next(it)

    return _time(run, reps)


def preprocess(split_sentences: bool, reps: int) -> float | str:
    """``python -m data_pipeline.preprocess`` (the whole command) on two books and one WikiExtractor file."""
    root = corpus()
    if root is None:
        return "no shared corpus (SPARSEBERT_CORPUS)"
    inputs = [
        str(root / "books" / "pg11_alices_adventures_in_wonderland.txt"),
        str(root / "books" / "pg46_a_christmas_carol.txt"),
        str(root / "wiki" / "wikiextractor" / "AA" / "wiki_00"),
    ]

    def run():
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "data_pipeline.preprocess", "--input", *inputs, "--output-prefix"]
            cmd += [f"{out}/x", "--tokenizer-type", "BertWordPieceLowerCase", "--workers", "1"]
            cmd += ["--vocab-file", str(root / "vocab" / "bert-base-uncased" / "vocab.txt"), "--no-progress"]
            cmd += ["--split-sentences"] if split_sentences else []
            subprocess.run(cmd, check=True, capture_output=True)

    return _time(run, reps)


def wiki_reader(reps: int) -> float | str:
    """``data_pipeline.readers.read_mediawiki`` over the shortened enwiki dump (bz2, every page)."""
    root = corpus()
    if root is None:
        return "no shared corpus (SPARSEBERT_CORPUS)"
    from data_pipeline.readers import BadInputLog, read_mediawiki

    dump = str(root / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
    return _time(lambda: sum(1 for _ in read_mediawiki(dump, ["text"], BadInputLog())), reps)


def layout_modes() -> list[str]:
    """The registered layout modes other than BlockBERT (the registry of the side this runs on)."""
    from model.attention.layouts import BLOCK_LAYOUTS

    return sorted(m for m in BLOCK_LAYOUTS if m != "blockbert")


def run_case(name: str, reps: int):
    if name.startswith("attention/blockbert_n"):
        return blockbert(int(name[-1]), reps)
    if name.startswith("attention/"):
        return layout_family(name.split("/", 1)[1], reps)
    if name == "train_step/dense":
        return train_step(None, reps)
    if name == "train_step/blockbert_n2":
        return train_step({"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16}, reps)
    if name == "dataloader":
        return dataloader(reps)
    if name.startswith("preprocess/"):
        return preprocess(name.endswith("sentence"), reps)
    if name == "wiki_reader":
        return wiki_reader(reps)
    raise SystemExit(f"unknown case {name!r}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--case", required=True)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    sys.path[0] = a.root  # this side's product code, not the script's folder
    os.chdir(a.root)
    if a.case == "list-layouts":
        print(json.dumps({"layouts": layout_modes()}))
        return
    got = run_case(a.case, a.reps)
    print(json.dumps({"skip": got} if isinstance(got, str) else {"value": got}))


if __name__ == "__main__":
    main()
