"""``--measure masks``: forward+backward time of SparseBERT token masks, DIET biases and the DAM search step,
relative to unmasked dense SDPA at the same shape (docs/sparsebert_diet.md, "Speed").

Each row's ratio is paired: case and baseline run alternately (load hits both alike), in the same step
(benchmarks/attention/steps.py: q/k/v as views of one fused projection, no dropout on either side); the mask, bias or
gate is what the case adds. Rows: each mask on ``dense`` (SDPA with the element mask) and ``block_gather`` (skips
blocks the mask leaves empty, element mask inside partial blocks); DIET-ABS/REL and per-head segment biases on both
kernels (``block_gather`` with the star mask); DAM's gated O(n^2) attention (the search step).
"""

from __future__ import annotations

import argparse
import platform
from typing import Callable

import torch
import torch.nn.functional as F

from benchmarks.attention.layouts import HEAD_DIM, HEADS
from benchmarks.attention.steps import fused_qkv, machine, make_step, paired_times
from benchmarks.report import write_json
from model.attention import BlockSparseAttention
from model.attention import sparsebert as S
from model.positions import PositionalAttention, PositionConfig

Case = tuple[str, str, Callable, "float | None", "float | None"]
"""(name, kernel, ``(q, k, v) -> out``, mask sparsity, block density)."""


def mask_cases(patterns: list[str], n: int) -> list[Case]:
    """Each token mask on ``dense`` and on ``block_gather``."""
    out: list[Case] = []
    for pattern in patterns:
        m = S.make_pattern(S.TokenMaskConfig.from_dict(dict(pattern=pattern)), HEADS, n)
        bd = round(float(S.block_layout_from_mask(m, 16).float().mean()), 4)
        for kernel in ("dense", "block_gather"):
            mod = BlockSparseAttention(None, kernel, n, fixed_token_mask=m, mask_block=16)
            out.append((f"mask:{pattern}", kernel, mod, round(S.sparsity(m), 4), bd))
    return out


def bias_cases(n: int, batch: int) -> list[Case]:
    """DIET-ABS, DIET-REL and per-head segment biases on ``dense`` and on ``block_gather`` with the star mask."""
    seg = torch.zeros(batch, n, dtype=torch.long)
    seg[:, n // 2 :] = 1
    star = S.make_pattern(S.TokenMaskConfig.from_dict(dict(pattern="star")), HEADS, n)
    biases = [
        ("diet_abs(128)", PositionConfig(type="diet_abs", rank=128), "input"),
        ("diet_rel(128)", PositionConfig(type="diet_rel"), "input"),
        ("segment_per_head", PositionConfig(), "per_head"),
    ]
    out: list[Case] = []
    for label, pos, segment in biases:
        pa = PositionalAttention(pos, segment, 1, HEADS, n, 2)
        for kernel, mask in (("dense", None), ("block_gather", star)):
            mod = BlockSparseAttention(None, kernel, n, fixed_token_mask=mask, mask_block=16)
            name = f"bias:{label}" + ("+star" if mask is not None else "")
            fn = lambda q, k, v, mod=mod, pa=pa: mod(q, k, v, score_bias=pa.biases(pa(n, seg, batch))[0])  # noqa: E731
            out.append((name, kernel, fn, None, None))
    return out


def dam_case(n: int) -> Case:
    """DAM's search step: attention probabilities gated by the soft mask (dense by nature)."""
    dam = S.DAMMask(S.DAMConfig(), 1, HEADS, n).train()
    return (
        "dam_search(gated)",
        "gated",
        lambda q, k, v: S.gated_attention(q, k, v, dam()[0], None, 0.0, None),
        None,
        None,
    )


def run(args: argparse.Namespace) -> list[dict]:
    """The rows, each timed against the unmasked dense step."""
    n, cpu = args.seq_length, torch.device("cpu")
    qkv = fused_qkv(args.batch, HEADS, n, HEAD_DIM, cpu, torch.float32)
    dense = make_step(F.scaled_dot_product_attention, qkv)
    cases = mask_cases(args.patterns, n)
    if not args.masks_only:
        cases += [*bias_cases(n, args.batch), dam_case(n)]
    rows = []
    for name, kernel, fn, sparsity, block_density in cases:
        t = paired_times(make_step(fn, qkv), dense, cpu, args.repeats)
        ratio = t["time_s"] / t["dense_time_s"]
        rows.append(
            {
                "case": name,
                "kernel": kernel,
                "time_s": round(t["time_s"], 4),
                "dense_sdpa_s": round(t["dense_time_s"], 4),
                "ratio_vs_dense_sdpa": round(ratio, 3),
                "best_ratio_vs_dense_sdpa": round(t["time_best_s"] / t["dense_time_best_s"], 3),
                "mask_sparsity": sparsity,
                "block_density": block_density,
            }
        )
        print(f"{name:28s} {kernel:13s} {t['time_s'] * 1e3:8.1f} ms  x{ratio:5.2f}", flush=True)
    return rows


def command(args: argparse.Namespace) -> int:
    """``--measure masks``: the rows, written to ``--out`` when given."""
    from common.outputs import check_file_writable

    if args.out:
        check_file_writable(args.out, "--out")  # before the timings
    rows = run(args)
    result = {
        "machine": machine("cpu"),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seq_len": args.seq_length,
        "batch": args.batch,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "dtype": "float32",
        "qkv": "fused_views",
        "rows": rows,
    }
    if args.out:
        write_json(args.out, result, "--out")
        print(f"wrote {args.out}")
    return 0
