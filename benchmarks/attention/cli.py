"""The one command line of the attention benchmark: ``--measure`` picks what is measured, and one table of flags
(:func:`flags`) says which flags each measure takes, with its defaults, so a flag such as ``--cases`` or ``--kernels``
is written once and means the same under every measure that has it. ``--cases LAYOUT@N`` (``FAMILY@N`` under
``--measure memory``) is the syntax benchmarks.step's ``--cases VARIANT@N`` has (benchmarks/support/cases.py)."""

from __future__ import annotations

import argparse
import platform
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.attention import flex_tiles, kernel_table, masks, retained_memory, triton_tiles
from benchmarks.attention.layouts import TUNED_LAYOUTS, layouts
from benchmarks.attention.steps import DTYPES
from benchmarks.support.cases import CaseSyntax
from model.attention import sparsebert
from model.attention.kernels import KERNELS

PROG = "benchmarks.attention"
MEASURES: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
    "time": (kernel_table.command, kernel_table.__doc__),
    "memory": (retained_memory.command, retained_memory.__doc__),
    "tiles": (triton_tiles.command, triton_tiles.__doc__),
    "masks": (masks.command, masks.__doc__),
    "flex-tiles": (flex_tiles.command, flex_tiles.__doc__),
}
"""``--measure`` -> (the function that runs it, the docstring its ``--help`` shows)."""


def _memory_kernels() -> list[str]:
    """``--measure memory``'s kernels: those that train on CPU, and block_gather with its split plan off."""
    cpu = sorted(k for k in KERNELS if KERNELS[k].runs_on_cpu and KERNELS[k].trains_on_cpu and k != "auto")
    return cpu + ([retained_memory.GATHER_ONLY] if "block_gather" in cpu else [])


def case_flags() -> dict[str, dict[str, dict[str, Any]]]:
    """flag -> {measure: argparse keywords} for the flags several measures share (the cases, kernels, shape, device,
    repeats, where results go), built when asked (the registries' choices as they are)."""
    timed = CaseSyntax(tuple(layouts()), "LAYOUT")
    tuned = CaseSyntax(tuple(TUNED_LAYOUTS), "LAYOUT")
    fams = CaseSyntax(tuple(retained_memory.families()), "FAMILY")
    every = ",".join(TUNED_LAYOUTS)
    mem_kernels = _memory_kernels()
    gpu = "cuda" if torch.cuda.is_available() else "cpu"
    out_dir = dict(type=Path, help="where the JSON (and the table, the plot) go")
    return {
        "--cases": {
            "time": timed.flag([f"{every}@512,1024,2048,4096"], "the layouts to time, each at its N"),
            "memory": fams.flag([f"{','.join(fams.names)}@4096,8192"], "the layout families to measure, each at its N"),
            "tiles": tuned.flag(["blockbert_n2,local_bi_b64@4096,8192"], "the layouts to sweep, each at its N"),
            "flex-tiles": tuned.flag([f"{every}@4096,8192"], "the layouts whose tiles to count, each at its N"),
        },
        "--kernels": {
            "time": dict(nargs="+", choices=sorted(KERNELS), default=["block_gather", "flex"]),
            "memory": dict(nargs="+", choices=mem_kernels, default=[k for k in mem_kernels if k != "dense"]),
        },
        "--dtype": {
            "time": dict(choices=sorted(DTYPES), default="fp32"),
            "memory": dict(choices=list(DTYPES), default="fp32"),
            "tiles": dict(choices=sorted(DTYPES), default="bf16"),
        },
        "--batch": {
            "time": dict(type=int, default=1),
            "tiles": dict(type=int, default=8),
            "masks": dict(type=int, default=2),
        },
        "--device": {"time": dict(default="cpu"), "tiles": dict(default=gpu)},
        "--repeats": {
            m: dict(type=int, default=3, help="timed runs after one warm-up") for m in ("time", "tiles", "masks")
        },
        "--threads": {
            m: dict(type=int, help="torch intra-op threads (default: torch's choice)") for m in ("time", "masks")
        },
        "--out-dir": {
            "time": dict(out_dir, default=Path("out/bench_attention")),
            "memory": dict(out_dir, default=Path("out/bench_attention_memory")),
        },
    }


