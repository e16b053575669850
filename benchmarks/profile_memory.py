"""Training memory and step time without DeepSpeed (a plain AdamW step), dense against BlockBERT n=2 and n=3 and,
with --hf, Hugging Face BertForMaskedLM (SDPA) at the same sizes: the blockwise-attention paper's memory profile
(section 2, appendix A.2, Figure 1(b), Table 1) and its Table 2 analogue.

    python -m benchmarks.profile_memory [--hidden-size 192 --num-layers 2 --num-attention-heads 12] [--tokens 4096]
        [--out docs/figures]                                                           # the figure of docs/training.md
    python -m benchmarks.profile_memory --tokens 2048 --seq-lens 512 1024 --rounds 3 --hf --out out/table2   # Table 2
    python -m benchmarks.profile_memory --model-preset bert-base --tokens 2048 --seq-lens 512 1024 --hf --out out/t2
                                                                                   # on a GPU

Model memory and optimizer memory come from tensor sizes (numel x element_size; Adam keeps gradients plus two
moments). Activation memory is what backward needs: on CUDA the paper's `max_memory_allocated - model -
optimizer` after a training step; on CPU (no allocator statistics) the bytes of the distinct tensors autograd
saves for backward, collected with torch.autograd.graph.saved_tensors_hooks (the graph traversal of Sohoni et
al. that the paper cites as matching the allocator). With b x N fixed, activation memory is linear in N
(a2*b*N^2 + a1*b*N + a0 = (bN)*a2*N + const); the script fits it by least squares for each model and prints
the O(N^2) share at each N, then draws the figure (PNG). Step time = forward + backward + AdamW step, wall and
process CPU time, the best of --rounds rounds that interleave the models (a busy shared machine slows all of them
alike); the tables give each model's ratios to dense at the same N. The DeepSpeed step the trainer runs is measured
by ``python -m benchmarks.step``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from benchmarks.support.measure import MB, SavedActivations, synthetic_batch, tensor_bytes, timed_steps, train_step
from common.error_exit import run_entry
from common.errors import write_errors
from common.outputs import atomic_file, check_dir_writable
from common.tables import markdown_table
from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.presets import PRESETS, blockbert

VARIANTS = {"dense": None, "blockbert-n2": 2, "blockbert-n3": 3}
"""Variant -> BlockBERT n (model.presets.blockbert: the paper's split at the model's heads, 64-token tiles)."""
HF = "hf-sdpa"
"""The row of Hugging Face's BertForMaskedLM with SDPA attention (--hf)."""
NARROW = {"hidden_size": 192, "num_layers": 2, "num_attention_heads": 12}
"""The model of docs/training.md's CPU figures when neither --model-preset nor the size flags are given."""


def _bert_shaped(name: str) -> bool:
    c = ModelConfig.preset(name)
    return (
        c.intermediate_size == 4 * c.hidden_size
        and not c.pre_layer_norm
        and c.ffn_type == "standard"
        and c.position.type == "absolute"
        and all(c.attention.layer(i).sparsity is None for i in range(c.num_layers))
    )


BERT_SIZED = [name for name in sorted(PRESETS) if _bert_shaped(name)]
"""--model-preset's choices: presets whose only differences from :func:`model_config`'s BERT are the three sizes
(a ModernBERT, DIET or BlockBERT preset would be profiled as a BERT of its sizes: refused instead)."""


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


def hf_model(hidden: int, layers: int, heads: int, seq_len: int, vocab: int) -> torch.nn.Module:
    """Hugging Face's BertForMaskedLM (SDPA attention) of the same sizes as :func:`model_config`'s dense model."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max(seq_len, 512),
        attn_implementation="sdpa",
    )
    return BertForMaskedLM(cfg)


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
    """One model's memory and best step: a key of :data:`VARIANTS` (our model) or :data:`HF`."""
    dev = torch.device(device)
    torch.manual_seed(0)
    if variant == HF:
        model = hf_model(hidden, layers, heads, seq_len, vocab)
    else:
        model = BertForPreTraining(model_config(variant, hidden, layers, heads, seq_len, kernel, vocab))
    model = model.to(dev).train()
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


def best_of_rounds(models: list[str], seq_lens: list[int], rounds: int, run: Callable[[str, int], MemoryProfile]):
    """Per N, ``rounds`` rounds over all models in turn (interleaved); each model's fastest round (its memory is the
    same in every round)."""
    rows = []
    for n in seq_lens:
        per: dict[str, list[MemoryProfile]] = {m: [] for m in models}
        for _ in range(rounds):
            for m in models:
                per[m].append(run(m, n))
        rows += [min(rs, key=lambda r: r.step_s) for rs in per.values()]
    return rows


