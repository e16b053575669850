"""``--measure tiles``: ``triton_block``'s launch parameters swept on one GPU: for each (query tile, key tile, warps,
pipeline stages) and layout, forward + backward time against dense SDPA (unmasked, torch's own backend choice) in
the same run and the same step (benchmarks/attention/steps.py), so one short GPU window says which configuration to
ship in ``tile_config`` (model/attention/kernels/triton_block/).

    python -m benchmarks.attention --measure tiles --cases blockbert_n2@4096,8192 --json out/tiles.json   # on a GPU
    TRITON_INTERPRET=1 python -m benchmarks.attention --measure tiles --device cpu --dtype fp32 --batch 1 \\
        --cases local_bi_b64@128 --configs 32x32:4:1 --repeats 1                                      # CPU smoke

A configuration the GPU cannot launch (shared memory, registers) is recorded with its error and the sweep goes on.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.attention.layouts import HEAD_DIM, HEADS, TUNED_LAYOUTS
from benchmarks.attention.steps import DTYPES, fused_qkv, make_step, paired_times
from benchmarks.report import write_json
from benchmarks.support.cases import by_length
from model.attention import BlockSparseAttention, layout_density
from model.attention.kernels import KERNELS

DEFAULT_CONFIGS = ["64x64:4:2", "64x64:4:3", "128x64:4:2", "128x64:8:2", "128x64:8:3", "64x128:4:2", "128x128:8:2"]
"""QxK:warps:stages: the shipped 64x64:4:2 first, then the tiles FlashAttention-style Triton kernels use on
sm80/sm90."""


@dataclass(frozen=True)
class Launch:
    tile_m: int
    tile_n: int
    num_warps: int
    num_stages: int

    @classmethod
    def parse(cls, spec: str) -> "Launch":
        """``128x64:8:3`` -> query tile 128, key tile 64, 8 warps, 3 stages."""
        try:
            tiles, warps, stages = spec.split(":")
            m, n = tiles.lower().split("x")
            launch = cls(int(m), int(n), int(warps), int(stages))
        except ValueError:
            raise ValueError(f"--configs {spec!r}: write QxK:WARPS:STAGES, e.g. 128x64:8:3") from None
        for v in (launch.tile_m, launch.tile_n):
            if v < 16 or v & (v - 1):
                raise ValueError(f"--configs {spec!r}: tiles are powers of two >= 16 (tl.dot's minimum)")
        return launch

    def __str__(self) -> str:
        return f"{self.tile_m}x{self.tile_n}:{self.num_warps}:{self.num_stages}"


def sweep(args: argparse.Namespace) -> list[dict]:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    kernel = KERNELS["triton_block"]
    saved = (kernel.tile, kernel.tile_n, kernel.launch)
    rows: list[dict] = []
    try:
        for n, lnames in by_length(args.cases):
            qkv = fused_qkv(args.batch, HEADS, n, HEAD_DIM, device, dtype)
            dense = make_step(F.scaled_dot_product_attention, qkv)
            for lname in lnames:
                for spec in args.configs:
                    launch = Launch.parse(spec)
                    kernel.tile, kernel.tile_n = launch.tile_m, launch.tile_n
                    kernel.launch = (launch.num_warps, launch.num_stages)
                    mod = BlockSparseAttention(TUNED_LAYOUTS[lname](), kernel="triton_block", max_seq_length=n)
                    mod = mod.to(device)
                    step = make_step(lambda a, b, c, mod=mod: mod(a, b, c), qkv)
                    row = dict(layout=lname, n=n, config=str(launch), density=layout_density(mod.layout_for(n)))
                    try:
                        t = paired_times(step, dense, device, args.repeats)
                        row.update(t, ratio=t["time_best_s"] / t["dense_time_best_s"])
                        print(
                            f"N={n:5d} {lname:14s} {launch!s:12s} {t['time_best_s'] * 1e3:8.2f} ms vs dense "
                            f"{t['dense_time_best_s'] * 1e3:8.2f} ms = {row['ratio']:.3f}x "
                            f"(density {row['density']:.3f})",
                            flush=True,
                        )
                    except Exception as e:  # a launch the GPU refuses (shared memory, registers): record, go on
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                        print(f"N={n:5d} {lname:14s} {launch!s:12s} failed: {row['error']}", flush=True)
                    rows.append(row)
                    if args.json:
                        _write(args.json, rows, False)
            del qkv
    finally:
        kernel.tile, kernel.tile_n, kernel.launch = saved
    return rows


def best(rows: list[dict]) -> dict[str, str]:
    """Per layout and N, the configuration with the lowest time."""
    out: dict[str, tuple[float, str]] = {}
    for r in rows:
        if "ratio" in r:
            key = f"{r['layout']}@{r['n']}"
            if key not in out or r["ratio"] < out[key][0]:
                out[key] = (r["ratio"], r["config"])
    return {k: f"{c} ({ratio:.3f}x dense)" for k, (ratio, c) in out.items()}


def _write(path: str, rows: list[dict], complete: bool) -> None:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    write_json(path, {"device": name, "qkv": "fused_views", "rows": rows, "best": best(rows), "complete": complete})


def command(args: argparse.Namespace) -> int:
    """``--measure tiles``: the sweep, its JSON (``--json``) and the best configuration per layout; exit 1 when a
    configuration failed."""
    from common.errors import UserError
    from common.outputs import check_file_writable

    for spec in args.configs:
        try:
            Launch.parse(spec)
        except ValueError as e:
            raise UserError(str(e)) from None
    if args.json:
        check_file_writable(args.json, "--json")
    rows = sweep(args)
    if args.json:
        _write(args.json, rows, True)
    print(json.dumps(best(rows), indent=1))
    return 0 if rows and all("error" not in r for r in rows) else 1
