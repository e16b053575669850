"""``--measure flex-tiles``: FlexAttention's tiles per layout, before and after issue 41 (exact counts from the
BlockMask, any machine):

    .venv/bin/python -m benchmarks.attention --measure flex-tiles --cases blockbert_n2,fixed_b64@4096,8192

"before": the BlockMask main built (128 x 128 tiles over the layout's padded length, which need not be a multiple
of 128); "after": the flex plan's (the length padded to the 128-token tile, 64-token key tiles where they fill
partial tiles, the mask_mod in closed form where the layout has one). Partial tiles run the mask_mod element by
element; full tiles skip it. Counts are summed over the 12 heads of the kernel table's layouts
(:data:`benchmarks.attention.layouts.TUNED_LAYOUTS`; default all of them), one batch row without padding. No timing:
CPU flex times say nothing about a GPU.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.attention.layouts import TUNED_LAYOUTS
from benchmarks.report import markdown_table
from model.attention import BlockSparseAttention
from model.attention.kernels.flex import FlexKernel, mask_mod_for
from model.attention.kernels.flex_mask import layout_block_mask, partial_tiles


def tile_rows(cases: list[tuple[str, int]]) -> list[dict]:
    """One row per case (a tuned layout at a sequence length)."""
    rows = []
    for name, n in cases:
        cfg = TUNED_LAYOUTS[name]()
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


def _tile(t: tuple[int, int]) -> str:
    return f"{t[0]}x{t[1]}"


COLUMNS = [
    ("layout", "layout"),
    ("n", "N"),
    ("length", "length before -> after"),
    ("tile", "tile before -> after"),
    ("form", "mask_mod"),
    ("before_tiles", "partial / full tiles before"),
    ("after_tiles", "after"),
    ("area", "partial share of visited area before -> after"),
    ("visited", "visited M tokens^2 before -> after"),
]


def table(rows: list[dict]) -> list[str]:
    """The rows as one Markdown table (before -> after in each cell)."""
    shown = [
        dict(
            r,
            form=r["form"] or "table",
            length=f"{r['before_len']} -> {r['after_len']}",
            tile=f"{_tile(r['before_tile'])} -> {_tile(r['after_tile'])}",
            before_tiles=f"{r['before_partial']} / {r['before_full']}",
            after_tiles=f"{r['after_partial']} / {r['after_full']}",
            area=f"{r['before_partial_area']:.2f} -> {r['after_partial_area']:.2f}",
            visited=f"{r['before_visited_mtok2']:.1f} -> {r['after_visited_mtok2']:.1f}",
        )
        for r in rows
    ]
    return markdown_table(shown, COLUMNS)


def command(args: argparse.Namespace) -> int:
    """``--measure flex-tiles``: the table of the ``--cases``."""
    print("\n".join(table(tile_rows(args.cases))))
    return 0