def ratio_table(rows: list[MemoryProfile], n: int) -> list[str]:
    """The models at one N side by side, with their ratios to dense (Markdown)."""
    at = [r for r in rows if r.seq_len == n]
    dense = next((r for r in at if r.variant == "dense"), at[0])
    shown = [
        r.__dict__
        | {
            "total_mb": r.total_mb,
            "wall_x": r.step_s / dense.step_s,
            "cpu_x": r.cpu_s / dense.cpu_s if dense.cpu_s else None,
            "mem_x": r.total_mb / dense.total_mb,
        }
        for r in at
    ]
    columns = [("variant", "model"), ("step_s", "step wall (s)", ".3f"), ("wall_x", f"x {dense.variant}", ".2f")]
    columns += [("cpu_s", "step CPU (s)", ".3f"), ("cpu_x", f"x {dense.variant}", ".2f")]
    columns += [("total_mb", "memory (MB)", ".0f"), ("mem_x", f"x {dense.variant}", ".2f")]
    columns += [("activation_mb", "activations (MB)", ".0f")]
    return [f"N={n}, b={dense.batch}", "", *markdown_table(shown, columns)]


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("benchmarks.profile_memory", _main, argv)


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model-preset",
        choices=BERT_SIZED,
        help="its hidden size, layers and heads (default: hidden 192 x 2 layers x 12); the model is always BERT's "
        "(post-LN, 4h FFN, absolute positions; --variants set the layout), so only presets of that shape are offered",
    )
    p.add_argument("--hidden-size", dest="hidden", type=int, help="overrides the preset's")
    p.add_argument("--num-layers", dest="layers", type=int, help="overrides the preset's")
    p.add_argument(
        "--num-attention-heads", dest="heads", type=int, help="overrides the preset's (12: the paper's 10:2 and 8:2:2)"
    )
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--tokens", type=int, default=4096, help="b x N kept fixed (the paper: 4096 per GPU)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--hf", action="store_true", help="also Hugging Face BertForMaskedLM (SDPA) of the same sizes")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; each model's best step is kept")
    p.add_argument("--kernel", default="auto", help="kernel for the sparse variants")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="docs/figures", help="directory for profile_memory.png and .json")
    args = p.parse_args(argv)
    check_dir_writable(args.out, "--out")  # before minutes of profiling
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA GPU here (torch {torch.__version__}); use --device cpu")
    sizes = PRESETS[args.model_preset] if args.model_preset else NARROW
    args.hidden = args.hidden or sizes["hidden_size"]
    args.layers = args.layers or sizes["num_layers"]
    args.heads = args.heads or sizes["num_attention_heads"]
    print(
        f"b x N = {args.tokens}, hidden {args.hidden}, layers {args.layers}, heads {args.heads}, device {args.device}, "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    models = args.variants + ([HF] if args.hf else [])

    def run(m: str, n: int) -> MemoryProfile:
        r = profile(
            m,
            max(1, args.tokens // n),
            n,
            args.hidden,
            args.layers,
            args.heads,
            args.kernel,
            1,
            args.device,
            args.vocab_size,
        )
        print(f"{m:<14} N={n:<5} b={r.batch:<3} total {r.total_mb:8.1f} MB, step {r.step_s:.3f} s", flush=True)
        return r

    rows = best_of_rounds(models, args.seq_lens, args.rounds, run)
    for n in args.seq_lens:
        print("\n" + "\n".join(ratio_table(rows, n)))
    fits = {}
    if len(set(args.seq_lens)) > 1:
        print("\nleast squares, activation MB = s x N + c  (s x N is the O(N^2) part at fixed b x N)")
        for m in models:
            rs = [r for r in rows if r.variant == m]
            s, c = fit_linear([r.seq_len for r in rs], [r.activation_mb for r in rs])
            fits[m] = (s, c)
            shares = ", ".join(f"N={r.seq_len}: {s * r.seq_len:.1f} MB" for r in rs)
            print(f"{m:<14} s={s:.5f} MB/token  c={c:.1f} MB   O(N^2) part: {shares}")
        if "dense" in fits:
            for m, (s, _) in fits.items():
                if m != "dense" and fits["dense"][0] > 0:
                    print(f"{m}: quadratic coefficient {s / fits['dense'][0]:.3f} x dense")
    out = Path(args.out)
    with write_errors(f"--out {out}", out), atomic_file(out / "profile_memory.json") as tmp:
        tmp.write_text(json.dumps({"rows": [r.__dict__ for r in rows], "fits": fits, "args": vars(args)}, indent=1))
    if fits:
        _plot(rows, fits, models, out)
    print(f"\nwrote {out / 'profile_memory.json'}" + (f" and {out / 'profile_memory.png'}" if fits else ""))
    return 0


def _plot(rows: list[MemoryProfile], fits: dict, models: list[str], out: Path) -> None:
    """Activation memory against N with each model's least-squares line (the paper's Figure 1(b))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m in models:
        rs = [r for r in rows if r.variant == m]
        ns = np.array([r.seq_len for r in rs])
        (points,) = ax.plot(ns, [r.activation_mb for r in rs], "o", label=m)
        s, c = fits[m]
        ax.plot(ns, s * ns + c, "-", alpha=0.6, color=points.get_color())
    ax.set_xlabel("sequence length N (b x N fixed)")
    ax.set_ylabel("activation memory (MB)")
    ax.legend()
    fig.tight_layout()
    with write_errors(f"--out {out}", out), atomic_file(out / "profile_memory.png") as tmp:
        fig.savefig(tmp, dpi=120, format="png")


if __name__ == "__main__":
    raise SystemExit(main())
