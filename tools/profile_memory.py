"""Training-memory profile of the blockwise-attention paper (section 2 and appendix A.2), dense vs BlockBERT.

    python -m tools.profile_memory [--hidden-size 192 --num-layers 2 --num-attention-heads 12] [--tokens 4096]
        [--out docs/figures]

Model memory and optimizer memory come from tensor sizes (numel x element_size; Adam keeps gradients plus two
moments). Activation memory is what backward needs: on CUDA the paper's `max_memory_allocated - model -
optimizer` after a training step; on CPU (no allocator statistics) the bytes of the distinct tensors autograd
saves for backward, collected with torch.autograd.graph.saved_tensors_hooks (the graph traversal of Sohoni et
al. that the paper cites as matching the allocator). With b x N fixed, activation memory is linear in N
(a2*b*N^2 + a1*b*N + a0 = (bN)*a2*N + const); the script fits it by least squares for each model and prints
the O(N^2) share at each N, then draws the figure (PNG).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.error_exit import run_entry
from common.errors import write_errors
from common.outputs import atomic_file, check_dir_writable
from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.presets import blockbert
from tools.measure import MB, SavedActivations, synthetic_batch, tensor_bytes, timed_steps, train_step

VARIANTS = {"dense": None, "blockbert-n2": 2, "blockbert-n3": 3}
"""Variant -> BlockBERT n (model.presets.blockbert: the paper's split at the model's heads, 64-token tiles)."""


@dataclass
class MemoryProfile:
    """One model at one (batch, N)."""

    variant: str
    batch: int
    seq_len: int
    model_mb: float
    optimizer_mb: float
    activation_mb: float
    step_s: float
    """Best wall time of a training step over the timed steps."""
    cpu_s: float = 0.0
    """Process CPU time of that step (less sensitive to other load on a shared machine)."""

    @property
    def total_mb(self) -> float:
        return self.model_mb + self.optimizer_mb + self.activation_mb


def model_config(
    variant: str, hidden: int, layers: int, heads: int, seq_len: int, kernel: str, vocab: int = 30522
) -> ModelConfig:
    sparsity = None if VARIANTS[variant] is None else blockbert(VARIANTS[variant], heads, block=64)
    attention = {"kernel": "dense" if sparsity is None else kernel, "sparsity": sparsity}
    return ModelConfig.preset(
        "bert-base",
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max(seq_len, 512),
        vocab_size=vocab,
        attention=attention,
    )


def profile(
    variant: str,
    batch: int,
    seq_len: int,
    hidden: int = 192,
    layers: int = 2,
    heads: int = 12,
    kernel: str = "auto",
    steps: int = 3,
    device: str = "cpu",
    vocab: int = 30522,
) -> MemoryProfile:
    dev = torch.device(device)
    torch.manual_seed(0)
    cfg = model_config(variant, hidden, layers, heads, seq_len, kernel, vocab)
    model = BertForPreTraining(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = synthetic_batch(batch, seq_len, vocab, dev)
    train_step(model, opt, data)  # warm-up: optimizer state exists, kernel plans cached
    params = list(model.parameters())
    model_bytes = tensor_bytes(params)
    opt_bytes = model_bytes + sum(
        tensor_bytes(v for v in s.values() if torch.is_tensor(v) and v.dim() > 0) for s in opt.state.values()
    )  # gradients + moments
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
        train_step(model, opt, data)
        torch.cuda.synchronize()
        act_bytes = torch.cuda.max_memory_allocated(dev) - model_bytes - opt_bytes
    else:
        saved = SavedActivations(params)
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            out = model(**data)
        out.loss.backward()
        opt.zero_grad(set_to_none=True)
        act_bytes = saved.bytes
    wall, cpu = timed_steps(lambda: train_step(model, opt, data), steps, dev)
    return MemoryProfile(variant, batch, seq_len, model_bytes / MB, opt_bytes / MB, act_bytes / MB, wall, cpu)


def fit_linear(ns: list[int], acts: list[float]) -> tuple[float, float]:
    """OLS of activation memory on N (b x N fixed): returns (slope per token of N, intercept) in MB."""
    slope, intercept = np.polyfit(np.asarray(ns, float), np.asarray(acts, float), 1)
    return float(slope), float(intercept)


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.profile_memory", _main, argv)


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.profile_memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--hidden-size", dest="hidden", type=int, default=192)
    p.add_argument("--num-layers", dest="layers", type=int, default=2)
    p.add_argument(
        "--num-attention-heads", dest="heads", type=int, default=12, help="12: the paper's 10:2 and 8:2:2 splits"
    )
    p.add_argument("--tokens", type=int, default=4096, help="b x N kept fixed (the paper: 4096 per GPU)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--kernel", default="auto", help="kernel for the sparse variants")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="docs/figures", help="directory for profile_memory.png and .json")
    args = p.parse_args(argv)
    check_dir_writable(args.out, "--out")  # before minutes of profiling

    rows: list[MemoryProfile] = []
    print(
        f"b x N = {args.tokens}, hidden {args.hidden}, layers {args.layers}, heads {args.heads}, device {args.device}"
    )
    print(f"{'model':<14}{'N':>6}{'b':>4}{'model MB':>10}{'optim MB':>10}{'activ MB':>10}{'total MB':>10}")
    for variant in args.variants:
        for n in args.seq_lens:
            r = profile(
                variant,
                max(1, args.tokens // n),
                n,
                args.hidden,
                args.layers,
                args.heads,
                args.kernel,
                steps=1,
                device=args.device,
            )
            rows.append(r)
            print(
                f"{variant:<14}{n:>6}{r.batch:>4}{r.model_mb:>10.1f}{r.optimizer_mb:>10.1f}"
                f"{r.activation_mb:>10.1f}{r.total_mb:>10.1f}",
                flush=True,
            )
    print("\nleast squares, activation MB = s x N + c  (s x N is the O(N^2) part at fixed b x N)")
    fits = {}
    for variant in args.variants:
        rs = [r for r in rows if r.variant == variant]
        s, c = fit_linear([r.seq_len for r in rs], [r.activation_mb for r in rs])
        fits[variant] = (s, c)
        shares = ", ".join(f"N={r.seq_len}: {s * r.seq_len:.1f} MB" for r in rs)
        print(f"{variant:<14} s={s:.5f} MB/token  c={c:.1f} MB   O(N^2) part: {shares}")
    if "dense" in fits:
        for variant, (s, _) in fits.items():
            if variant != "dense" and fits["dense"][0] > 0:
                print(f"{variant}: quadratic coefficient {s / fits['dense'][0]:.3f} x dense")
    out = Path(args.out)
    with write_errors(f"--out {out}", out), atomic_file(out / "profile_memory.json") as tmp:
        tmp.write_text(json.dumps({"rows": [r.__dict__ for r in rows], "fits": fits, "args": vars(args)}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for variant in args.variants:
        rs = [r for r in rows if r.variant == variant]
        ns = np.array([r.seq_len for r in rs])
        (points,) = ax.plot(ns, [r.activation_mb for r in rs], "o", label=variant)
        s, c = fits[variant]
        ax.plot(ns, s * ns + c, "-", alpha=0.6, color=points.get_color())
    ax.set_xlabel("sequence length N (b x N fixed)")
    ax.set_ylabel("activation memory (MB)")
    ax.legend()
    fig.tight_layout()
    with write_errors(f"--out {out}", out), atomic_file(out / "profile_memory.png") as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    print(f"\nwrote {out / 'profile_memory.png'} and {out / 'profile_memory.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
