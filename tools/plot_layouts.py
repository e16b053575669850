"""Draw a block-sparse attention layout, one panel per head (like the papers' figures), to PNG.

    .venv/bin/python -m tools.plot_layouts --sparsity '{"mode": "bigbird", "block": 16}' --num-heads 4 \\
        --seq-length 512 --out out/bigbird.png
    .venv/bin/python -m tools.plot_layouts --model-preset blockbert-base-n3 --seq-length 512 --out out/blockbert_n3.png
    .venv/bin/python -m tools.plot_layouts --model-config my_model.json --layer 0 --seq-length 1024 --out out/l0.png

SparseBERT token masks (drawn per token; a model config's mask is ANDed with its block layout):

    .venv/bin/python -m tools.plot_layouts --token-mask '{"pattern": "star"}' --num-heads 2 --seq-length 128 \
        --out out/star.png --stats
    .venv/bin/python -m tools.plot_layouts --table3 --seq-length 128        # sparsity of every pattern vs the paper

Dark cells are (query block, key block) pairs that are computed; the title gives each head's density.
``--stats`` prints the sparsity (1 - allowed / n^2) per head and the block-layout density as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from common.error_exit import run_entry
from common.errors import UserError, write_errors
from common.inputs import read_json_object
from common.outputs import atomic_file, check_file_writable
from model.attention import sparsebert as S
from model.attention.layouts import SparsityConfig, from_ds_config, layout_density
from model.config import ModelConfig


def plot_layout(
    layout_HMM: torch.Tensor, out: Path, title: str = "", heads: list[int] | None = None, block: int | None = None
) -> Path:
    """Save one panel per head of an int [H, M, M] layout; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = list(range(layout_HMM.shape[0])) if heads is None else heads
    bad = [h for h in heads if not 0 <= h < layout_HMM.shape[0]]
    if bad:
        raise UserError(f"--heads {bad} out of range: the layout has {layout_HMM.shape[0]} heads")
    cols = min(len(heads), 6)
    rows = math.ceil(len(heads) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 2.5 * rows + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, h in zip(axes.flat, heads):
        ax.imshow(layout_HMM[h].numpy(), cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"head {h}: {layout_density(layout_HMM[h]):.1%}", fontsize=9)
        ax.axis("on")
        ax.set_xticks([])
        ax.set_yticks([])
    unit = f" (cells of {block} tokens)" if block else ""
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(f"{title}{unit}", width=int(cols * 28))), fontsize=9)
    fig.tight_layout()
    with write_errors(f"--out {out}", out.parent), atomic_file(out) as tmp:
        fig.savefig(tmp, dpi=120, format=out.suffix[1:] or "png")  # the format of the name asked for, not the tmp's
    plt.close(fig)
    return out


def _resolve_mask(args: argparse.Namespace) -> tuple[SparsityConfig | None, S.TokenMaskConfig | None, str]:
    """(block layout or None, token mask settings or None, title)."""
    if args.token_mask:
        try:
            tm = S.TokenMaskConfig.from_dict(json.loads(args.token_mask), "--token-mask")
        except (json.JSONDecodeError, ValueError) as e:
            raise UserError(f"--token-mask: {e}") from None
        if args.num_heads is None:
            raise UserError("--token-mask needs --num-heads")
        return None, tm, args.token_mask
    if args.preset or args.model_config:
        cfg = _model_config(args)
        _, sp = cfg.attention.for_layer(args.layer, cfg.num_attention_heads)
        tm = cfg.attention.token_mask_for_layer(args.layer)
        args.num_heads = cfg.num_attention_heads
        args.seq_len = min(args.seq_len, cfg.max_position_embeddings)  # the model builds its masks at most this long
        if tm is not None:
            return sp, tm, f"{args.preset or args.model_config} layer {args.layer}"
    sp, title = _resolve(args)
    return sp, None, title


def _model_config(args: argparse.Namespace) -> ModelConfig:
    try:
        if args.model_config:
            cfg = ModelConfig.from_dict(
                read_json_object(args.model_config, "--model-config", "a ModelConfig JSON file")
            )
        else:
            cfg = ModelConfig.preset(args.preset)
    except (ValueError, TypeError) as e:
        where = f"--model-config {args.model_config}" if args.model_config else f"--model-preset {args.preset}"
        raise UserError(f"{where}: {e}") from None
    if not 0 <= args.layer < cfg.num_layers:
        raise UserError(f"--layer {args.layer} out of range: the model has {cfg.num_layers} layers")
    return cfg


