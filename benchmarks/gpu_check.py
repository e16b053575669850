"""One command that proves (or disproves) the GPU path: ``bash run_scripts/gpu_check.sh [--quick] [OUT_DIR]``.

One step table (:data:`STEPS`) serves the full check and ``--quick`` (a selection and a smaller parameterisation of
the same steps, <= 8 minutes on one GPU from a bare node, set-up included). In order:

1. ``environment`` (in this process): GPU, driver, CUDA, torch, DeepSpeed, date, commit. Fails when a GPU's
   architecture has no kernels in this torch build, and when ``nvidia-smi`` sees GPUs that torch cannot use (a
   driver too old for the build's CUDA, a CPU-only torch) instead of reporting "no GPU";
2. ``kernel_tests``: every kernel against dense on CUDA, fp16, and bf16 on sm80+ (tests/test_cuda_kernels.py and
   the CUDA cases of tests/test_attention.py; --quick leaves out N=4096 and N=128);
3. ``contract_tests``: tests/test_cuda_contracts.py on real CUDA (skipped, not failed, when the file is missing);
4. ``multirank_tests`` (full check only): the resume, fault, launch and signal tests, one rank per GPU up to 2;
5. ``smoke``: the sample corpus -> vocab -> shards, then per precision (fp16 with loss scaling; bf16 on sm80+) a
   tiny BlockBERT trained in two phases under ZeRO-2: a straight --deterministic run saving halfway, and a second
   process resuming from the halfway checkpoint, whose losses must equal the straight run's bit for bit;
6. ``kernel_table``: benchmarks/attention.py, BlockBERT n=2/n=3, Fixed and sliding window (flex, block_gather and
   triton_block)
   against dense SDPA (flash where available), N=512..8192: time and peak memory;
7. ``train_step``: benchmarks/train_step_ds.py on the smoke's shards (the trainer's own batches): bert-base MFU at
   N=512, BlockBERT n=2 vs dense at N=4096;
8. ``profile``: benchmarks/profile_step.py: the bert-base N=512 step under torch.profiler (top kernels, busy
   fraction, host syncs, peak memory), eager / compiled / batch / dropout / packed / ZeRO variants as time allows;
9. ``smoke_zero3``: the smoke under ZeRO-3 (last: it runs when time allows);
10. ``ds_report`` (full check only): DeepSpeed's own report of its ops.

Every step is a subprocess in its own process group (session), killed as a group at its time limit or when this
process is stopped (SIGTERM/SIGINT/SIGHUP), so no rank outlives it. ``--budget-s`` bounds the whole run, counted from
``--t0`` (gpu_check.sh passes its own start, so the set-up counts): a step needing more than the time left is skipped
and named. ``report.md`` and ``report.json`` (plus ``steps.log``, the steps' output) are rewritten when each step
starts and ends, so a crash keeps what was measured; the out directory holds only these few flat files (scratch
goes to --work-dir). Exit status: 0 all passed, 1 something failed, 3 nothing failed but steps were left out past
the budget. Without any GPU it writes a report naming every step as skipped and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from common.process import STEP_DEADLINE_ENV, kill_group
from common.provenance import commit_info

REPO = Path(__file__).resolve().parents[1]
FULL_BUDGET_S = 25 * 60
QUICK_BUDGET_S = 8 * 60
REPORT_RESERVE_S = 5.0
"""Seconds kept back at the end of the budget to stop a step and write the report."""
KILL_GRACE_S = 10.0
"""After SIGTERM to a step's process group, how long its processes get before SIGKILL."""
STEP_LOG_BYTES = 1 << 20
"""Each step's output kept in steps.log (its end)."""
CPU_REHEARSAL_SLOWDOWN = 4.0
"""--rehearse-on-cpu: the steps' time limits are this many times the GPU ones."""


# --------------------------------------------------------------------------------------------------- data types
@dataclass
class StepResult:
    """What one step did."""

    name: str
    status: str = "pending"
    """passed | failed | timeout | cut | skipped | error | interrupted | running"""
    seconds: float = 0.0
    command: str = ""
    summary: str = ""
    """One line for the report."""
    details: dict = field(default_factory=dict)
    """Parsed results (test counts, benchmark rows, targets)."""
    output_tail: str = ""


@dataclass
class Step:
    """A step ready to run."""

    name: str
    cap_s: float
    """Its own time limit (the budget may give it less)."""
    command: list[str] | None = None
    """A subprocess to run (None: ``check`` does everything, with proc None)."""
    check: Callable[[StepResult, subprocess.CompletedProcess | None], None] | None = None
    """Fills status/summary/details from the finished process (default: rc 0 -> passed)."""
    env: dict[str, str] = field(default_factory=dict)
    min_s: float = 20.0
    """Skipped when less than this is left of the budget (it could not do anything useful)."""


@dataclass
class Ctx:
    """What the step builders need to know about this run."""

    out: Path
    """Report directory (flat: report.md, report.json, steps.log)."""
    work: Path
    """Scratch directory (shards, checkpoints, JUnit files, step logs)."""
    quick: bool = False
    device: str = "cuda"
    """'cuda', or 'cpu' for --rehearse-on-cpu (the same commands at CPU sizes, to test the plumbing)."""
    gpus: int = 1
    bf16: bool = True
    """bf16 hardware (sm80+ on CUDA)."""
    fp16: bool = True
    """fp16 training possible (always on CUDA; on CPU only where DeepSpeed accepts it)."""
    python: str = sys.executable

    @property
    def precisions(self) -> list[str]:
        """Training precisions: fp16 with loss scaling everywhere it runs, bf16 where the hardware has it."""
        return [p for p, ok in (("fp16", self.fp16), ("bf16", self.bf16)) if ok]

    @property
    def low_precision(self) -> str:
        """The one precision of the benchmarks: bf16 where available, else fp16 (CPU rehearsal: bf16)."""
        return "bf16" if self.bf16 else "fp16"


@dataclass
class StepSpec:
    """One row of the step table: the full check runs every row, --quick the rows marked quick."""

    name: str
    what: str
    quick: bool
    build: Callable[[Ctx], Step]


# ---------------------------------------------------------------------------------------- process-group runner
_ACTIVE: dict[str, object] = {"pgid": None, "stopped_by": None}


