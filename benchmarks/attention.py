"""Forward+backward time and peak memory of each attention kernel x layout vs dense SDPA without a mask.

    .venv/bin/python -m benchmarks.attention --out-dir out/bench_attention            # CPU, fp32
    .venv/bin/python -m benchmarks.attention --device cuda --dtype bf16 --kernels block_gather flex

Writes ``attention.json`` (one row per kernel x layout x N) and ``attention.png`` (time and memory ratios vs the
dense baseline, with the target line 1.15 x density) to ``--out-dir``.

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` minus what was allocated before the step. On CPU there is no
allocator counter, so the step runs once under ``torch.profiler`` with ``profile_memory=True`` and we replay its
allocation/free events in time order; the peak of that running sum is what the step itself allocated (outputs,
saved activations, gradients of q/k/v, temporaries inside fused kernels), excluding the inputs made beforehand.
Time: ``--repeats`` runs after one warm-up, without the profiler, alternating with the dense baseline (so that load
from other processes hits both alike); the time ratio is best-of-N over best-of-N (load only ever adds time), the
median ratio is recorded next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from benchmarks.report import commit_info
from model.attention import (
    BLOCK_LAYOUTS,
    BigBirdSparsityConfig,
    BlockSparseAttention,
    BSLongformerSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    VariableSparsityConfig,
    from_ds_config,
    layout_density,
)
from model.attention.kernels import KERNELS
from model.presets import blockbert

HEADS, HEAD_DIM = 12, 64
TUNED_LAYOUTS: dict[str, Callable[[], object]] = {
    "blockbert_n2": lambda: from_ds_config(blockbert(2, HEADS), HEADS),  # model/presets.py: heads 10:2, block 16
    "blockbert_n3": lambda: from_ds_config(blockbert(3, HEADS), HEADS),
    "fixed_b16": lambda: FixedSparsityConfig(HEADS, block=16),
    "fixed_b64": lambda: FixedSparsityConfig(HEADS, block=64),
    "bigbird_b64": lambda: BigBirdSparsityConfig(HEADS, block=64),
    "bslongformer_b64": lambda: BSLongformerSparsityConfig(HEADS, block=64),
    "local_bi_b64": lambda: LocalSlidingWindowSparsityConfig(HEADS, block=64, attention="bidirectional"),
    "variable_b64": lambda: VariableSparsityConfig(HEADS, block=64, num_random_blocks=1),
}
"""The layouts the docs' tables were measured with (the default of ``--layouts``)."""


