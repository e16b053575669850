"""``--measure memory``: what the training step's peak memory holds: one optimizer step of the harness's set-up (our
model, the DeepSpeed engine, the trainer's inputs) under torch.profiler's memory profile, replayed to the moment of
the peak and split by what each live tensor is (parameter, gradient, optimizer state, activation, temporary,
autograd detail, input, unknown) and by the op that made it, with the frame of our code that called that op. Cases
side by side in one run, so the question "why does the sparse step peak above dense" (issue #41) is answered by
category and by op.

The replay uses torch.profiler's memory timeline (``profile_memory=True``, the data behind
``export_memory_timeline``), which sees every allocation of the device's allocator made inside the profiled step;
memory allocated before the step (parameters, optimizer states, the batches) enters as pre-existing.
"""

from __future__ import annotations

from collections import Counter

import torch

from benchmarks.report import markdown_table
from benchmarks.step.case import Case
from benchmarks.step.engine import TrainStep, sync

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
    """One case's row: ``args.warmup`` steps, then one step under the memory profiler, its peak broken down."""
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


def run(args, cases: list[tuple[str, int]], device: torch.device, name: str, write) -> dict:
    """Every case's row, ``write(result)`` after each."""
    result = {"device": name, "preset": args.model_preset, "rows": [], "complete": False}
    for v, n in cases:
        try:
            result["rows"].append(measure(v, n, args, device))
        except Exception as e:  # record and go on: one failure must not hide the other cases
            result["rows"].append({"variant": v, "seq_len": n, "error": f"{type(e).__name__}: {e}"})
        write(result)
    result["complete"] = True
    return result


def markdown(result: dict) -> list[str]:
    """Categories side by side (MiB), then each case's largest live groups at its peak."""
    rows = result["rows"]
    ok = [r for r in rows if "error" not in r]
    cats = sorted({c for r in ok for c in r["by_category_mib"]})
    shown = [
        {"case": f"{r['variant']}@{r['seq_len']} (b={r['batch']}, {r['kernel_used']})", "peak": r["peak_mib"]}
        | {c: r["by_category_mib"].get(c, 0.0) for c in cats}
        for r in ok
    ]
    lines = markdown_table(shown, [("case", "case"), ("peak", "peak MiB", ".1f")] + [(c, c, ".1f") for c in cats])
    for r in rows:
        if "error" in r:
            lines.append(f"{r['variant']}@{r['seq_len']}: FAILED {r['error']}")
            continue
        lines += ["", f"The largest live groups at the peak of {r['variant']}@{r['seq_len']}:", ""]
        lines += markdown_table(
            r["top"], [("mib", "MiB", ".1f"), ("category", "category"), ("op", "op"), ("frame", "our frame")]
        )
    return lines
