"""The comparison's PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """perplexity vs step / training time / tokens, and step time + peak memory per config, as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    runs = results["runs"]
    configs = list(dict.fromkeys(r["config"] for r in runs.values()))
    colors = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(configs)}
    seeds = sorted({r["seed"] for r in runs.values()})
    styles = ["-", "--", ":", "-."]
    paths = []
    for key, label, fname, scale in (
        ("iteration", "optimizer step", "ppl_vs_step.png", 1.0),
        ("train_time_s", "training time (min, evaluation excluded)", "ppl_vs_time.png", 1 / 60),
        ("tokens", "training tokens (millions)", "ppl_vs_tokens.png", 1e-6),
    ):
        fig, ax = plt.subplots(figsize=(8.4, 4.6), dpi=90)
        for name, r in runs.items():
            if not r["evals"]:
                continue
            xs = [e[key] * scale for e in r["evals"]]
            ys = [e["perplexity"] for e in r["evals"]]
            ax.plot(
                xs,
                ys,
                styles[seeds.index(r["seed"]) % len(styles)],
                color=colors[r["config"]],
                marker=".",
                label=f"{r['config']} (seed {r['seed']})",
                linewidth=1.2,
            )
        ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel(label)
        ax.set_ylabel("validation MLM perplexity (held-out documents)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the curves, not over them
        fig.tight_layout()
        fig.savefig(out_dir / fname)
        plt.close(fig)
        paths.append(out_dir / fname)
    summary = results["summary"]
    if summary:
        names = list(summary)
        fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.6), dpi=90)
        for ax, key, label, k in (
            (axes[0], "step_time_s", "median step time (s)", 1.0),
            (axes[1], "peak_memory_mb", "peak memory, rank 0 (MB)", 1.0),
        ):
            means = [summary[c][key]["mean"] * k for c in names]
            stds = [summary[c][key]["std"] * k for c in names]
            ax.bar(range(len(names)), means, yerr=stds, color=[colors.get(c, "gray") for c in names])
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(label)
            ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "cost.png")
        plt.close(fig)
        paths.append(out_dir / "cost.png")
    return paths