def layouts() -> dict[str, Callable[[], object]]:
    """``--layouts`` choices: :data:`TUNED_LAYOUTS`, plus every registered block layout mode they do not cover, at its
    class defaults (so a new mode is benchmarked without an entry here)."""
    covered = {make().mode for make in TUNED_LAYOUTS.values()}
    extra = {m: (lambda cls=cls: cls(HEADS)) for m, cls in BLOCK_LAYOUTS.items() if m not in covered}
    return {**TUNED_LAYOUTS, **extra}


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def reset_compiled() -> None:
    """Called between groups (one per sequence length): Dynamo's caches and flex's compiled callables start empty,
    so no group inherits another's compilations and none runs near Dynamo's recompile limit, past which compiled
    FlexAttention would fall back to its unfused eager path (tests/test_cuda_contracts.py)."""
    import torch._dynamo

    from model.attention.kernels import flex

    torch._dynamo.reset()
    flex._compiled_flex.clear()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_memory_mib(step: Callable[[], None], device: torch.device) -> float:
    """Peak MiB the step allocates beyond what existed before it (see the module docstring)."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        _sync(device)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    return cpu_allocations(step)[1] / 2**20


def cpu_allocations(fn: Callable[[], Any]) -> tuple[int, int, Any]:
    """(retained bytes, peak bytes, fn's result) of one call on CPU, from the profiler's allocation events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return cur, peak, out


def paired_times(
    step: Callable[[], None], baseline: Callable[[], None], device: torch.device, repeats: int
) -> dict[str, float]:
    """Median and best (minimum) seconds of ``step`` and of ``baseline``, run alternately so that load from other
    processes on a shared machine hits both alike. The best-of-N ratio is the least noisy estimate on a loaded box
    (load only ever adds time); the median ratio is reported next to it."""
    step()
    baseline()
    ts, tb = [], []
    for _ in range(repeats):
        for fn, acc in ((step, ts), (baseline, tb)):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            acc.append(time.perf_counter() - t0)
    return dict(
        time_s=statistics.median(ts), dense_time_s=statistics.median(tb), time_best_s=min(ts), dense_time_best_s=min(tb)
    )


def dense_backend(device: torch.device, dtype: torch.dtype) -> str:
    """The SDPA backend torch picks for the dense baseline here (flash, cudnn, efficient, math), as its dispatcher
    (``torch._fused_sdp_choice``) decides for an unmasked call of the benchmark's head shape."""
    if device.type != "cuda":
        return "cpu"
    from torch.nn.attention import SDPBackend

    q = torch.randn(1, HEADS, 512, HEAD_DIM, device=device, dtype=dtype)
    try:
        return SDPBackend(torch._fused_sdp_choice(q, q, q)).name.lower().removesuffix("_attention")
    except (AttributeError, RuntimeError, ValueError) as e:  # a private API: say so rather than guess
        return f"unknown ({type(e).__name__})"


def cpu_skip_reason(kname: str) -> str | None:
    """Why ``kname`` cannot run forward + backward on CPU here (None: it can). ``triton_block`` runs under Triton's
    interpreter when ``TRITON_INTERPRET=1`` was set before Triton was imported (slow: tiny sizes only)."""
    kernel = KERNELS[kname]
    if kname == "triton_block" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    if not kernel.runs_on_cpu:
        return "it runs on CUDA GPUs only"
    if not kernel.trains_on_cpu:
        return "it has no backward there"
    return None


def make_step(fn: Callable, q, k, v) -> Callable[[], None]:
    go = torch.randn_like(q)

    def step() -> None:
        out = fn(q, k, v)
        torch.autograd.backward(out, go)
        for t in (q, k, v):
            t.grad = None

    return step


def run(args: argparse.Namespace, on_row: Callable[[list[dict], list[str]], None] | None = None) -> list[dict]:
    """The rows; ``on_row(rows, failed)`` after each one (gpu_check keeps what was measured if it is stopped)."""
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    rows: list[dict] = []
    failed: list[str] = []
    for n in args.seq_lens:
        reset_compiled()
        g = torch.Generator().manual_seed(0)
        q, k, v = (
            torch.randn(args.batch, HEADS, n, HEAD_DIM, generator=g).to(device, dtype).requires_grad_()
            for _ in range(3)
        )
        dense = make_step(F.scaled_dot_product_attention, q, k, v)
        m_dense = peak_memory_mib(dense, device)
        candidates = []
        if args.math_baseline and n <= args.math_max_n:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def math_sdpa(q, k, v):
                with sdpa_kernel(SDPBackend.MATH):
                    return F.scaled_dot_product_attention(q, k, v)

            candidates.append(("sdpa_math", "none", None, math_sdpa))
        if args.folded_baseline:

            def folded_sdpa(q, k, v):  # the same dense attention with heads moved to SDPA's batch axis
                return F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v))).transpose(0, 1)

            candidates.append(("sdpa_folded", "none", None, folded_sdpa))
        for lname in args.layouts:
            for kname in args.kernels:
                why = cpu_skip_reason(kname) if device.type == "cpu" else None
                if why is not None:
                    if n == args.seq_lens[0] and lname == args.layouts[0]:
                        print(f"skipping kernel {kname!r} on CPU: {why} (use --device cuda)")
                    continue
                if kname == "dense" and n > args.max_dense_masked_n:
                    continue
                candidates.append((kname, lname, layouts()[lname](), None))
        for kname, lname, cfg, fn in candidates:
            density = 1.0
            if cfg is not None:
                mod = BlockSparseAttention(cfg, kernel=kname, max_seq_length=n).to(device)
                density = layout_density(mod.layout_for(n))
                fn = lambda a, b, c, mod=mod: mod(a, b, c)  # noqa: E731
            step = make_step(fn, q, k, v)
            try:
                times = paired_times(step, dense, device, args.repeats)
                m = peak_memory_mib(step, device)
            except RuntimeError as e:  # out of memory etc.: record, keep going
                print(f"N={n:5d} {kname:12s} {lname:16s} failed: {e}", flush=True)
                failed.append(f"{kname}:{lname}@{n}: {str(e).splitlines()[0][:200]}")
                if on_row:
                    on_row(rows, failed)
                continue
            row = dict(
                kernel=kname,
                layout=lname,
                n=n,
                density=density,
                **times,
                mem_mib=m,
                dense_mem_mib=m_dense,
                time_ratio=times["time_best_s"] / times["dense_time_best_s"],
                median_time_ratio=times["time_s"] / times["dense_time_s"],
                mem_ratio=m / m_dense,
                target=args.target_factor * density,
            )
            row["meets_time"] = row["time_ratio"] <= row["target"]
            row["meets_mem"] = row["mem_ratio"] <= row["target"]
            rows.append(row)
            print(
                f"N={n:5d} {kname:12s} {lname:16s} density {density:5.3f}: best {times['time_best_s'] * 1e3:9.1f} ms "
                f"vs dense {times['dense_time_best_s'] * 1e3:8.1f} ms = {row['time_ratio']:.2f}x (median "
                f"{row['median_time_ratio']:.2f}x; target <= {row['target']:.2f}x); "
                f"{m:8.1f} MiB vs {m_dense:7.1f} MiB = {row['mem_ratio']:.2f}x",
                flush=True,
            )
            if on_row:
                on_row(rows, failed)
        del q, k, v
    return rows


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    series = sorted({(r["kernel"], r["layout"]) for r in rows})
    panels = ((axes[0], "time_ratio", "time / dense SDPA"), (axes[1], "mem_ratio", "peak memory / dense SDPA"))
    for ax, key, label in panels:
        for kern, lay in series:
            pts = sorted((r["n"], r[key]) for r in rows if r["kernel"] == kern and r["layout"] == lay)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{kern}:{lay}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown_table(result: dict) -> str:
    """The JSON result as the Markdown table recorded in docs/model.md."""
    lines = [
        f"Machine: {result['meta']['machine']}; {result['meta']['dtype']}, batch {result['meta']['batch']}, "
        f"{result['meta']['heads']} heads x {result['meta']['head_dim']}, fwd+bwd, "
        f"{result['meta']['repeats']} runs alternated with the dense baseline; time ratio = best / best "
        "(median / median next to it).",
        "",
        "| N | kernel | layout | density | best ms | dense best ms | time ratio | median ratio | target | mem MiB "
        "| dense MiB | mem ratio |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        ok = "" if r["layout"] == "none" else (" ✓" if r["meets_time"] else " ✗")
        okm = "" if r["layout"] == "none" else (" ✓" if r["meets_mem"] else " ✗")
        lines.append(
            f"| {r['n']} | {r['kernel']} | {r['layout']} | {r['density']:.3f} | "
            f"{r['time_best_s'] * 1e3:.0f} | {r['dense_time_best_s'] * 1e3:.0f} | {r['time_ratio']:.2f}{ok} | "
            f"{r['median_time_ratio']:.2f} | {r['target']:.2f} | "
            f"{r['mem_mib']:.1f} | {r['dense_mem_mib']:.1f} | {r['mem_ratio']:.2f}{okm} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.errors.run_entry)."""
    from common.errors import run_entry

    return run_entry("benchmarks.attention", _main, argv)


def _main(argv: list[str]) -> int:
    from common.errors import UserError, write_errors
    from common.inputs import read_json_object
    from common.outputs import check_dir_writable

    p = argparse.ArgumentParser(prog="benchmarks.attention", description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=Path("out/bench_attention"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--layouts", nargs="+", choices=sorted(layouts()), default=list(TUNED_LAYOUTS))
    p.add_argument("--kernels", nargs="+", choices=sorted(KERNELS), default=["block_gather", "flex"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--math-baseline", action="store_true", help="also time SDPA's math backend (N^2 scores kept)")
    p.add_argument(
        "--folded-baseline",
        action="store_true",
        help="also time dense SDPA on [H, B, N, D] (heads as batch), the call layout block_gather uses",
    )
    p.add_argument("--math-max-n", type=int, default=2048, help="largest N for --math-baseline")
    p.add_argument("--max-dense-masked-n", type=int, default=2048, help="skip the masked 'dense' kernel above this N")
    p.add_argument("--table", type=Path, help="only print the Markdown table of an existing attention.json")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--no-plot", action="store_true", help="write no attention.png (gpu_check: the table is enough)")
    p.add_argument(
        "--target-factor",
        type=float,
        default=1.15,
        help="target: time and memory <= this x density x the dense baseline (1.15; gpu_check uses 1.3 "
        "for flex on GPUs)",
    )
    args = p.parse_args(argv)
    if args.table:
        what = "an attention.json this benchmark wrote"
        try:
            print(markdown_table(read_json_object(args.table, "--table", what)))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"--table {args.table}: not a results file of this benchmark ({e!r}); give {what}"
            ) from None
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA GPU here (torch {torch.__version__}); use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    check_dir_writable(args.out_dir, "--out-dir")  # before the timings
    machine = (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    if args.device.startswith("cuda"):
        machine = f"{torch.cuda.get_device_name()} ({machine})"
    meta = dict(
        machine=machine,
        device=args.device,
        dtype=args.dtype,
        batch=args.batch,
        heads=HEADS,
        head_dim=HEAD_DIM,
        repeats=args.repeats,
        dense_backend=dense_backend(torch.device(args.device), DTYPES[args.dtype]),
        commit=commit_info()[0],  # benchmarks/auto_table.py cites it
    )
    if args.device.startswith("cuda"):
        meta["capability"] = list(torch.cuda.get_device_capability())  # auto's measured table is keyed by it
    out = args.out_dir / "attention.json"

    def write(rows: list[dict], failed: list[str], done: bool = False) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(meta=meta, rows=rows, failed=failed, complete=done), indent=1))
        tmp.replace(out)

    failed: list[str] = []
    with write_errors(f"--out-dir {args.out_dir}", args.out_dir):
        rows = run(args, on_row=lambda r, f: (failed.__setitem__(slice(None), f), write(r, f)))
        write(rows, failed, done=True)
        if not args.no_plot:
            plot(
                rows,
                args.out_dir / "attention.png",
                f"attention fwd+bwd, {args.dtype}, B={args.batch}, 12x64 heads: {machine}",
            )
        (args.out_dir / "attention.md").write_text(markdown_table(dict(meta=meta, rows=rows)) + "\n")
    print(f"wrote {args.out_dir / 'attention.json'}, attention.md and attention.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
