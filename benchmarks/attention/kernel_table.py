"""``--measure time`` (the default): forward+backward time and peak memory of each attention kernel x layout vs
dense SDPA without a mask (the kernel table of docs/model.md, docs/gpu_reports/ and ``auto``'s measured table).

Each ``--cases LAYOUT@N`` is measured with every ``--kernels`` kernel, the cases of one N against one dense baseline
(lengths in the order they first appear). Writes ``attention.json`` (one row per kernel x layout x N; rewritten after
every row, ``complete`` at the end), ``attention.md`` and ``attention.png`` (time and memory ratios vs the dense
baseline, with the target line 1.15 x density) to ``--out-dir``. Both sides run benchmarks/attention/steps.py's step
(q/k/v as views of one fused projection) under the same attention dropout (``--dropout``, default 0; the paper recipes
train with 0.1, and ``auto``'s table must be measured with the dropout training uses: the dense baseline, the SDPA
baselines and every kernel get it; ``flex``, which has none, is left out with a note when it is on); ``dense`` given a
sparse layout is dense SDPA *with* the layout's mask.

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` minus what was allocated before the step; on CPU the step runs
once under ``torch.profiler`` and the peak of its replayed allocations counts (outputs, saved activations, the
fused q/k/v gradient, temporaries inside fused kernels), excluding the inputs made beforehand. Time: ``--repeats``
runs after one warm-up, without the profiler, alternating with the dense baseline; the time ratio is best-of-N over
best-of-N (load only ever adds time), the median ratio is recorded next to it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from benchmarks.attention.layouts import HEAD_DIM, HEADS, layouts
from benchmarks.attention.steps import DTYPES, fused_qkv, make_step, paired_times, peak_memory_mib
from benchmarks.report import commit_info, markdown_table, write_json
from benchmarks.support.cases import by_length
from model.attention import BlockSparseAttention, layout_density
from model.attention.kernels import KERNELS
from model.attention.kernels.auto import NO_DROPOUT_KERNELS


def reset_compiled() -> None:
    """Called between groups (one per sequence length): Dynamo's caches and flex's compiled callables start empty,
    so no group inherits another's compilations and none runs near Dynamo's recompile limit, past which compiled
    FlexAttention would fall back to its unfused eager path (tests/test_cuda_contracts.py)."""
    import torch._dynamo

    from model.attention.kernels import flex

    torch._dynamo.reset()
    flex._compiled_flex.clear()


def dense_backend(device: torch.device, dtype: torch.dtype) -> str:
    """The SDPA backend torch picks for the dense baseline here (flash, cudnn, efficient, math), as its dispatcher
    (``torch._fused_sdp_choice``) decides for an unmasked call of the benchmark's head shape and q/k/v layout."""
    if device.type != "cuda":
        return "cpu"
    from torch.nn.attention import SDPBackend

    from benchmarks.attention.steps import heads_of

    q, k, v = heads_of(fused_qkv(1, HEADS, 512, HEAD_DIM, device, dtype))
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v)).name.lower().removesuffix("_attention")
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


def dense_sdpa(dropout_p: float) -> Callable:
    """The dense baseline: unmasked SDPA under the same attention dropout as the case it is compared with."""
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)


def _math_sdpa(dropout_p: float) -> Callable:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(q, k, v):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    return fn


def _folded_sdpa(dropout_p: float) -> Callable:
    """The same dense attention with heads moved to SDPA's batch axis (the call layout block_gather uses)."""
    return lambda q, k, v: F.scaled_dot_product_attention(
        *(t.transpose(0, 1) for t in (q, k, v)), dropout_p=dropout_p
    ).transpose(0, 1)


Case = tuple[str, str, "BlockSparseAttention | None", Callable]
"""(kernel, layout, attention module or None for the SDPA baselines, ``(q, k, v) -> out``)."""


def skipped_kernels(args: argparse.Namespace, device: torch.device) -> dict[str, str]:
    """--kernels that cannot run here -> why (a CPU without their backward, flex under dropout)."""
    out = {}
    for kname in args.kernels:
        why = cpu_skip_reason(kname) if device.type == "cpu" else None
        if why is None and args.dropout > 0 and kname in NO_DROPOUT_KERNELS:
            why = f"it has no attention dropout (--dropout {args.dropout:g})"
        if why is not None:
            out[kname] = why
    return out


