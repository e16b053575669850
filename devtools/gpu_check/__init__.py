"""One command that proves (or disproves) the GPU path: ``bash run_scripts/gpu_check.sh [--quick] [OUT_DIR]``, which
runs ``python -m devtools.gpu_check`` after the set-up (docs/gpu_check.md).

It runs pytest selections and the benchmark harnesses as subprocesses under a time budget and writes the report.
One step table (plan.py) serves the full check and ``--quick`` (a selection and a smaller parameterisation of the
same steps, <= 8 minutes on one GPU from a bare node, set-up included). In order:

1. ``environment`` (in this process): GPU, driver, CUDA, torch, DeepSpeed, date, commit (environment.py);
2. ``kernel_tests``: ``pytest -m gpu`` over the kernel files: every kernel against dense on CUDA, fp16, and bf16 on
   sm80+ (--quick leaves out N=4096 and N=128);
3. ``contract_tests``: tests/test_cuda_contracts.py on real CUDA;
4. ``data``: the sample corpus -> vocab -> shards, for the steps that train or read batches;
5. ``smoke``: per precision (fp16 with loss scaling; bf16 on sm80+) a tiny BlockBERT trained under ZeRO-2;
6. ``kernel_table``: ``benchmarks.attention --measure time``: sparse kernels against dense SDPA, N=512..8192;
7. ``train_step``: ``benchmarks.step --measure time`` on the shards: bert-base MFU, BlockBERT n=2 vs dense;
8. ``profile``: ``benchmarks.step --measure profile``: where the bert-base N=512 step's time goes;
9. ``multirank_tests``: the resume, fault, launch and signal tests (--quick: exact resume only), when time allows;
10. ``smoke_zero3``: the smoke under ZeRO-3, when time allows;
11. ``ds_report`` (full check only): DeepSpeed's own report of its ops.

Every step runs in its own process group, stopped as a group at its time limit or when the check is stopped
(runner.py). ``--budget-s`` bounds the whole run, counted from ``--t0`` (gpu_check.sh passes its own start, so the
set-up counts): a step needing more than the time left is skipped and named. OUT_DIR gets ``report.md`` and
``report.json`` (report.py), rewritten when each step starts and ends, and ``logs/`` (each step's output, the
profile's chrome trace; never committed); scratch goes to --work-dir. Exit status: 0 all passed, 1 something
failed, 3 nothing failed but steps were left out past the budget; 128 + the signal when stopped. Without any GPU it
writes a report naming every step as skipped and exits 0.
"""

from devtools.gpu_check.cli import main

__all__ = ["main"]