def measure_flags() -> dict[str, dict[str, dict[str, Any]]]:
    """flag -> {measure: argparse keywords} for the flags of one measure only."""
    time = {
        "--math-baseline": dict(action="store_true", help="also time SDPA's math backend (N^2 scores kept)"),
        "--folded-baseline": dict(
            action="store_true",
            help="also time dense SDPA on [H, B, N, D] (heads as batch), the call layout block_gather uses",
        ),
        "--math-max-n": dict(type=int, default=2048, help="largest N for --math-baseline"),
        "--max-dense-masked-n": dict(type=int, default=2048, help="skip the masked 'dense' kernel above this N"),
        "--table": dict(type=Path, help="only print the Markdown table of an existing attention.json"),
        "--no-plot": dict(action="store_true", help="write no attention.png (gpu_check: the table is enough)"),
        "--dropout": dict(
            type=float,
            default=0.0,
            help="attention dropout of both sides (the kernels and the dense baseline); 0.1 = the paper recipes' "
            "training (measure auto's table with it); flex, which has none, is left out when > 0",
        ),
        "--target-factor": dict(
            type=float,
            default=1.15,
            help="target: time and memory <= this x density x the dense baseline (1.15; gpu_check uses 1.3 "
            "for flex on GPUs)",
        ),
    }
    memory = {
        "--write-doc": dict(type=Path, nargs="?", const=Path("docs/model.md"), default=None),
        "--model-level": dict(
            action="store_true",
            help="measure the one-layer model's training forward (MODEL: its own N) for every layout-only family "
            "instead of --cases",
        ),
        "--emulate-cuda": dict(
            action="store_true",
            help="run on CUDA's branches with CUDA's SDPA contracts (benchmarks/support/cuda_emulation.py): "
            "the bytes a GPU keeps",
        ),
        "--machine": dict(default=f"{platform.node()} ({platform.processor() or platform.machine()}), CPU"),
    }
    tiles = {
        "--configs": dict(nargs="+", default=triton_tiles.DEFAULT_CONFIGS, help="QxK:WARPS:STAGES each"),
        "--json": dict(help="write the rows and the best configuration per layout here"),
    }
    masks_ = {
        "--seq-length": dict(type=int, default=512),
        "--patterns": dict(
            nargs="+",
            default=["no_diagonal", "longformer", "bigbird", "star", "fixed"],
            choices=sparsebert.pattern_names("fixed"),
            help="token masks (fixed ones: the registry's) to time",
        ),
        "--masks-only": dict(action="store_true", help="skip the DIET-bias and DAM rows"),
        "--out": dict(type=Path, help="write the rows here (JSON)"),
    }
    per = {"time": time, "memory": memory, "tiles": tiles, "masks": masks_}
    return {flag: {m: kw} for m, table in per.items() for flag, kw in table.items()}


def flags() -> dict[str, dict[str, dict[str, Any]]]:
    """Every flag of every measure: flag -> {measure: argparse keywords}."""
    return {**case_flags(), **measure_flags()}


def parser(measure: str, table: dict[str, dict[str, dict[str, Any]]]) -> argparse.ArgumentParser:
    """The parser of one measure: ``--measure`` and the flags the table gives that measure."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description=MEASURES[measure][1],
        epilog=f"Measures: {', '.join(MEASURES)} (default time); `--measure M --help` lists the flags of M.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--measure", choices=list(MEASURES), default="time", help="what to measure (default: time)")
    for flag, per in table.items():
        if measure in per:
            p.add_argument(flag, **per[measure])
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` under its ``--measure``'s parser; a flag of another measure is one line naming that measure."""
    from common.errors import UserError

    pre = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    pre.add_argument("--measure", choices=list(MEASURES), default="time")
    measure = pre.parse_known_args(argv)[0].measure
    table = flags()
    p = parser(measure, table)
    args, rest = p.parse_known_args(argv)
    for flag in (word.split("=")[0] for word in rest):
        other = " / ".join(m for m in table.get(flag, {}) if m != measure)
        if other:
            raise UserError(f"{flag} is a flag of --measure {other}, not of --measure {measure}")
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if getattr(args, "model_level", False) and any(w.split("=")[0] == "--cases" for w in argv):
        raise UserError("--cases: --model-level measures its one-layer model at its own N; give one of the two")
    if getattr(args, "device", "cpu").startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA GPU here (torch {torch.__version__}); use --device cpu")
    return args


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    from common.error_exit import run_entry

    return run_entry(PROG, _main, argv)


def _main(argv: list[str]) -> int:
    args = parse(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    return MEASURES[args.measure][0](args)