def candidates(args: argparse.Namespace, n: int, lnames: list[str], device: torch.device) -> Iterator[Case]:
    """The :data:`Case` of every row at ``n`` (the layouts ``--cases`` gives at ``n``), one at a time (one module and
    its plans alive at once)."""
    p = args.dropout
    if args.math_baseline and n <= args.math_max_n:
        yield "sdpa_math", "none", None, _math_sdpa(p)
    if args.folded_baseline:
        yield "sdpa_folded", "none", None, _folded_sdpa(p)
    skipped = skipped_kernels(args, device)
    for lname in lnames:
        for kname in args.kernels:
            if kname in skipped:
                continue
            if kname == "dense" and n > args.max_dense_masked_n:
                continue
            cfg = layouts()[lname]()
            mod = BlockSparseAttention(cfg, kernel=kname, max_seq_length=n, dropout_p=p).to(device).train()
            yield kname, lname, mod, lambda a, b, c, mod=mod: mod(a, b, c)


def measure_row(
    args: argparse.Namespace, case: Case, qkv_BN3HD: torch.Tensor, dense: Callable[[], None], m_dense: float
) -> dict:
    """One row: paired times against the dense step, peak memory, ratios and targets."""
    kname, lname, mod, fn = case
    device, n = qkv_BN3HD.device, qkv_BN3HD.shape[1]
    density = 1.0 if mod is None else layout_density(mod.layout_for(n))
    step = make_step(fn, qkv_BN3HD)
    times = paired_times(step, dense, device, args.repeats)
    m = peak_memory_mib(step, device)
    row = dict(kernel=kname, layout=lname, n=n, density=density, **times, mem_mib=m, dense_mem_mib=m_dense)
    row.update(
        time_ratio=times["time_best_s"] / times["dense_time_best_s"],
        median_time_ratio=times["time_s"] / times["dense_time_s"],
        mem_ratio=m / m_dense,
        target=args.target_factor * density,
    )
    row["meets_time"] = row["time_ratio"] <= row["target"]
    row["meets_mem"] = row["mem_ratio"] <= row["target"]
    print(
        f"N={n:5d} {kname:12s} {lname:16s} density {density:5.3f}: best {times['time_best_s'] * 1e3:9.1f} ms "
        f"vs dense {times['dense_time_best_s'] * 1e3:8.1f} ms = {row['time_ratio']:.2f}x (median "
        f"{row['median_time_ratio']:.2f}x; target <= {row['target']:.2f}x); "
        f"{m:8.1f} MiB vs {m_dense:7.1f} MiB = {row['mem_ratio']:.2f}x",
        flush=True,
    )
    return row


def run(args: argparse.Namespace, on_row: Callable[[list[dict], list[str]], None] | None = None) -> list[dict]:
    """The rows; ``on_row(rows, failed)`` after each one (a stopped run keeps what was measured)."""
    device = torch.device(args.device)
    rows: list[dict] = []
    failed: list[str] = []
    for kname, why in skipped_kernels(args, device).items():
        print(f"skipping kernel {kname!r}: {why}")
    for n, lnames in by_length(args.cases):
        reset_compiled()
        qkv = fused_qkv(args.batch, HEADS, n, HEAD_DIM, device, DTYPES[args.dtype])
        dense = make_step(dense_sdpa(args.dropout), qkv)
        m_dense = peak_memory_mib(dense, device)
        for case in candidates(args, n, lnames, device):
            try:
                rows.append(measure_row(args, case, qkv, dense, m_dense))
            except RuntimeError as e:  # out of memory etc.: record, keep going
                print(f"N={n:5d} {case[0]:12s} {case[1]:16s} failed: {e}", flush=True)
                failed.append(f"{case[0]}:{case[1]}@{n}: {str(e).splitlines()[0][:200]}")
            if on_row:
                on_row(rows, failed)
        del qkv
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


def _mark(r: dict, ratio: str, meets: str) -> str:
    return f"{r[ratio]:.2f}" + ("" if r["layout"] == "none" else (" ✓" if r[meets] else " ✗"))


