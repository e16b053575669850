"""The command line of the GPU check: parse -> prepare -> environment -> plan -> run the steps -> report."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.gpu_check.context import Ctx
from devtools.gpu_check.plan import STEPS, plan, selected
from devtools.gpu_check.report import write_report
from devtools.gpu_check.runner import StepResult, Stopped, run_step, stop_on_signals, stopped_by

FULL_BUDGET_S = 25 * 60
QUICK_BUDGET_S = 8 * 60
EXIT_INCOMPLETE = 3
"""Nothing failed, but steps were left out past the budget or stopped at its end."""


def main(argv: list[str] | None = None) -> int:
    """The command line; bad arguments are one line and exit 2 (common.error_exit.run_entry)."""
    from common.error_exit import run_entry

    return run_entry("devtools.gpu_check", _main, argv)


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
        prog="python -m devtools.gpu_check",
        description=sys.modules[__package__].__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out-dir", default=os.environ.get("GPU_CHECK_OUT", "out/gpu_check"))
    p.add_argument("--work-dir", help="scratch (shards, checkpoints, JUnit files); default: a new directory in $TMPDIR")
    p.add_argument("--quick", action="store_true", help="the quick selection: <= 8 minutes on one GPU")
    p.add_argument("--only", nargs="+", help="run only these steps (names as in the report; data when they need it)")
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
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    stop_on_signals()
    return _Run(args, out, work, budget, started, deadline)


def gpus_support_bf16() -> bool:
    """pretrain.ds_config.gpus_support_bf16, imported when asked: this module runs before torch may be installed."""
    from pretrain.ds_config import gpus_support_bf16 as support

    return support()


def environment_report() -> tuple[str, dict, list[str]]:
    """environment.environment_report, imported when asked (torch)."""
    from devtools.gpu_check.environment import environment_report as report

    return report()


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
        run.write()
        return 1
    env_res.summary = (
        f"no CUDA GPU found: torch.cuda.is_available() is False and nvidia-smi lists no GPU (torch "
        f"{torch.__version__}); nothing to check here. Run it on a machine with an NVIDIA GPU"
    )
    print(f"gpu_check: {env_res.summary}", flush=True)
    run.results += [
        StepResult(s.name, status="skipped", summary="no CUDA GPU") for s in selected(args.quick, args.only)
    ]
    run.write()
    print(f"[gpu_check] report: {out / 'report.md'}", flush=True)
    return 0


def _run_steps(run: _Run, ctx: Ctx) -> int:
    """Each step in turn, the report rewritten around each; a stop signal ends the loop (its exit code, else 0)."""
    steps = plan(ctx, run.args.only)
    for i, step in enumerate(steps, 1):
        running = StepResult(step.name, status="running", summary=f"started at {time.strftime('%H:%M:%S')}")
        run.write([running])
        print(f"[gpu_check] {i}/{len(steps)} {step.name} ... ({run.meta['elapsed_s']:.0f} s elapsed)", flush=True)
        try:
            res = run_step(step, ctx.logs, run.deadline)
        except Stopped as stop:
            run.results.append(stop.res)
            return 128 + int(signal.Signals[stopped_by()])
        except KeyboardInterrupt:
            run.results.append(StepResult(step.name, status="interrupted", summary="stopped between steps"))
            return 130
        run.results.append(res)
        run.write()
        print(
            f"[gpu_check] {i}/{len(steps)} {step.name}: {res.status} in {res.seconds:.0f} s "
            f"({run.meta['elapsed_s']:.0f} s of {run.budget:.0f} elapsed) {res.summary}",
            flush=True,
        )
    return 0


def _finish(run: _Run, code: int) -> int:
    """The final report, its summary on stdout, and the exit status (the package docstring)."""
    run.write()
    results, out = run.results, run.out
    past = [r.name for r in results if r.details.get("past_budget")]
    cut = [r.name for r in results if r.status == "cut"]
    bad = [r.name for r in results if r.status not in ("passed", "skipped", "cut")]
    if past:
        print(f"[gpu_check] not run, past the budget: {', '.join(past)}", flush=True)
    if cut:
        print(f"[gpu_check] stopped at the time limit before finishing: {', '.join(cut)}", flush=True)
    print(
        f"[gpu_check] report: {out / 'report.md'} ({run.meta['elapsed_s']:.0f} s; logs in {out / 'logs'})", flush=True
    )
    print((out / "report.md").read_text()[:6000], flush=True)  # also in the output, should the files be lost
    if code:
        return code
    if bad:
        print(f"[gpu_check] FAILED: {', '.join(bad)}", flush=True)
        return 1
    return EXIT_INCOMPLETE if past or cut else 0


def _main(argv: list[str]) -> int:
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
    return _finish(run, _run_steps(run, ctx))


def _cpu_fp16() -> bool:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False