def _on_signal(signum, frame) -> None:  # noqa: ARG001
    _ACTIVE["stopped_by"] = signal.Signals(signum).name
    pgid = _ACTIVE.get("pgid")
    if isinstance(pgid, int):
        kill_group(pgid, grace_s=3.0)
    raise KeyboardInterrupt(_ACTIVE["stopped_by"])


def run_in_group(cmd: list[str], log: Path, timeout: float, env: dict[str, str]) -> tuple[int | None, bool]:
    """Run ``cmd`` in a new session (its own process group), output to ``log``. Returns (exit code, timed out). On
    timeout the whole group is stopped; after a normal exit, anything the step left running in its group is too."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        _ACTIVE["pgid"] = p.pid
        try:
            try:
                rc = p.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                rc, timed_out = None, True
            kill_group(p.pid, grace_s=KILL_GRACE_S if timed_out else 1.0)
            if timed_out:
                p.wait()
        finally:
            _ACTIVE["pgid"] = None
    return rc, timed_out


def run_step(step: Step, work: Path, deadline: float) -> StepResult:
    """Run one step within min(its cap, the time left before ``deadline``); never raises (but for a stop signal)."""
    res = StepResult(step.name, command=shlex.join(step.command) if step.command else "")
    left = deadline - time.monotonic() - REPORT_RESERVE_S
    if left < step.min_s:
        res.status = "skipped"
        res.summary = f"past the budget: {max(left, 0):.0f} s left, the step needs at least {step.min_s:.0f} s"
        res.details = {"past_budget": True}
        return res
    limit = min(step.cap_s, left)
    cut_by_budget = limit < step.cap_s
    t0 = time.monotonic()
    try:
        if step.command is None:
            if step.check is not None:
                step.check(res, None)
        else:
            path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)  # keep the caller's
            env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **step.env}
            env[STEP_DEADLINE_ENV] = f"{time.time() + limit:.1f}"  # a step that can stop itself cleanly reads it
            work.mkdir(parents=True, exist_ok=True)
            log = work / f"{step.name}.log"
            rc, timed_out = run_in_group(step.command, log, limit, env)
            text = log.read_text(errors="replace")
            res.output_tail = text[-3000:]
            proc = subprocess.CompletedProcess(step.command, -9 if timed_out else rc, text, "")
            if not timed_out:
                if step.check is not None:
                    step.check(res, proc)
                else:
                    res.status = "passed" if rc == 0 else "failed"
                    res.summary = f"exit code {rc}"
            else:
                status = "cut" if cut_by_budget else "timeout"
                why = (
                    f"stopped at the end of the budget after {limit:.0f} s"
                    if cut_by_budget
                    else f"stopped after its {limit:.0f} s limit"
                )
                if step.check is not None:  # still parse what it left (partial rows, a JUnit file)
                    try:
                        step.check(res, proc)
                        why += f"; before that: {res.summary}"
                    except Exception:  # noqa: BLE001 - a partial result is optional
                        pass
                res.status, res.summary = status, why
    except KeyboardInterrupt:
        res.status, res.summary = "interrupted", f"stopped by {_ACTIVE.get('stopped_by') or 'an interrupt'}"
        res.seconds = round(time.monotonic() - t0, 1)
        raise _Stopped(res) from None
    except Exception as e:  # noqa: BLE001 - a broken check must not lose the report
        res.status, res.summary = "error", f"{type(e).__name__}: {e}"
    res.seconds = round(time.monotonic() - t0, 1)
    return res


class _Stopped(Exception):
    def __init__(self, res: StepResult):
        super().__init__(res.summary)
        self.res = res


# -------------------------------------------------------------------------------------------------- step helpers
def junit_counts(path: Path) -> dict:
    """passed / failed / skipped counts and the failed test names from a pytest --junitxml file."""
    root = ET.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skip_reasons": {}}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif (sk := case.find("skipped")) is not None:
            counts["skipped"] += 1
            why = (sk.get("message") or "").strip()[:160]
            counts["skip_reasons"][why] = counts["skip_reasons"].get(why, 0) + 1
        else:
            counts["passed"] += 1
    return counts


def pytest_plugins_available() -> dict[str, bool]:
    """Which optional pytest features this python has: pytest-timeout's --session-timeout, pytest-xdist."""
    have = {"session_timeout": False, "xdist": importlib.util.find_spec("xdist") is not None}
    spec = importlib.util.find_spec("pytest_timeout")
    if spec and spec.origin:
        have["session_timeout"] = "--session-timeout" in Path(spec.origin).read_text(errors="replace")
    return have