COLUMNS = [
    ("n", "N"),
    ("kernel", "kernel"),
    ("layout", "layout"),
    ("density", "density", ".3f"),
    ("best_ms", "best ms", ".0f"),
    ("dense_best_ms", "dense best ms", ".0f"),
    ("time_mark", "time ratio"),
    ("median_time_ratio", "median ratio", ".2f"),
    ("target", "target", ".2f"),
    ("mem_mib", "mem MiB", ".1f"),
    ("dense_mem_mib", "dense MiB", ".1f"),
    ("mem_mark", "mem ratio"),
]


def table(result: dict) -> str:
    """The JSON result as the Markdown table recorded in docs/model.md."""
    meta = result["meta"]
    qkv = "q/k/v as views of one fused projection" if meta.get("qkv") == "fused_views" else "contiguous q/k/v"
    head = (
        f"Machine: {meta['machine']}; {meta['dtype']}, batch {meta['batch']}, {meta['heads']} heads x "
        f"{meta['head_dim']}, fwd+bwd, {qkv}, attention dropout {meta.get('dropout', 0.0)}, {meta['repeats']} runs "
        "alternated with the dense baseline; time ratio = best / best (median / median next to it)."
    )
    shown = [
        dict(
            r,
            best_ms=r["time_best_s"] * 1e3,
            dense_best_ms=r["dense_time_best_s"] * 1e3,
            time_mark=_mark(r, "time_ratio", "meets_time"),
            mem_mark=_mark(r, "mem_ratio", "meets_mem"),
        )
        for r in result["rows"]
    ]
    return "\n".join([head, "", *markdown_table(shown, COLUMNS)])


def command(args: argparse.Namespace) -> int:
    """``--measure time``: the table of an existing report (``--table``), else measure and write the report."""
    from common.errors import UserError, write_errors
    from common.inputs import read_json_object
    from common.outputs import check_dir_writable

    if args.table:
        what = "an attention.json this benchmark wrote"
        try:
            print(table(read_json_object(args.table, "--table", what)))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"--table {args.table}: not a results file of this benchmark ({e!r}); give {what}"
            ) from None
        return 0
    if not 0.0 <= args.dropout < 1.0:
        raise UserError(f"--dropout {args.dropout}: give an attention dropout probability in [0, 1)")
    check_dir_writable(args.out_dir, "--out-dir")  # before the timings
    meta = report_meta(args)
    out = args.out_dir / "attention.json"
    failed: list[str] = []

    def write(rows: list[dict], done: bool = False) -> None:
        write_json(out, dict(meta=meta, rows=rows, failed=failed, complete=done), "--out-dir")

    rows = run(args, on_row=lambda r, f: (failed.__setitem__(slice(None), f), write(r)))
    write(rows, done=True)
    with write_errors(f"--out-dir {args.out_dir}", args.out_dir):
        if not args.no_plot:
            title = f"attention fwd+bwd, {args.dtype}, B={args.batch}, {HEADS}x{HEAD_DIM} heads: {meta['machine']}"
            plot(rows, args.out_dir / "attention.png", title)
        (args.out_dir / "attention.md").write_text(table(dict(meta=meta, rows=rows)) + "\n")
    print(f"wrote {out}, attention.md" + ("" if args.no_plot else " and attention.png"))
    return 0


def report_meta(args: argparse.Namespace) -> dict:
    """What a report was measured with (devtools/auto_table.py reads the commit, capability, dropout and qkv)."""
    from benchmarks.attention.steps import machine

    meta = dict(
        machine=machine(args.device),
        device=args.device,
        dtype=args.dtype,
        batch=args.batch,
        heads=HEADS,
        head_dim=HEAD_DIM,
        repeats=args.repeats,
        dropout=args.dropout,
        qkv="fused_views",
        dense_backend=dense_backend(torch.device(args.device), DTYPES[args.dtype]),
        commit=commit_info()[0],
    )
    if args.device.startswith("cuda"):
        meta["capability"] = list(torch.cuda.get_device_capability())  # auto's measured table is keyed by it
    return meta
