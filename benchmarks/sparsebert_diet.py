"""Forward+backward time of SparseBERT token masks, DIET biases and the DAM search step, relative to unmasked dense
SDPA at the same shape (each row's ratio is paired: case and baseline run alternately, so load hits both alike).

    .venv/bin/python -m benchmarks.sparsebert_diet --seq-length 512 --batch 2 --repeats 3 --out out/sparsebert_diet.json

Rows: each mask on ``dense`` (SDPA with the element mask) and ``block_gather`` (skips blocks the mask leaves empty,
element mask inside partial blocks); DIET-ABS/REL and per-head segment biases on both kernels; DAM's gated O(n^2)
attention (the search step) vs dense.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from common.cli import add_deprecated_alias
from model.attention import BlockSparseAttention
from model.attention import sparsebert as S
from model.positions import PositionalAttention, PositionConfig

HEADS, HEAD_DIM = 12, 64


def _time_paired(fn: Callable[[], torch.Tensor], base: Callable[[], torch.Tensor], repeats: int) -> tuple[float, float]:
    """Median times of ``fn`` and of the baseline, run alternately (load from other processes hits both alike)."""
    fn()  # warm-up (plans, caches)
    base()
    ts, tb = [], []
    for _ in range(repeats):
        for f, acc in ((base, tb), (fn, ts)):
            t0 = time.perf_counter()
            f()
            acc.append(time.perf_counter() - t0)
    return statistics.median(ts), statistics.median(tb)


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.errors.run_entry)."""
    from common.errors import run_entry

    return run_entry("benchmarks.sparsebert_diet", _main, argv)


def _main(argv: list[str]) -> int:
    from common.errors import write_errors
    from common.outputs import atomic_file, check_file_writable

    p = argparse.ArgumentParser(prog="benchmarks.sparsebert_diet", description=__doc__.splitlines()[0])
    add_deprecated_alias(p, p.add_argument("--seq-length", dest="seq_len", type=int, default=512), "--seq-len")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--patterns",
        nargs="+",
        default=["no_diagonal", "longformer", "bigbird", "star", "fixed"],
        choices=S.pattern_names("fixed"),
        help="token masks (fixed ones: the registry's) to time",
    )
    p.add_argument("--masks-only", action="store_true", help="skip the DIET-bias and DAM rows")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if a.out:
        check_file_writable(a.out, "--out")  # before the timings
    if a.threads:
        torch.set_num_threads(a.threads)
    n, B = a.seq_len, a.batch
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, HEADS, n, HEAD_DIM, generator=g).requires_grad_() for _ in range(3))
    go = torch.randn(B, HEADS, n, HEAD_DIM, generator=g)

    def step(f: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def run():
            out = f()
            torch.autograd.grad(out, (q, k, v), go)
            return out

        return run

    base_fn = step(lambda: F.scaled_dot_product_attention(q, k, v))
    rows = []

    def add(
        name: str,
        kernel: str,
        f: Callable[[], torch.Tensor],
        sparsity: float | None = None,
        block_density: float | None = None,
    ) -> None:
        t, base = _time_paired(step(f), base_fn, a.repeats)
        rows.append(
            {
                "case": name,
                "kernel": kernel,
                "time_s": round(t, 4),
                "dense_sdpa_s": round(base, 4),
                "ratio_vs_dense_sdpa": round(t / base, 3),
                "mask_sparsity": sparsity,
                "block_density": block_density,
            }
        )
        print(f"{name:28s} {kernel:13s} {t * 1e3:8.1f} ms  x{t / base:5.2f}", flush=True)

    for pattern in a.patterns:
        m = S.make_pattern(S.TokenMaskConfig.from_dict(dict(pattern=pattern)), HEADS, n)
        bd = float(S.block_layout_from_mask(m, 16).float().mean())
        for kernel in ("dense", "block_gather"):
            mod = BlockSparseAttention(None, kernel, n, fixed_token_mask=m, mask_block=16)
            add(f"mask:{pattern}", kernel, lambda mod=mod: mod(q, k, v), round(S.sparsity(m), 4), round(bd, 4))
    seg = torch.zeros(B, n, dtype=torch.long)
    seg[:, n // 2 :] = 1
    star = S.make_pattern(S.TokenMaskConfig.from_dict(dict(pattern="star")), HEADS, n)
    biases = [
        ("diet_abs(128)", PositionConfig(type="diet_abs", rank=128), "input"),
        ("diet_rel(128)", PositionConfig(type="diet_rel"), "input"),
        ("segment_per_head", PositionConfig(), "per_head"),
    ]
    for label, pos, segment in [] if a.masks_only else biases:
        pa = PositionalAttention(pos, segment, 1, HEADS, n, 2)
        for kernel, mask in (("dense", None), ("block_gather", star)):
            mod = BlockSparseAttention(None, kernel, n, fixed_token_mask=mask, mask_block=16)
            name = f"bias:{label}" + ("+star" if mask is not None else "")
            add(name, kernel, lambda mod=mod, pa=pa: mod(q, k, v, score_bias=pa.biases(pa(n, seg, B))[0]))
    if not a.masks_only:
        dam = S.DAMMask(S.DAMConfig(), 1, HEADS, n).train()
        add("dam_search(gated)", "gated", lambda: S.gated_attention(q, k, v, dam()[0], None, 0.0, None))
    result = {
        "machine": "2-core CPU dev box, shared, no GPU" if not torch.cuda.is_available() else "cuda",
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seq_len": n,
        "batch": B,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "dtype": "float32",
        "rows": rows,
    }
    if a.out:
        with write_errors(f"--out {a.out}", a.out.parent), atomic_file(a.out) as tmp:
            tmp.write_text(json.dumps(result, indent=1))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
