"""What the training step's peak memory holds: one optimizer step of benchmarks/train_step_ds.py's set-up (our model,
the DeepSpeed engine, the trainer's inputs) under torch.profiler's memory profile, replayed to the moment of the peak
and split by what each live tensor is (parameter, gradient, optimizer state, activation, temporary, autograd detail,
input, unknown) and by the op that made it, with the frame of our code that called that op. Cases side by side in one
run, so the question "why does the sparse step peak above dense" (issue #41) is answered by category and by op.

    python -m benchmarks.step_memory --model-preset bert-base --cases dense@4096 blockbert-n2@4096 --json out/m.json
    python -m benchmarks.step_memory --model-preset tiny --device cpu --cases dense@128 blockbert-n2@128   # smoke

The replay uses torch.profiler's memory timeline (``profile_memory=True``, the data behind
``export_memory_timeline``), which sees every allocation of the device's allocator made inside the profiled step;
memory allocated before the step (parameters, optimizer states, the batches) enters as pre-existing.
"""

from __future__ import annotations

import argparse
import os
import platform
from collections import Counter

import torch

from benchmarks.train_step_ds import PRESETS, TOKENS_PER_STEP, Case, TrainStep, parse_cases, sync

REPO_DIRS = ("model/", "pretrain/", "data_pipeline/", "common/")
"""Paths of our code: an op is attributed to the innermost frame in one of them."""


def _our_frame(event) -> str:
    """The innermost Python frame of our code above a profiler event ("model/bert.py(377): forward"), else ''."""
    e = event.parent
    while e is not None:
        name = e.name
        for d in REPO_DIRS:
            i = name.find(d)
            if i >= 0 and ".py(" in name:
                return name[i:]
        e = e.parent
    return ""


def peak_breakdown(prof, device: torch.device, top: int) -> dict:
    """Live bytes at the peak of ``device`` within the profile, by category and by (category, op, our frame)."""
    from torch.profiler._memory_profiler import Action, MemoryProfileTimeline, TensorKey

    memory = prof._memory_profile()
    timeline = MemoryProfileTimeline(memory)
    made_by: dict = {}
    for node in memory._data_flow_graph.flow_nodes:
        for key in list(node.outputs) + list(node.intermediates):
            made_by.setdefault(key, (node._event.name, _our_frame(node._event)))
    live: dict = {}
    total = peak = 0
    peak_live: dict = {}
    events = [e for e in timeline.timeline if e[2][0].device == device]
    for i, (_, action, (key, version), nbytes) in enumerate(events):
        if action in (Action.PREEXISTING, Action.CREATE):
            live[(key, version)] = nbytes
            total += nbytes
        elif action == Action.INCREMENT_VERSION:
            live[(key, version + 1)] = live.pop((key, version), nbytes)
        elif action == Action.DESTROY:
            total -= live.pop((key, version), nbytes)
        last_at_time = i + 1 == len(events) or events[i + 1][0] != events[i][0]
        if last_at_time and total > peak:
            peak, peak_live = total, dict(live)
    by_category: Counter = Counter()
    by_op: Counter = Counter()
    for (key, version), nbytes in peak_live.items():
        cat = memory._categories.get(key, version) if isinstance(key, TensorKey) else None
        cat_name = "unknown" if cat is None else cat.name.lower()
        by_category[cat_name] += nbytes
        op, frame = made_by.get(key, ("(before the step)", ""))
        by_op[(cat_name, op, frame)] += nbytes
    mib = 2**20
    return {
        "peak_mib": peak / mib,
        "by_category_mib": {k: v / mib for k, v in by_category.most_common()},
        "top": [
            {"category": c, "op": op, "frame": frame, "mib": v / mib} for (c, op, frame), v in by_op.most_common(top)
        ],
    }


def measure(variant: str, seq_len: int, args, device: torch.device) -> dict:
    from torch.profiler import ProfilerActivity, profile

    ts = TrainStep(Case(variant, args.precision, seq_len, zero=args.zero), args, device)
    try:
        for _ in range(args.warmup):
            ts.step()
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
            ts.step()
            sync(device)
        row = {"variant": variant, "seq_len": seq_len, "batch": ts.batch, "kernel_used": ts.kernels_used() or "sdpa"}
        if device.type == "cuda":
            row["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        row.update(peak_breakdown(prof, device, args.top))
        return row
    finally:
        ts.close()


def report_lines(rows: list[dict]) -> list[str]:
    """Categories side by side (MiB), then each case's largest live groups at its peak."""
    ok = [r for r in rows if "error" not in r]
    cats = sorted({c for r in ok for c in r["by_category_mib"]})
    lines = ["case | peak MiB | " + " | ".join(cats)]
    for r in ok:
        vals = " | ".join(f"{r['by_category_mib'].get(c, 0.0):.1f}" for c in cats)
        lines.append(
            f"{r['variant']}@{r['seq_len']} (b={r['batch']}, {r['kernel_used']}) | {r['peak_mib']:.1f} | {vals}"
        )
    for r in rows:
        if "error" in r:
            lines.append(f"{r['variant']}@{r['seq_len']}: FAILED {r['error']}")
            continue
        lines.append(f"-- {r['variant']}@{r['seq_len']}: the largest live groups at the peak")
        lines += [f"   {t['mib']:9.1f} MiB  {t['category']:15s} {t['op']:40s} {t['frame']}" for t in r["top"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.errors.run_entry)."""
    from common.errors import run_entry

    return run_entry("benchmarks.step_memory", _main, argv)


def _main(argv: list[str]) -> int:
    from benchmarks.train_step_ds import _init_single_rank, _write_json
    from common.outputs import check_file_writable

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.step_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-preset", choices=sorted(TOKENS_PER_STEP), default="bert-base")
    p.add_argument("--cases", nargs="+", metavar="VARIANT@N", default=["dense@4096", "blockbert-n2@4096"])
    p.add_argument("--precision", choices=["fp16", "bf16"], default="bf16")
    p.add_argument("--zero", type=int, choices=[0, 1, 2], default=1, help="ZeRO stage of ds_configs/zero{S}_{P}.json")
    p.add_argument("--kernel", default="auto", help="attention kernel of the sparse variants")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--tokens", type=int, help="b x N per step (default: the preset's)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--top", type=int, default=12, help="how many (category, op, frame) groups to list per case")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    if args.json:
        check_file_writable(args.json, "--json")
    try:
        cases = parse_cases(args.cases)
    except ValueError as e:
        p.error(str(e))
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA GPU here (torch {torch.__version__}); use --device cpu")
    preset = PRESETS[args.model_preset]
    args.hidden, args.layers, args.heads = preset["hidden_size"], preset["num_layers"], preset["num_attention_heads"]
    args.tokens = args.tokens or TOKENS_PER_STEP[args.model_preset]
    args.data_path = None  # synthetic full rows: the memory question does not depend on the text
    if args.device == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    device = _init_single_rank()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    rows = []
    for v, n in cases:
        try:
            rows.append(measure(v, n, args, device))
        except Exception as e:  # record and go on: one failure must not hide the other cases
            rows.append({"variant": v, "seq_len": n, "error": f"{type(e).__name__}: {e}"})
        if args.json:
            _write_json(args.json, {"device": name, "preset": args.model_preset, "rows": rows, "complete": False})
    print(f"device {name}; torch {torch.__version__}; {args.model_preset}, {args.precision}, ZeRO-{args.zero}")
    print("\n".join(report_lines(rows)), flush=True)
    if args.json:
        _write_json(args.json, {"device": name, "preset": args.model_preset, "rows": rows, "complete": True})
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