def pytest_step(name: str, tests: list[str], ctx: Ctx, cap_s: float, select: str | None = None) -> Step:
    """pytest over ``tests``; the JUnit file gives the counts. With pytest-timeout's --session-timeout the session
    stops itself before the step's limit, so the counts of what ran are kept; on CUDA with pytest-xdist, one worker
    per two CPUs (at most 8) shares the GPU: compiling FlexAttention's kernels is CPU-bound, and with 4 workers on
    a 16-CPU H200 node the contract tests did not finish in 55 s (docs/gpu_results.md)."""
    xml = ctx.work / f"{name}.xml"
    have = pytest_plugins_available()
    cmd = [ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE"]
    cmd += [f"--junitxml={xml}", "--timeout", str(int(min(600, cap_s)))]
    if have["session_timeout"]:
        cmd += ["--session-timeout", str(int(max(10, cap_s - 15)))]
    if have["xdist"] and ctx.device == "cuda" and (os.cpu_count() or 1) >= 8:
        cmd += ["-n", str(min(8, (os.cpu_count() or 1) // 2))]
    if select:
        cmd += ["-k", select]

    def check(res: StepResult, proc) -> None:
        if not xml.is_file():
            res.status, res.summary = "error", f"pytest wrote no {xml.name} (exit code {proc.returncode})"
            return
        c = junit_counts(xml)
        res.details = c
        stopped = "session-timeout" in (proc.stdout or "")
        res.status = "passed" if proc.returncode == 0 and c["failed"] == 0 else "failed"
        if stopped and c["failed"] == 0:
            res.status = "cut"
        res.summary = f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped" + (
            " (stopped at its time limit: the rest did not run)" if stopped else ""
        )
        if c["failures"]:
            res.summary += "; failed: " + ", ".join(f.split("::")[-1] for f in c["failures"][:8])

    return Step(name, cap_s, [*cmd, *tests], check)


def _skipped(name: str, why: str) -> Step:
    def check(res: StepResult, proc) -> None:
        res.status, res.summary = "skipped", why

    return Step(name, 0, None, check, min_s=0)


def _broken(name: str, why: str) -> Step:
    def check(res: StepResult, proc) -> None:
        res.status, res.summary = "error", why

    return Step(name, 0, None, check, min_s=0)


def gpus_support_bf16() -> bool:
    """pretrain.ds_config.gpus_support_bf16, imported when asked: this module runs before torch may be installed."""
    from pretrain.ds_config import gpus_support_bf16 as support

    return support()


# ---------------------------------------------------------------------------------------------- the data prep
def data_dir(ctx: Ctx) -> Path:
    return ctx.work / "data"


def ensure_data_script(ctx: Ctx) -> str:
    """Bash lines that build the sample corpus's vocab and shards once (the smoke and train_step both use them)."""
    d = shlex.quote(str(data_dir(ctx)))
    py = shlex.quote(ctx.python)
    workers = 2 if ctx.device == "cpu" else 4
    return f"""
if [ ! -f {d}/sample_text_sentence.idx ]; then
  echo "[data] vocab and shards of run_scripts/sample_data/corpus -> {d}"
  rm -rf {d}; mkdir -p {d}
  {py} -m data_pipeline.train_tokenizer --input run_scripts/sample_data/corpus --output-dir {d}/tok \\
      --model-type wordpiece --vocab-size 4000
  cp {d}/tok/vocab.txt {d}/vocab.txt
  {py} -m data_pipeline.preprocess --input run_scripts/sample_data/corpus --output-prefix {d}/sample \\
      --tokenizer-type BertWordPieceLowerCase --vocab-file {d}/vocab.txt --split-sentences --workers {workers} \\
      --no-progress
fi
"""


# ------------------------------------------------------------------------------------------------- the smoke
def smoke_model(ctx: Ctx) -> list[str]:
    """A tiny BlockBERT (n=2, heads 3:1, block 16, static MLM gather); smaller still for the CPU rehearsal."""
    hidden, ffn, seq = (64, 256, 64) if ctx.device == "cpu" else (256, 1024, 128)
    return [
        *("--model-preset", "tiny", "--hidden-size", str(hidden), "--num-attention-heads", "4"),
        *("--ffn-hidden-size", str(ffn), "--attention-dropout", "0", "--blockbert-blocks", "2", "--head-assignment"),
        "3:1",
        *("--seq-length", str(seq), "--max-position-embeddings", str(seq), "--max-predictions-per-seq", "16"),
    ]


def smoke_iters(ctx: Ctx) -> int:
    """Iterations of the straight run; it saves at half of them, where the second process resumes."""
    if ctx.device == "cpu":
        return 6
    return 40 if ctx.quick else 200


def smoke_checks(records: list[dict], output: str, iters: int, min_drop: float = 1.0) -> list[str]:
    """Problems of a smoke run's log: the loss must fall by more than ``min_drop`` nats (the means of the first and
    the last fifth of the logged losses, 10 at most), no recompile warnings, and the fp16 loss scaler's skipped steps
    only early: at most 16, none in the second half of the run."""
    problems = []
    loss = [r["loss"] for r in records if "loss" in r and r["loss"] == r["loss"] and r["loss"] != float("inf")]
    w = max(1, min(10, len(loss) // 5))
    if len(loss) < max(4, iters // 2):
        problems.append(f"only {len(loss)} finite logged losses")
    elif not sum(loss[:w]) / w - sum(loss[-w:]) / w > min_drop:
        problems.append(
            f"the loss did not fall by {min_drop:g} nat ({sum(loss[:w]) / w:.3f} -> {sum(loss[-w:]) / w:.3f})"
        )
    for marker in ("recompile", "cache_size_limit", "recompile_limit"):
        if marker in output:
            problems.append(f"'{marker}' in the output")
            break
    skipped = {r["iteration"]: r.get("skipped_steps", 0) for r in records if "iteration" in r and "loss" in r}
    if skipped:
        last = skipped[max(skipped)]
        half = max((v for k, v in skipped.items() if k <= iters // 2), default=0)
        if last > 16 or last > half:
            problems.append(f"{last} skipped steps ({half} by iteration {iters // 2})")
    if records and max((r.get("iteration", 0) for r in records), default=0) < iters:
        problems.append(f"the run stopped before iteration {iters}")
    return problems


def resume_comparison(straight: list[float], resumed: list[float], iters: int) -> tuple[float | None, list[str]]:
    """(largest |loss difference|, problems): the second phase, resumed from the checkpoint with --deterministic,
    must log exactly the straight run's losses, so any difference, or a missing loss, is a failure."""
    if not (len(straight) == len(resumed) == iters):
        return None, [f"resume comparison incomplete ({len(straight)} straight vs {len(resumed)} resumed losses)"]
    diffs = [abs(x - y) for x, y in zip(straight, resumed)]
    worst = max(diffs)
    if worst != 0.0:
        first = next(i for i, d in enumerate(diffs) if d != 0.0) + 1
        return worst, [
            f"the resumed run's losses differ from the straight run's (first at compared iteration {first}, largest "
            f"|difference| {worst:.3g}); with --deterministic they must be equal"
        ]
    return worst, []


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def smoke_step(ctx: Ctx, zero: int, name: str, cap_s: float) -> Step:
    """Per precision: a straight run of ``iters`` saving at iters/2, then a new process resuming from that checkpoint;
    one rank, started as plain ``python -m pretrain.train`` (no launcher, ssh or pdsh needed)."""
    from pretrain.checkpoint import tag_for

    iters = smoke_iters(ctx)
    half = iters // 2
    d = ctx.work / name
    data = data_dir(ctx)
    mb = 4 if ctx.device == "cpu" else 16
    lines = ["set -euo pipefail", f"cd {shlex.quote(str(REPO))}", ensure_data_script(ctx)]
    lines.append(f"rm -rf {shlex.quote(str(d))}; mkdir -p {shlex.quote(str(d))}")
    lines.append(
        'launch() { out="$1"; shift; echo "[smoke] $(date +%T) $out"; '
        'if ! "$@" > "$out" 2>&1; then echo "[smoke] FAILED: $out"; tail -n 60 "$out"; exit 1; fi; }'
    )
    for prec in ctx.precisions:
        c = d / f"zero{zero}_{prec}"
        base = [
            ctx.python,
            "-m",
            "pretrain.train",
            "--deepspeed_config",
            f"ds_configs/zero{zero}_{prec}.json",
            "--data-path",
            str(data / "sample_text_sentence"),
            "--vocab-file",
            str(data / "vocab.txt"),
            *smoke_model(ctx),
            "--micro-batch-size",
            str(mb),
            "--global-batch-size",
            str(mb),
            "--train-iters",
            str(iters),
            "--lr",
            "2e-3",
            "--lr-warmup-fraction",
            "0.1",
            "--log-interval",
            "1",
            "--eval-interval",
            "100000",
            "--eval-iters",
            "1",
            "--num-workers",
            "1",
            "--deterministic",
        ]
        straight = [
            *base,
            "--save",
            str(c / "ck"),
            "--save-interval",
            str(half),
            "--log-json",
            str(c / "straight.jsonl"),
        ]
        resumed = [*base, "--load", str(c / "ck"), "--log-json", str(c / "resumed.jsonl")]
        lines += [
            f"mkdir -p {shlex.quote(str(c))}",
            f"launch {shlex.quote(str(c / 'straight.out'))} {shlex.join(straight)}",
            f"printf %s {tag_for(half)} > {shlex.quote(str(c / 'ck' / 'latest'))}  # phase 2 resumes halfway",
            f"launch {shlex.quote(str(c / 'resumed.out'))} {shlex.join(resumed)}",
        ]
    min_drop = 1.0 if iters >= 200 else 0.3 if ctx.device == "cuda" else 0.0

    def check(res: StepResult, proc) -> None:
        problems = [] if proc.returncode == 0 else [f"a command failed (exit code {proc.returncode})"]
        per = {}
        for prec in ctx.precisions:
            c = d / f"zero{zero}_{prec}"
            out_text = "".join(
                (c / f).read_text(errors="replace") for f in ("straight.out", "resumed.out") if (c / f).is_file()
            )
            straight = _jsonl(c / "straight.jsonl")
            resumed = _jsonl(c / "resumed.jsonl")
            p = [f"{prec}: {x}" for x in smoke_checks(straight, out_text, iters, min_drop)]
            a = [r["loss"] for r in straight if "loss" in r and r.get("iteration", 0) > half]
            b = [r["loss"] for r in resumed if "loss" in r]
            first_resumed = min((r["iteration"] for r in resumed if "iteration" in r), default=None)
            if resumed and first_resumed != half + 1:
                p.append(f"{prec}: the second phase began at iteration {first_resumed}, not {half + 1}")
            diff, rp = resume_comparison(a, b, iters - half)
            p += [f"{prec}: {x}" for x in rp]
            losses = [r["loss"] for r in straight if "loss" in r]
            per[prec] = {
                "problems": p,
                "loss_first": losses[0] if losses else None,
                "loss_last": losses[-1] if losses else None,
                "skipped_steps": max((r.get("skipped_steps", 0) for r in straight), default=None),
                "resume_max_abs_loss_diff": diff,
                "resume_bitwise": diff == 0.0,
                "iterations": iters,
                "resumed_from": half,
            }
            problems += p
        res.details = {"zero_stage": zero, "precisions": per, "problems": problems}
        res.status = "failed" if problems else "passed"
        res.summary = (
            "; ".join(problems[:6])
            if problems
            else ", ".join(
                f"{prec}: loss {v['loss_first']:.2f} -> {v['loss_last']:.2f}, resumed at {half} bitwise equal"
                for prec, v in per.items()
            )
            + f" (ZeRO-{zero}, {iters} iterations)"
        )

    if not ctx.precisions:
        return _skipped(name, "no training precision runs here (fp16 refused by DeepSpeed on this CPU, no bf16)")
    return Step(name, cap_s, ["bash", "-c", "\n".join(lines)], check, min_s=45 if ctx.device == "cuda" else 20)


# ------------------------------------------------------------------------------------------- the benchmarks
KERNEL_TABLE_LAYOUTS = ["blockbert_n2", "blockbert_n3", "fixed_b64", "local_bi_b64"]


def kernel_table_step(ctx: Ctx, cap_s: float) -> Step:
    d = ctx.work / "kernel_table"
    if ctx.device == "cpu":
        seq, kernels, dtype, repeats = ["256", "512"], ["block_gather"], "fp32", "1"
    else:
        kernels = ["flex", "block_gather", "triton_block"]
        seq, dtype, repeats = ["512", "1024", "4096", "8192"], ctx.low_precision, "3"
    cmd = [ctx.python, "-m", "benchmarks.attention", "--device", ctx.device, "--dtype", dtype, "--layouts"]
    cmd += [*KERNEL_TABLE_LAYOUTS, "--kernels", *kernels, "--seq-lens", *seq, "--repeats", repeats]
    cmd += ["--target-factor", "1.3", "--out-dir", str(d), "--no-plot"]
    expected = len(seq) * len(KERNEL_TABLE_LAYOUTS) * len(kernels)

    def check(res: StepResult, proc) -> None:
        f = d / "attention.json"
        if not f.is_file():
            res.status, res.summary = "failed", f"no attention.json (exit code {proc.returncode})"
            return
        result = json.loads(f.read_text())
        rows = result["rows"]
        failed = result.get("failed", [])
        flex = [r for r in rows if r["kernel"] == "flex"]
        missed = [
            f"{r['layout']}@{r['n']}: {r['time_ratio']:.2f}x > {r['target']:.2f}x" for r in flex if not r["meets_time"]
        ]
        res.details = {"meta": result.get("meta", {}), "rows": rows, "failed": failed, "flex_target_missed": missed}
        ok = proc.returncode == 0 and len(rows) == expected and not failed
        # --quick measures; the full check also holds flex to its target (1.3 x density x dense SDPA time)
        res.status = "passed" if ok and (ctx.quick or not missed) else "failed"
        dense = result.get("meta", {}).get("dense_backend", "?")
        res.summary = (
            f"{len(rows)}/{expected} rows ({dtype}, dense SDPA backend: {dense})"
            + (f"; {len(failed)} failed: {', '.join(failed[:4])}" if failed else "")
            + (f"; flex over 1.3 x density x dense: {', '.join(missed[:4])}" if missed else "")
        )

    return Step("kernel_table", cap_s, cmd, check, min_s=30)


def train_step_step(ctx: Ctx, cap_s: float) -> Step:
    out = ctx.work / "train_step.json"
    if ctx.device == "cpu":
        sizes = ["--model-preset", "tiny", "--cases", "dense@128", "dense@256", "blockbert-n2@256", "--warmup", "1"]
        sizes += ["--steps", "1", "--device", "cpu"]
    elif ctx.quick:
        sizes = ["--model-preset", "bert-base", "--cases", "dense@512", "dense@4096", "blockbert-n2@4096"]
        sizes += ["--warmup", "3", "--steps", "8"]
    else:
        sizes = ["--model-preset", "bert-base", "--seq-lens", "512", "1024", "4096"]
    cmd = [ctx.python, "-m", "benchmarks.train_step_ds", *sizes, "--precisions", ctx.low_precision]
    cmd += ["--sample-mode", "full-sentences", "--json", str(out)]

    def check(res: StepResult, proc) -> None:
        data = _json_result(out, res, proc)
        if data is None:
            return
        missed = [t["target"] for t in data["targets"] if t["met"] is False]
        errors = [f"{r['variant']}@{r['seq_len']}: {r['error']}" for r in data["rows"] if "error" in r]
        ok = proc.returncode == 0 and not errors
        res.status = "passed" if ok and (ctx.quick or not missed) else "failed"
        parts = []
        for r in data["rows"]:
            if "error" in r:
                continue
            mfu = "" if r.get("mfu") is None else f", MFU {100 * r['mfu']:.1f}%"
            parts.append(f"{r['variant']}@{r['seq_len']} {r['step_s'] * 1e3:.0f} ms{mfu}")
        for c in data.get("comparisons", []):
            mem = "n/a" if c["memory_ratio"] is None else f"{c['memory_ratio']:.2f}x"
            parts.append(f"n=2/dense@{c['seq_len']}: step {c['step_ratio']:.2f}x, memory {mem}")
        parts += [f"target missed: {t}" for t in missed]
        res.summary = "; ".join(errors[:3] + parts)

    return Step("train_step", cap_s, _on_shards(ctx, cmd), check, min_s=45 if ctx.device == "cuda" else 20)


def _on_shards(ctx: Ctx, cmd: list[str]) -> list[str]:
    """A benchmark command run on the smoke's shards (made first when missing), as a bash command line."""
    data = data_dir(ctx)
    cmd = [*cmd, "--data-path", str(data / "sample_text_sentence"), "--vocab-file", str(data / "vocab.txt")]
    lines = ["set -euo pipefail", f"cd {shlex.quote(str(REPO))}", ensure_data_script(ctx), shlex.join(cmd)]
    return ["bash", "-c", "\n".join(lines)]


def _json_result(out: Path, res: StepResult, proc) -> dict | None:
    """A benchmark's JSON, kept as the step's details; None, with the step failed, when it wrote none."""
    if not out.is_file():
        res.status, res.summary = "failed", f"no {out.name} (exit code {proc.returncode})"
        return None
    res.details = json.loads(out.read_text())
    return res.details


PROFILE_TRACE = "profile_trace.json.gz"
"""The profile step's chrome trace (the first variant's profiled steps), in the report directory."""


def profile_step(ctx: Ctx, cap_s: float) -> Step:
    """benchmarks/profile_step.py on the smoke's shards: the variants in priority order until the step's deadline."""
    out = ctx.work / "profile_step.json"
    if ctx.device == "cpu":
        sizes = ["--model-preset", "tiny", "--seq-len", "64", "--batch", "2", "--warmup", "1", "--steps", "1"]
        sizes += ["--device", "cpu", "--vocab-size", "4000"]  # the smoke's vocabulary: a CPU-sized MLM head
        # inductor compiles the step for minutes on a loaded CPU: the rehearsal names the compiled variant left out
        sizes += ["--compile-estimate-s", "1000"]
    else:
        sizes = ["--model-preset", "bert-base", "--seq-len", "512", "--batch", "32", "--warmup", "3", "--steps", "2"]
        # --quick leaves the profile about 70 s (the 2026-11-26 H200 timings of the steps before it): eager takes
        # ~20 s, then the ds_config variants zero1_overlap and zero0_autocast (profile_step.VARIANTS' order);
        # compiled starts only when 40 s are left
        sizes += ["--compile-estimate-s", "40"]
    cmd = [ctx.python, "-m", "benchmarks.profile_step", *sizes, "--precision", ctx.low_precision]
    cmd += ["--sample-mode", "full-sentences", "--json", str(out), "--trace", str(ctx.out / PROFILE_TRACE)]

    def check(res: StepResult, proc) -> None:
        from benchmarks.profile_step import row_line

        data = _json_result(out, res, proc)
        if data is None:
            return
        errors = [r for r in data["rows"] if "error" in r]
        res.status = "passed" if proc.returncode == 0 and data["rows"] and not errors else "failed"
        parts = [row_line(r) for r in data["rows"]]
        if data.get("left_out"):
            parts.append(f"left out at the time limit: {', '.join(data['left_out'])}")
        res.summary = "; ".join(parts) or f"no variant measured (exit code {proc.returncode})"

    return Step("profile", cap_s, _on_shards(ctx, cmd), check, min_s=45 if ctx.device == "cuda" else 20)


def ds_report_step(ctx: Ctx, cap_s: float) -> Step:
    return Step("ds_report", cap_s, [ctx.python, "-m", "deepspeed.env_report"], None, min_s=15)


# ------------------------------------------------------------------------------------------------ step table
KERNEL_TESTS = ["tests/test_cuda_kernels.py", "tests/test_attention.py::test_kernels_match_dense_on_cuda"]
CONTRACT_TESTS = "tests/test_cuda_contracts.py"
MULTIRANK_TESTS = [
    "tests/test_train_resume.py",
    "tests/test_faults.py",
    "tests/test_launch.py",
    "tests/test_exit_signal.py",
]


def _kernel_tests(ctx: Ctx) -> Step:
    # --quick: N 512/1024 of test_cuda_kernels and the cut-block N=250 of test_attention (not 4096, not 128)
    select = "not 4096 and not -128-" if ctx.quick else None
    return pytest_step("kernel_tests", KERNEL_TESTS, ctx, 110 if ctx.quick else 420, select)


def _contract_tests(ctx: Ctx) -> Step:
    if not (REPO / CONTRACT_TESTS).is_file():
        return _skipped("contract_tests", f"{CONTRACT_TESTS} does not exist in this checkout: nothing to run")
    return pytest_step("contract_tests", [CONTRACT_TESTS], ctx, 90 if ctx.quick else 420)


def _multirank_tests(ctx: Ctx) -> Step:
    return pytest_step("multirank_tests", MULTIRANK_TESTS, ctx, 420)


STEPS: list[StepSpec] = [
    StepSpec("kernel_tests", "every kernel vs dense on CUDA: fp16, bf16 on sm80+", True, _kernel_tests),
    StepSpec("contract_tests", "tests/test_cuda_contracts.py on real CUDA", True, _contract_tests),
    StepSpec(
        "multirank_tests", "resume, fault, launch and signal tests, 1 rank per GPU up to 2", False, _multirank_tests
    ),
    StepSpec(
        "smoke",
        "two-phase training with exact resume, ZeRO-2, fp16 (+ bf16 on sm80+)",
        True,
        lambda c: smoke_step(c, 2, "smoke", 80 if c.quick else 420),
    ),
    StepSpec(
        "kernel_table",
        "BlockBERT n=2/n=3, Fixed, sliding window vs dense SDPA, N=512..8192",
        True,
        lambda c: kernel_table_step(c, 115 if c.quick else 300),
    ),
    StepSpec(
        "train_step",
        "bert-base MFU at N=512, BlockBERT n=2 vs dense at N=4096 (trainer's batches)",
        True,
        lambda c: train_step_step(c, 60 if c.quick else 360),
    ),
    StepSpec(
        "profile",
        "where the step's time goes: bert-base N=512 profiled, eager/compiled, batch, dropout, packed, ZeRO",
        True,
        lambda c: profile_step(c, 90 if c.quick else 300),
    ),
    StepSpec(
        "smoke_zero3",
        "the smoke under ZeRO-3 (when time allows)",
        True,
        lambda c: smoke_step(c, 3, "smoke_zero3", 90 if c.quick else 420),
    ),
    StepSpec("ds_report", "DeepSpeed's report of its ops", False, lambda c: ds_report_step(c, 120)),
]


def plan(ctx: Ctx) -> list[Step]:
    """The steps of this run, in order: every row of :data:`STEPS` for the full check, the quick rows for --quick."""
    steps = []
    for spec in STEPS:
        if spec.quick or not ctx.quick:
            try:
                steps.append(spec.build(ctx))
            except Exception as e:  # noqa: BLE001 - e.g. an import failing on a half-installed node: say it, go on
                steps.append(_broken(spec.name, f"could not prepare the step: {type(e).__name__}: {e}"))
    if ctx.device == "cpu":  # the rehearsal: the same commands, at CPU speed
        for s in steps:
            s.cap_s *= CPU_REHEARSAL_SLOWDOWN
    return steps


# ------------------------------------------------------------------------------------------------ environment
def arch_runs_on(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a torch build with ``arch_list`` has kernels for a GPU of compute ``capability``.

    SASS ``sm_XY`` runs on the same major version with an equal or higher minor one only (``sm_75`` does not run on
    a 7.0 V100); PTX ``compute_XY`` is JIT-compiled for any GPU of capability XY or higher."""
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        digits = digits.rstrip("af")  # sm_90a, sm_100f: architecture-specific variants of 9.0, 10.0
        if not digits.isdigit() or len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def torch_variant_module():
    """run_scripts/torch_variant.py (the one home of the driver table), loaded from its file."""
    spec = importlib.util.spec_from_file_location("torch_variant", REPO / "run_scripts" / "torch_variant.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nvidia_smi_gpus() -> list[dict] | None:
    """The GPUs nvidia-smi lists (name, driver, memory, compute capability), or None without a working nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            gpus.append({"index": parts[0], "name": parts[1], "driver": parts[2], "memory": parts[3]})
    caps = torch_variant_module().compute_capabilities()
    for g, cap in zip(gpus, caps or []):
        g["capability"] = f"{cap[0]}.{cap[1]}"
    return gpus


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment_report() -> tuple[str, dict, list[str]]:
    """(markdown, data, problems): torch, CUDA, the driver, the GPUs (as torch and nvidia-smi see them), package
    versions, date and commit. A problem fails the check: a GPU torch has no kernels for, or GPUs nvidia-smi sees
    that torch cannot use."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    commit, commit_from = commit_info()
    smi = nvidia_smi_gpus()
    data = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "commit": commit,
        "commit_source": commit_from,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if available else None,
        "driver": (smi[0]["driver"] if smi else None),
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "triton": _version("triton"),
        "arch_list": torch.cuda.get_arch_list() if available else [],
        "cuda_available": available,
        "nvidia_smi_gpus": smi,
        "gpus": [],
    }
    problems = []
    if available:
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            name = torch.cuda.get_device_name(i)
            data["gpus"].append({"index": i, "name": name, "capability": f"{major}.{minor}"})
            if not arch_runs_on((major, minor), data["arch_list"]):
                problems.append(
                    f"GPU {i} {name} (sm_{major}{minor}) has no kernels in this torch build "
                    f"({' '.join(data['arch_list'])}): re-run run_scripts/setup_env.sh "
                    "(docs/troubleshooting.md)"
                )
    elif smi:
        problems.append(
            unusable_gpus_problem(smi, torch.__version__, torch.version.cuda, [str(w.message) for w in caught])
        )
    gpus = "; ".join(f"{g['index']}: {g['name']} (sm {g['capability']})" for g in data["gpus"]) or (
        "none usable" if smi else "none"
    )
    md = (
        f"GPUs: {gpus}; driver {data['driver']}; torch {data['torch']} (CUDA {data['cuda']}, cuDNN {data['cudnn']}); "
        f"DeepSpeed {data['deepspeed']}; transformers {data['transformers']}; triton {data['triton']}; "
        f"python {data['python']}; {data['cpus']} CPUs; host {data['host']}; commit {commit} ({commit_from}); "
        f"{data['date_utc']} UTC"
    )
    return md, data, problems


def unusable_gpus_problem(smi: list[dict], torch_version: str, torch_cuda: str | None, warnings_seen: list[str]) -> str:
    """Why torch cannot use GPUs that nvidia-smi lists, and what to do (never 'no GPU')."""
    tv = torch_variant_module()
    driver = smi[0].get("driver") or "unknown"
    names = ", ".join(sorted({g["name"] for g in smi}))
    head = f"nvidia-smi sees {len(smi)} GPU(s) ({names}, driver {driver}) but torch {torch_version} cannot use them: "
    if torch_cuda is None:
        why = "this torch is a CPU-only build; install a CUDA build (run_scripts/setup_env.sh; TORCH=system reuses one)"
    else:
        major = int(torch_cuda.split(".")[0])
        need = tv.CUDA_DRIVER_MIN.get(major)
        if need and not tv.driver_runs_cuda(driver, major):
            why = (
                f"it is built for CUDA {torch_cuda}, which needs a driver >= {'.'.join(map(str, need))} (NVIDIA's CUDA "
                f"compatibility table); update the driver or install the build "
                f"`python3 run_scripts/torch_variant.py --explain` names (TORCH_VARIANT=cu126 for CUDA 12.6)"
            )
        else:
            why = "torch.cuda.is_available() is False (CUDA_VISIBLE_DEVICES={!r})".format(
                os.environ.get("CUDA_VISIBLE_DEVICES")
            )
    seen = [w for w in warnings_seen if w.strip()]
    return head + why + (f"; torch said: {seen[0][:300]}" if seen else "")


# ----------------------------------------------------------------------------------------------------- report
def _kernel_table_md(res: StepResult) -> list[str]:
    rows = res.details.get("rows") or []
    if not rows:
        return []
    meta = res.details.get("meta", {})
    out = [
        "",
        f"### Kernel table ({meta.get('dtype')}, batch {meta.get('batch')}, {meta.get('heads')} heads x "
        f"{meta.get('head_dim')}, fwd+bwd; dense = SDPA without a mask, backend {meta.get('dense_backend')})",
        "",
        "| N | layout | kernel | density | ms | dense ms | time ratio | MiB | dense MiB | memory ratio |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['n']} | {r['layout']} | {r['kernel']} | {r['density']:.3f} | {r['time_best_s'] * 1e3:.2f} | "
            f"{r['dense_time_best_s'] * 1e3:.2f} | {r['time_ratio']:.2f} | {r['mem_mib']:.0f} | "
            f"{r['dense_mem_mib']:.0f} | {r['mem_ratio']:.2f} |"
        )
    return out


def _train_step_md(res: StepResult) -> list[str]:
    rows = [r for r in res.details.get("rows") or [] if "error" not in r]
    if not rows:
        return []
    out = [
        "",
        f"### Training step ({res.details.get('device')}, {res.details.get('preset')}, ZeRO-1, "
        f"{rows[0].get('batches')} batches)",
        "",
        "| variant | precision | N | batch | kernel | step ms | tokens/s | TFLOP/s | MFU | peak MiB |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        mem = "n/a" if r.get("peak_memory_mib") is None else f"{r['peak_memory_mib']:.0f}"
        out.append(
            f"| {r['variant']} | {r['precision']} | {r['seq_len']} | {r['batch']} | {r['kernel_used']} | "
            f"{r['step_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} | {r['tflops']:.1f} | {mfu} | {mem} |"
        )
    return out


def render(results: list[StepResult], env_md: str, meta: dict) -> str:
    lines = [
        "# GPU check report",
        "",
        f"Machine: {env_md}",
        "",
        f"Mode: {meta.get('mode')}; budget {meta.get('budget_s'):.0f} s from the start of run_scripts/gpu_check.sh; "
        f"elapsed {meta.get('elapsed_s', 0):.0f} s. Written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.",
        "",
        "| step | status | seconds | result |",
        "|---|---|---:|---|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.summary.replace('|', '/')} |")
    past = [r.name for r in results if r.details.get("past_budget")]
    if past:
        lines += ["", f"Not run, past the budget: {', '.join(past)}."]
    for r in results:
        if r.name == "kernel_table":
            lines += _kernel_table_md(r)
        elif r.name == "train_step":
            lines += _train_step_md(r)
        elif r.name == "profile" and r.details.get("rows"):
            from benchmarks.profile_step import markdown

            lines += markdown(r.details)
    for r in results:
        if r.status not in ("passed", "skipped", "running") and r.output_tail:
            lines += ["", f"## {r.name}: end of output", "", "```", r.output_tail[-2000:], "```"]
    return "\n".join(lines) + "\n"


def write_report(out: Path, results: list[StepResult], env_md: str, env_data: dict, meta: dict | None = None) -> None:
    """report.md and report.json, replaced atomically (a reader never sees half a file)."""
    meta = meta or {"mode": "?", "budget_s": 0.0}
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "environment": env_data, "steps": [asdict(r) for r in results]}
    for name, text in (
        ("report.json", json.dumps(doc, indent=1, default=str)),
        ("report.md", render(results, env_md, meta)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def append_step_log(out: Path, work: Path, name: str) -> None:
    """The end of a step's output into OUT/steps.log (one flat file for all steps)."""
    log = work / f"{name}.log"
    if not log.is_file():
        return
    with open(log, "rb") as f:
        f.seek(max(0, log.stat().st_size - STEP_LOG_BYTES))
        tail = f.read()
    with open(out / "steps.log", "ab") as f:
        f.write(f"\n===== {name} ({log.stat().st_size} bytes of output, the last {len(tail)} here) =====\n".encode())
        f.write(tail)


# ------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    """The command line; bad arguments are one line and exit 2 (common.errors.run_entry)."""
    from common.errors import run_entry

    return run_entry("benchmarks.gpu_check", _main, argv)


@dataclass
class _Run:
    """What the stages of :func:`_main` pass on: the parsed arguments, the directories, the clock and the results."""

    args: argparse.Namespace
    out: Path
    work: Path
    budget: float
    started: float
    """Epoch seconds the budget counts from."""
    deadline: float
    """time.monotonic() at which the budget ends."""
    meta: dict = field(default_factory=dict)
    env_md: str = ""
    env_data: dict = field(default_factory=dict)
    results: list[StepResult] = field(default_factory=list)

    def write(self, extra: list[StepResult] = ()) -> None:
        self.meta["elapsed_s"] = time.time() - self.started
        write_report(self.out, [*self.results, *extra], self.env_md, self.env_data, self.meta)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out-dir", default=os.environ.get("GPU_CHECK_OUT", "out/gpu_check"))
    p.add_argument("--work-dir", help="scratch (shards, checkpoints, logs); default: a new directory under $TMPDIR")
    p.add_argument("--quick", action="store_true", help="the quick selection: <= 8 minutes on one GPU")
    p.add_argument("--only", nargs="+", help="run only these steps (names as in the report)")
    p.add_argument(
        "--budget-s",
        type=float,
        help=f"total time budget (default {QUICK_BUDGET_S} with --quick, else {FULL_BUDGET_S})",
    )
    p.add_argument("--t0", type=float, help="epoch seconds the budget counts from (gpu_check.sh passes its start)")
    p.add_argument(
        "--rehearse-on-cpu",
        action="store_true",
        help="developers: run the same steps on CPU at CPU sizes, to test the plumbing on a machine without a GPU",
    )
    p.add_argument("--list", action="store_true", help="print the step table (and which steps --quick runs) and exit")
    return p.parse_args(argv)


def _prepare(args: argparse.Namespace) -> _Run:
    """Check the arguments and directories, start the clock, install the stop-signal handlers."""
    from common.errors import UserError
    from common.outputs import check_dir_writable

    unknown = sorted(set(args.only or ()) - {s.name for s in STEPS})
    if unknown:  # else nothing runs and the check passes
        raise UserError(
            f"--only {' '.join(unknown)}: no such step; the steps are {', '.join(s.name for s in STEPS)} (--list)"
        )
    check_dir_writable(args.out_dir, "--out-dir")
    if args.work_dir:
        check_dir_writable(args.work_dir, "--work-dir")
    budget = args.budget_s or (QUICK_BUDGET_S if args.quick else FULL_BUDGET_S)
    started = args.t0 if args.t0 else time.time()
    deadline = time.monotonic() + budget - (time.time() - started)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "steps.log").write_text("")
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    return _Run(args, out, work, budget, started, deadline)


def _environment(run: _Run) -> Ctx | int:
    """The environment step; the context of the steps, or the exit code when there is nothing to run (no GPU: every
    step reported skipped; GPUs torch cannot use: failed)."""
    import torch

    args, out, work = run.args, run.out, run.work
    run.env_md, run.env_data, problems = environment_report()
    mode = ("quick" if args.quick else "full") + (" (CPU rehearsal)" if args.rehearse_on_cpu else "")
    run.meta = {"mode": mode, "budget_s": run.budget, "elapsed_s": time.time() - run.started, "work_dir": str(work)}
    print(
        f"[gpu_check] {mode}, budget {run.budget:.0f} s ({time.time() - run.started:.0f} s spent before this step)",
        flush=True,
    )
    print(f"[gpu_check] {run.env_md}", flush=True)
    env_res = StepResult("environment", status="failed" if problems else "passed", summary="; ".join(problems) or "ok")
    run.results = [env_res]
    if args.rehearse_on_cpu:
        return Ctx(out, work, quick=args.quick, device="cpu", gpus=0, bf16=True, fp16=_cpu_fp16())
    if torch.cuda.is_available():
        return Ctx(out, work, quick=args.quick, gpus=torch.cuda.device_count(), bf16=gpus_support_bf16())
    if problems:  # nvidia-smi sees GPUs that torch cannot use: that is a failure, not "no GPU"
        print(f"[gpu_check] FAILED: {problems[0]}", flush=True)
        write_report(out, run.results, run.env_md, run.env_data, run.meta)
        return 1
    env_res.summary = (
        f"no CUDA GPU found: torch.cuda.is_available() is False and nvidia-smi lists no GPU (torch "
        f"{torch.__version__}); nothing to check here. Run it on a machine with an NVIDIA GPU"
    )
    print(f"gpu_check: {env_res.summary}", flush=True)
    for s in STEPS:
        if (s.quick or not args.quick) and (not args.only or s.name in args.only):
            run.results.append(StepResult(s.name, status="skipped", summary="no CUDA GPU"))
    write_report(out, run.results, run.env_md, run.env_data, run.meta)
    print(f"[gpu_check] report: {out / 'report.md'}", flush=True)
    return 0


def _run_steps(run: _Run, steps: list[Step]) -> int:
    """Each step in turn, the report rewritten around each; a stop signal ends the loop (its exit code, else 0)."""
    for i, step in enumerate(steps, 1):
        running = StepResult(step.name, status="running", summary=f"started at {time.strftime('%H:%M:%S')}")
        run.write([running])
        print(f"[gpu_check] {i}/{len(steps)} {step.name} ... ({run.meta['elapsed_s']:.0f} s elapsed)", flush=True)
        try:
            res = run_step(step, run.work, run.deadline)
        except _Stopped as stop:
            run.results.append(stop.res)
            return 128 + int(signal.Signals[str(_ACTIVE.get("stopped_by") or "SIGTERM")])
        except KeyboardInterrupt:
            run.results.append(StepResult(step.name, status="interrupted", summary="stopped between steps"))
            return 130
        finally:
            append_step_log(run.out, run.work, step.name)
        run.results.append(res)
        run.write()
        print(
            f"[gpu_check] {i}/{len(steps)} {step.name}: {res.status} in {res.seconds:.0f} s "
            f"({run.meta['elapsed_s']:.0f} s of {run.budget:.0f} elapsed) {res.summary}",
            flush=True,
        )
    return 0


def _finish(run: _Run, code: int) -> int:
    """The final report, its summary on stdout, and the exit status (module docstring)."""
    run.write()
    results, out = run.results, run.out
    past = [r.name for r in results if r.details.get("past_budget")]
    cut = [r.name for r in results if r.status == "cut"]
    bad = [r.name for r in results if r.status not in ("passed", "skipped", "cut")]
    if past:
        print(f"[gpu_check] not run, past the budget: {', '.join(past)}", flush=True)
    if cut:
        print(f"[gpu_check] stopped at the time limit before finishing: {', '.join(cut)}", flush=True)
    print(f"[gpu_check] report: {out / 'report.md'} ({run.meta['elapsed_s']:.0f} s)", flush=True)
    print((out / "report.md").read_text()[:6000], flush=True)  # also in the output, should the files be lost
    if code:
        return code
    if bad:
        print(f"[gpu_check] FAILED: {', '.join(bad)}", flush=True)
        return 1
    return 3 if past or cut else 0


def _main(argv: list[str]) -> int:
    """parse -> prepare -> environment -> plan -> run the steps -> report."""
    args = _parse(argv)
    if args.list:
        for s in STEPS:
            print(f"{s.name:16s} {'quick+full' if s.quick else 'full      '} {s.what}")
        return 0
    run = _prepare(args)
    ctx = _environment(run)
    if isinstance(ctx, int):
        return ctx
    run.write()
    steps = [s for s in plan(ctx) if not args.only or s.name in args.only]
    return _finish(run, _run_steps(run, steps))


def _cpu_fp16() -> bool:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False


if __name__ == "__main__":
    sys.exit(main())
