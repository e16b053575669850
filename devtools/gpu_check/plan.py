"""The step table: one table for the full check and ``--quick`` (a selection of its rows, with smaller parameters).

The test steps are pytest selections: ``-m gpu`` (pytest.ini: the tests that run on CUDA when there is one) over the
kernel files, the CUDA-contract file whole, and the multi-rank files (``--quick``: the resume test's exact-resume
selection). The benchmark steps are the harnesses' command lines (benchmark_steps.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from devtools.gpu_check.benchmark_steps import ds_report_step, kernel_table_step, profile_step, train_step_step
from devtools.gpu_check.context import Ctx
from devtools.gpu_check.pytest_steps import pytest_step
from devtools.gpu_check.runner import Step, broken_step
from devtools.gpu_check.smoke import data_step, smoke_step

CPU_REHEARSAL_SLOWDOWN = 4.0
"""--rehearse-on-cpu: the steps' time limits are this many times the GPU ones."""
GPU_MARKER = "gpu"
"""pytest.ini's marker of the tests that run on a CUDA GPU when there is one."""
KERNEL_TESTS = [
    "tests/test_cuda_kernels.py",
    "tests/test_attention.py",
    "tests/test_triton_block.py",
    "tests/test_triton_block_memory.py",
    "tests/test_varlen.py",
    "tests/test_fused_norm.py",
]
QUICK_KERNEL_SELECTION = "not 4096 and not -128-"
"""--quick leaves out N=4096 (test_cuda_kernels) and N=128 (test_attention), nothing else."""
CONTRACT_TESTS = ["tests/test_cuda_contracts.py"]
MULTIRANK_TESTS = [
    "tests/test_train_resume.py",
    "tests/test_faults.py",
    "tests/test_launch.py",
    "tests/test_exit_signal.py",
]
QUICK_RESUME_SELECTION = "runs_succeed or bitwise"
"""--quick's multirank_tests: test_train_resume.py's straight vs stopped-and-resumed runs, bitwise equal."""


@dataclass
class StepSpec:
    """One row of the step table: the full check runs every row, --quick the rows marked quick."""

    name: str
    what: str
    quick: bool
    build: Callable[[Ctx], Step]
    needs_data: bool = False
    """Reads the ``data`` step's shards: ``data`` runs before it, also when --only leaves ``data`` out."""


def _tests(name: str, ctx: Ctx, tests: list[str], cap_s: float, markers: str | None = None, **kw) -> Step:
    return pytest_step(name, tests, ctx.work, ctx.python, ctx.device, cap_s, markers, **kw)


def _kernel_tests(ctx: Ctx) -> Step:
    select = QUICK_KERNEL_SELECTION if ctx.quick else None
    return _tests("kernel_tests", ctx, KERNEL_TESTS, 125 if ctx.quick else 420, GPU_MARKER, select=select)


def _multirank_tests(ctx: Ctx) -> Step:
    """The tests start their own ranks (DeepSpeed's launcher, one rank per GPU up to 2): one pytest session, no
    xdist workers sharing the GPU and the launcher's ports."""
    if ctx.quick:
        return _tests("multirank_tests", ctx, MULTIRANK_TESTS[:1], 90, select=QUICK_RESUME_SELECTION, parallel=False)
    return _tests("multirank_tests", ctx, MULTIRANK_TESTS, 420, parallel=False)


STEPS: list[StepSpec] = [
    StepSpec(
        "kernel_tests",
        "the -m gpu tests of the kernel files: every kernel vs dense on CUDA, fp16, bf16 on sm80+",
        True,
        _kernel_tests,
    ),
    StepSpec(
        "contract_tests",
        "tests/test_cuda_contracts.py on real CUDA",
        True,
        lambda c: _tests("contract_tests", c, CONTRACT_TESTS, 90 if c.quick else 420),
    ),
    StepSpec(
        "data", "the sample corpus -> vocab -> shards (once)", True, lambda c: data_step(c, 30 if c.quick else 120)
    ),
    StepSpec(
        "smoke",
        "a tiny BlockBERT trained under ZeRO-2, fp16 (+ bf16 on sm80+): the loss falls",
        True,
        lambda c: smoke_step(c, 2, "smoke", 45 if c.quick else 300),
        needs_data=True,
    ),
    StepSpec(
        "kernel_table",
        "BlockBERT n=2/n=3, Fixed, sliding window vs dense SDPA, N=512..8192",
        True,
        lambda c: kernel_table_step(c, 105 if c.quick else 300),
    ),
    StepSpec(
        "train_step",
        "bert-base MFU at N=512, BlockBERT n=2 vs dense at N=4096 (trainer's batches)",
        True,
        lambda c: train_step_step(c, 60 if c.quick else 360),
        needs_data=True,
    ),
    StepSpec(
        "profile",
        "where the step's time goes: bert-base N=512 profiled, eager/compiled, batch, dropout, packed, ZeRO",
        True,
        lambda c: profile_step(c, 90 if c.quick else 300),
        needs_data=True,
    ),
    StepSpec(
        "multirank_tests",
        "resume, fault, launch and signal tests, 1 rank per GPU up to 2 (--quick: exact resume only)",
        True,
        _multirank_tests,
    ),
    StepSpec(
        "smoke_zero3",
        "the smoke under ZeRO-3 (when time allows)",
        True,
        lambda c: smoke_step(c, 3, "smoke_zero3", 60 if c.quick else 300),
        needs_data=True,
    ),
    StepSpec("ds_report", "DeepSpeed's report of its ops", False, lambda c: ds_report_step(c, 120)),
]


def selected(quick: bool, only: list[str] | None = None) -> list[StepSpec]:
    """The rows of this run, in order: the quick rows for --quick, every row otherwise; --only narrows them, keeping
    ``data`` when a row it keeps reads the shards."""
    rows = [s for s in STEPS if s.quick or not quick]
    if only:
        need_data = any(s.needs_data for s in rows if s.name in only)
        rows = [s for s in rows if s.name in only or (s.name == "data" and need_data)]
    return rows


def plan(ctx: Ctx, only: list[str] | None = None) -> list[Step]:
    """The steps of this run, built (a row that cannot be built is an error step; the others still run)."""
    steps = []
    for spec in selected(ctx.quick, only):
        try:
            steps.append(spec.build(ctx))
        except Exception as e:  # noqa: BLE001 - e.g. an import failing on a half-installed node: say it, go on
            steps.append(broken_step(spec.name, f"could not prepare the step: {type(e).__name__}: {e}"))
    if ctx.device == "cpu":  # the rehearsal: the same commands, at CPU speed
        for s in steps:
            s.cap_s *= CPU_REHEARSAL_SLOWDOWN
    return steps