def mask_stats(allowed_HNN: torch.Tensor, block: int | None) -> dict:
    """Sparsity per head and overall, plus the density of the block layout the sparse kernels would run."""
    out = {
        "seq_len": allowed_HNN.shape[-1],
        "sparsity": round(S.sparsity(allowed_HNN), 4),
        "sparsity_per_head": [round(S.sparsity(m), 4) for m in allowed_HNN],
    }
    if block:
        lay = S.block_layout_from_mask(allowed_HNN, block)
        out.update(
            block=block,
            block_density=round(layout_density(lay), 4),
            block_density_per_head=[round(layout_density(x), 4) for x in lay],
        )
    return out


def _resolve(args: argparse.Namespace) -> tuple[SparsityConfig, str]:
    if args.sparsity:
        try:
            d = json.loads(args.sparsity)
        except json.JSONDecodeError as e:
            raise UserError(f"--sparsity is not valid JSON ({e}): {args.sparsity!r}") from None
        if args.num_heads is None:
            raise UserError("--sparsity needs --num-heads")
        try:
            return from_ds_config(d, args.num_heads), json.dumps(d)
        except (ValueError, TypeError) as e:
            raise UserError(f"--sparsity: {e}") from None
    if args.preset or args.model_config:
        cfg = _model_config(args)
        _, sp = cfg.attention.for_layer(args.layer, cfg.num_attention_heads)
        if sp is None:
            raise UserError(f"layer {args.layer} uses full (dense) attention: nothing to draw")
        return sp, f"{args.preset or args.model_config} layer {args.layer}"
    raise UserError("give one of --sparsity, --model-preset or --model-config")


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.plot_layouts", _main, argv)


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tools.plot_layouts", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sparsity", help="ds_config-style sparse_attention block as JSON")
    src.add_argument("--model-preset", dest="preset", help="a model/presets.py recipe, e.g. blockbert-base-n2")
    src.add_argument("--model-config", help="a ModelConfig JSON file")
    src.add_argument("--token-mask", help="a SparseBERT attention.token_mask block as JSON")
    src.add_argument("--table3", action="store_true", help="print every pattern's sparsity vs SparseBERT Table 3")
    p.add_argument("--num-heads", type=int, help="heads (with --sparsity / --token-mask)")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--seq-length", dest="seq_len", type=int, default=512)
    p.add_argument("--heads", type=int, nargs="+", help="only these heads")
    p.add_argument("--out", type=Path, help="PNG to write (optional with --stats)")
    p.add_argument("--stats", action="store_true", help="print sparsity per head (and pattern) as JSON")
    args = p.parse_args(argv)
    if args.table3:
        print(json.dumps(S.sparsity_table(args.seq_len, args.num_heads or 12), indent=1))
        return 0
    if args.out is None and not args.stats:
        raise UserError("give --out PNG and/or --stats")
    if args.out is not None:
        check_file_writable(args.out, "--out")  # before any work
    if args.token_mask or args.preset or args.model_config:
        sp, tm, title = _resolve_mask(args)
        if tm is not None:
            if tm.pattern == "dam":
                raise UserError(
                    "a DAM mask is learned: export it (export_learned_masks + save_masks) and draw the "
                    'file with --token-mask \'{"pattern": "file", "path": ...}\''
                )
            n = tm.seq_len or args.seq_len
            allowed = S.build_token_mask(tm, args.num_heads, n, args.layer)
            if sp is not None:
                n_pad = sp.padded_length(n)
                lay = sp.make_layout(n_pad).bool().repeat_interleave(sp.block, 1).repeat_interleave(sp.block, 2)
                allowed = allowed & lay[:, :n, :n]
            block = sp.block if sp is not None else tm.block
            if args.stats:
                print(json.dumps({"source": title, "pattern": tm.pattern, **mask_stats(allowed, block)}))
            if args.out:
                path = plot_layout(allowed.long(), args.out, f"token mask n={n}: {title}", args.heads)
                print(f"wrote {path} ({allowed.shape[0]} heads, sparsity {S.sparsity(allowed):.3f})")
            return 0
    cfg, title = _resolve(args)
    n = cfg.padded_length(args.seq_len)
    layout = cfg.make_layout(n)
    if args.stats:
        print(
            json.dumps(
                {
                    "source": title,
                    "seq_len": n,
                    "block": cfg.block,
                    "block_density": layout_density(layout),
                    "block_density_per_head": [round(layout_density(x), 4) for x in layout],
                }
            )
        )
    if args.out is None:
        return 0
    path = plot_layout(layout, args.out, f"{type(cfg).__name__} N={n}: {title}", args.heads, cfg.block)
    print(
        f"wrote {path} ({layout.shape[0]} heads, {layout.shape[1]}x{layout.shape[2]} blocks, "
        f"density {layout_density(layout):.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
