"""Training-step time and memory: dense vs BlockBERT n=2 / n=3 at N=512 and 1024 (the blockwise paper's Table 2
analogue), and our dense model vs Hugging Face BertForMaskedLM (SDPA) at the same sizes and batch.

    python -m benchmarks.train_step [--hidden 192 --layers 2 --heads 12 --tokens 2048 --rounds 3]
    python -m benchmarks.train_step --preset bert-base          (on a GPU)

Memory is measured as in tools/profile_memory.py (model + optimizer from tensor sizes; activations from
autograd's saved tensors on CPU, max_memory_allocated on CUDA). Step time = forward + backward + AdamW step, the
best of rounds that interleave the variants (so a busy shared machine slows all of them alike). Ratios are
against the dense model of the same N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import torch

from tools.measure import MB, SavedActivations, synthetic_batch, tensor_bytes, timed_steps
from tools.profile_memory import profile


def hf_profile(
    batch: int, seq_len: int, hidden: int, layers: int, heads: int, vocab: int, device: str, rounds: int
) -> dict:
    from transformers import BertConfig, BertForMaskedLM

    dev = torch.device(device)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max(seq_len, 512),
        attn_implementation="sdpa",
    )
    model = BertForMaskedLM(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = synthetic_batch(batch, seq_len, vocab, dev)

    def step():
        model(**data).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    params = list(model.parameters())
    model_b = tensor_bytes(params)
    opt_b = model_b + sum(
        tensor_bytes(v for v in s.values() if torch.is_tensor(v) and v.dim() > 0) for s in opt.state.values()
    )
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        step()
        torch.cuda.synchronize()
        act_b = torch.cuda.max_memory_allocated(dev) - model_b - opt_b
    else:
        saved = SavedActivations(params)
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            loss = model(**data).loss
        loss.backward()
        opt.zero_grad(set_to_none=True)
        act_b = saved.bytes
    wall, cpu = timed_steps(step, rounds, dev)
    return {"total_mb": (model_b + opt_b + act_b) / MB, "activation_mb": act_b / MB, "step_s": wall, "cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.errors.run_entry)."""
    from common.errors import run_entry

    return run_entry("benchmarks.train_step", _main, argv)


def _main(argv: list[str]) -> int:
    from common.errors import write_errors
    from common.outputs import atomic_file, check_file_writable

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.train_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", choices=["narrow", "bert-base"], default="narrow")
    p.add_argument("--hidden", type=int, default=192)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--tokens", type=int, default=2048, help="b x N per step (b = tokens / N)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kernel", default="auto")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.json:
        check_file_writable(args.json, "--json")  # before the timings
    if args.preset == "bert-base":
        args.hidden, args.layers, args.heads = 768, 12, 12
    variants = ["dense", "blockbert-n2", "blockbert-n3"]
    shape = dict(
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kernel=args.kernel,
        device=args.device,
        vocab=args.vocab,
    )
    print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, device "
        f"{args.device}, threads {torch.get_num_threads()}; model hidden {args.hidden} x {args.layers} layers x "
        f"{args.heads} heads; b x N = {args.tokens}"
    )
    results: dict = {}
    for n in args.seq_lens:
        b = max(1, args.tokens // n)
        per: dict[str, list] = {v: [] for v in variants}
        hf_runs = []
        for _ in range(args.rounds):  # interleaved rounds
            for v in variants:
                per[v].append(profile(v, b, n, steps=1, **shape))
            if not args.no_hf:
                hf_runs.append(hf_profile(b, n, args.hidden, args.layers, args.heads, args.vocab, args.device, 1))
        res = {}
        for v in variants:
            rs = per[v]
            best = min(rs, key=lambda r: r.step_s)
            res[v] = {
                "total_mb": rs[0].total_mb,
                "activation_mb": rs[0].activation_mb,
                "step_s": best.step_s,
                "cpu_s": best.cpu_s,
                "batch": b,
            }
        if hf_runs:
            best = min(hf_runs, key=lambda r: r["step_s"])
            res["hf-sdpa"] = {
                "total_mb": hf_runs[0]["total_mb"],
                "activation_mb": hf_runs[0]["activation_mb"],
                "step_s": best["step_s"],
                "cpu_s": best["cpu_s"],
                "batch": b,
            }
        results[n] = res
        dense = res["dense"]
        print(f"\nN={n}, b={b}")
        print("| model | step wall (s) | x dense | step CPU (s) | x dense | memory (MB) | x dense | activations (MB) |")
        print("|---|---|---|---|---|---|---|---|")
        for name, r in res.items():
            print(
                f"| {name} | {r['step_s']:.3f} | {r['step_s'] / dense['step_s']:.2f} | {r['cpu_s']:.3f} | "
                f"{r['cpu_s'] / dense['cpu_s']:.2f} | {r['total_mb']:.0f} | "
                f"{r['total_mb'] / dense['total_mb']:.2f} | {r['activation_mb']:.0f} |",
                flush=True,
            )
        if "hf-sdpa" in res:
            hf = res["hf-sdpa"]
            print(
                f"HF BertForMaskedLM (SDPA) step / our dense step: wall {hf['step_s'] / dense['step_s']:.2f}x, "
                f"CPU {hf['cpu_s'] / dense['cpu_s']:.2f}x"
            )
    if args.json:
        with (
            write_errors(f"--json {args.json}", os.path.dirname(os.path.abspath(args.json))),
            atomic_file(args.json) as tmp,
        ):
            tmp.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
