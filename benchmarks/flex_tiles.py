"""FlexAttention's tiles per layout, before and after issue 41 (exact counts from the BlockMask, any machine):

    .venv/bin/python -m benchmarks.flex_tiles --seq-lens 4096 8192

"before": the BlockMask main built (128 x 128 tiles over the layout's padded length, which need not be a multiple
of 128); "after": the flex plan's (the length padded to the 128-token tile, 64-token key tiles where they fill
partial tiles, the mask_mod in closed form where the layout has one). Partial tiles run the mask_mod element by
element; full tiles skip it. Counts are summed over the 12 heads of the kernel table's layouts
(:data:`benchmarks.attention.TUNED_LAYOUTS`), one batch row without padding. No timing: CPU flex times say nothing
about a GPU.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.attention import TUNED_LAYOUTS
from model.attention import BlockSparseAttention
from model.attention.kernels.flex import FlexKernel, mask_mod_for
from model.attention.kernels.flex_mask import layout_block_mask, partial_tiles


def tile_rows(n: int) -> list[dict]:
    """One row per tuned layout at sequence length ``n``."""
    rows = []
    for name, make in TUNED_LAYOUTS.items():
        cfg = make()
        mod = BlockSparseAttention(cfg, kernel="flex", max_seq_length=n)
        n_pad = cfg.padded_length(n)
        lay = mod.layout_for(n).bool()
        old = layout_block_mask(lay, cfg.block, n_pad, mask_mod_for(lay, cfg.block))
        plan = FlexKernel().make_plan(lay, cfg.block, n_pad, torch.device("cpu"))
        new = plan.layout_mask(plan.kv_tile)
        row = dict(layout=name, n=n, before_len=n_pad, after_len=plan.run_len, before_tile=old.BLOCK_SIZE)
        row.update(after_tile=new.BLOCK_SIZE, form=None if plan.form is None else plan.form.kind)
        for tag, bm in (("before", old), ("after", new)):
            p, f = partial_tiles(bm)
            tq, tk = bm.BLOCK_SIZE
            row[f"{tag}_partial"], row[f"{tag}_full"] = p, f
            row[f"{tag}_partial_area"] = p * tq * tk / max(1, (p + f) * tq * tk)  # share of visited area
            row[f"{tag}_visited_mtok2"] = (p + f) * tq * tk / 1e6
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.flex_tiles", description=__doc__.splitlines()[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 8192])
    args = p.parse_args(argv)
    print(
        "| layout | N | length before -> after | tile before -> after | mask_mod | partial / full tiles before | "
        "after | partial share of visited area before -> after | visited M tokens^2 before -> after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.seq_lens:
        for r in tile_rows(n):
            print(
                f"| {r['layout']} | {n} | {r['before_len']} -> {r['after_len']} | "
                f"{r['before_tile'][0]}x{r['before_tile'][1]} -> {r['after_tile'][0]}x{r['after_tile'][1]} | "
                f"{r['form'] or 'table'} | {r['before_partial']} / {r['before_full']} | "
                f"{r['after_partial']} / {r['after_full']} | {r['before_partial_area']:.2f} -> "
                f"{r['after_partial_area']:.2f} | {r['before_visited_mtok2']:.1f} -> {r['after_visited_mtok2']:.1f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
