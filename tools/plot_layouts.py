"""Draw a block-sparse attention layout, one panel per head (like the papers' figures), to PNG.

    .venv/bin/python -m tools.plot_layouts --sparsity '{"mode": "bigbird", "block": 16}' --num-heads 4 \\
        --seq-len 512 --out out/bigbird.png
    .venv/bin/python -m tools.plot_layouts --preset blockbert-base-n3 --seq-len 512 --out out/blockbert_n3.png
    .venv/bin/python -m tools.plot_layouts --model-config my_model.json --layer 0 --seq-len 1024 --out out/l0.png

Dark cells are (query block, key block) pairs that are computed; the title gives each head's density.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from model.attention.layouts import SparsityConfig, from_ds_config, layout_density
from model.config import ModelConfig


def plot_layout(layout_HMM: torch.Tensor, out: Path, title: str = "", heads: list[int] | None = None,
                block: int | None = None) -> Path:
    """Save one panel per head of an int [H, M, M] layout; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = list(range(layout_HMM.shape[0])) if heads is None else heads
    bad = [h for h in heads if not 0 <= h < layout_HMM.shape[0]]
    if bad:
        raise ValueError(f"--heads {bad} out of range: the layout has {layout_HMM.shape[0]} heads")
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
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _resolve(args: argparse.Namespace) -> tuple[SparsityConfig, str]:
    if args.sparsity:
        try:
            d = json.loads(args.sparsity)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--sparsity is not valid JSON ({e}): {args.sparsity!r}")
        if args.num_heads is None:
            raise SystemExit("--sparsity needs --num-heads")
        return from_ds_config(d, args.num_heads), json.dumps(d)
    if args.preset or args.model_config:
        if args.model_config:
            try:
                cfg = ModelConfig.from_dict(json.loads(Path(args.model_config).read_text()))
            except (OSError, ValueError) as e:
                raise SystemExit(f"cannot read model config {args.model_config}: {e}")
        else:
            cfg = ModelConfig.preset(args.preset)
        if not 0 <= args.layer < cfg.num_layers:
            raise SystemExit(f"--layer {args.layer} out of range: the model has {cfg.num_layers} layers")
        _, sp = cfg.attention.for_layer(args.layer, cfg.num_attention_heads)
        if sp is None:
            raise SystemExit(f"layer {args.layer} uses full (dense) attention: nothing to draw")
        return sp, f"{args.preset or args.model_config} layer {args.layer}"
    raise SystemExit("give one of --sparsity, --preset or --model-config")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sparsity", help="ds_config-style sparse_attention block as JSON")
    src.add_argument("--preset", help="a ModelConfig preset name, e.g. blockbert-base-n2")
    src.add_argument("--model-config", help="a ModelConfig JSON file")
    p.add_argument("--num-heads", type=int, help="heads (with --sparsity)")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--heads", type=int, nargs="+", help="only these heads")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    cfg, title = _resolve(args)
    n = cfg.padded_length(args.seq_len)
    layout = cfg.make_layout(n)
    path = plot_layout(layout, args.out, f"{type(cfg).__name__} N={n}: {title}", args.heads, cfg.block)
    print(f"wrote {path} ({layout.shape[0]} heads, {layout.shape[1]}x{layout.shape[2]} blocks, "
          f"density {layout_density(layout):.3f})")


if __name__ == "__main__":
    main()
