"""One command that proves (or disproves) the GPU path: ``bash run_scripts/gpu_check.sh [OUT_DIR]``.

On a machine with CUDA GPUs it runs, each step as a subprocess with its own time budget inside a 25-minute total:

1. ``environment``: torch / CUDA / driver, ``torch.cuda.get_arch_list()``, every GPU's name and compute capability
   (fails when the GPU's architecture has no kernels in this torch build, e.g. a V100 with a CUDA 13 build), and
   DeepSpeed's ``ds_report``;
2. ``cuda_tests``: tests/test_cuda_kernels.py and the CUDA cases of tests/test_attention.py (fp16/bf16 against an
   fp32 reference at BERT-base shapes, padding, token masks, DIET biases, BlockBERT, ``auto``, no-grad, the number
   of compiled FlexAttention graphs);
3. ``multirank_tests``: the resume, fault, launch and signal tests, which start one rank per GPU (up to 2);
4. ``attention_bench_fp16`` / ``_bf16``: benchmarks/attention.py, N 512-4096, dense SDPA vs flex vs block_gather,
   against the target flex time <= 1.3 x density x dense SDPA time;
5. ``train_step_bench``: benchmarks/train_step_ds.py, bert-base through DeepSpeed ZeRO-1 in fp16 and bf16: tokens/s,
   MFU, peak memory, and the targets (dense bf16 MFU >= 45% on H100; BlockBERT n=2 step <= 0.78x and memory <=
   0.70x of dense at N=1024);
6. ``smoke``: the sample corpus -> vocab -> shards, a 200-step fp16 pretraining run (the loss must fall, no
   recompile warnings, no skipped steps after the loss scaler's start), then 100 steps + save + resume to 200 with
   ``--deterministic`` against a straight deterministic run (losses compared).

Writes ``report.md`` and ``report.json`` to the output directory (default out/gpu_check) whatever happens, and exits
1 when a step failed (or a measured target was missed), 0 otherwise. Without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
TOTAL_BUDGET_S = 25 * 60


@dataclass
class StepResult:
    """What one step did."""

    name: str
    status: str = "pending"
    """passed | failed | timeout | skipped | error"""
    seconds: float = 0.0
    command: str = ""
    summary: str = ""
    """One line for the report."""
    details: dict = field(default_factory=dict)
    """Parsed results (test counts, benchmark rows, targets)."""
    output_tail: str = ""


@dataclass
class Step:
    name: str
    budget_s: float
    command: list[str] | None = None
    """A subprocess to run (None: ``check`` does everything)."""
    check: Callable[[StepResult, subprocess.CompletedProcess | None], None] | None = None
    """Fills status/summary/details from the finished process (default: rc 0 -> passed)."""
    env: dict[str, str] = field(default_factory=dict)


NO_BF16 = "a GPU below compute capability 8.0 (e.g. a V100) has no bf16 hardware: fp16 only"


def gpus_support_bf16() -> bool:
    """Every visible GPU has bf16 hardware (compute capability 8.0+); the trainer refuses bf16 below that."""
    import torch

    return all(torch.cuda.get_device_capability(i)[0] >= 8 for i in range(torch.cuda.device_count()))


def _skipped(name: str, why: str) -> Step:
    def check(res: StepResult, proc) -> None:
        res.status, res.summary = "skipped", why

    return Step(name, 1, None, check)


def run_step(step: Step, out: Path, deadline: float) -> StepResult:
    """Run one step within min(its budget, the time left); never raises."""
    res = StepResult(step.name, command=shlex.join(step.command) if step.command else "")
    left = deadline - time.monotonic()
    if left < 30:
        res.status, res.summary = "skipped", "no time left in the 25-minute budget"
        return res
    budget = min(step.budget_s, left)
    t0 = time.monotonic()
    proc = None
    try:
        if step.command is not None:
            env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **step.env)
            log = out / f"{step.name}.log"
            with open(log, "w") as f:
                try:
                    p = subprocess.run(
                        step.command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=budget, text=True
                    )
                    proc = subprocess.CompletedProcess(p.args, p.returncode, log.read_text(errors="replace"), "")
                except subprocess.TimeoutExpired:
                    res.status = "timeout"
                    res.summary = f"stopped after its {budget:.0f} s budget"
            res.output_tail = log.read_text(errors="replace")[-3000:]
        if res.status != "timeout":
            if step.check is not None:
                step.check(res, proc)
            elif proc is not None:
                res.status = "passed" if proc.returncode == 0 else "failed"
                res.summary = res.summary or f"exit code {proc.returncode}"
    except Exception as e:  # a broken check must not lose the report
        res.status, res.summary = "error", f"{type(e).__name__}: {e}"
    res.seconds = round(time.monotonic() - t0, 1)
    return res


def junit_counts(path: Path) -> dict:
    """passed / failed / skipped counts and the failed test names from a pytest --junitxml file."""
    root = ET.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            counts["failures"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def _pytest_step(name: str, tests: list[str], out: Path, budget: float) -> Step:
    xml = out / f"{name}.xml"

    def check(res: StepResult, proc) -> None:
        if not xml.is_file():
            res.status, res.summary = "error", f"pytest wrote no {xml.name} (exit code {proc.returncode})"
            return
        c = junit_counts(xml)
        res.details = c
        res.status = "passed" if proc.returncode == 0 and c["failed"] == 0 else "failed"
        res.summary = f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"

    return Step(
        name,
        budget,
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *tests],
        check,
    )


def _attention_step(dtype: str, out: Path, budget: float) -> Step:
    d = out / f"attention_{dtype}"

    def check(res: StepResult, proc) -> None:
        f = d / "attention.json"
        if not f.is_file():
            res.status, res.summary = "failed", f"no attention.json (exit code {proc.returncode})"
            return
        rows = json.loads(f.read_text())["rows"]
        flex = [r for r in rows if r["kernel"] == "flex"]
        missed = [
            f"{r['layout']}@{r['n']}: {r['time_ratio']:.2f}x > {r['target']:.2f}x" for r in flex if not r["meets_time"]
        ]
        res.details = {"rows": rows, "flex_target_missed": missed}
        res.status = "passed" if proc.returncode == 0 and flex and not missed else "failed"
        res.summary = f"{len(flex) - len(missed)}/{len(flex)} flex rows within 1.3 x density x dense SDPA time" + (
            f"; missed: {', '.join(missed[:6])}" if missed else ""
        )

    return Step(
        f"attention_bench_{dtype}",
        budget,
        [
            sys.executable,
            "-m",
            "benchmarks.attention",
            "--device",
            "cuda",
            "--dtype",
            dtype,
            "--kernels",
            "flex",
            "block_gather",
            "--seq-lens",
            "512",
            "1024",
            "2048",
            "4096",
            "--target-factor",
            "1.3",
            "--repeats",
            "3",
            "--out-dir",
            str(d),
        ],
        check,
    )


def _train_step_step(out: Path, budget: float) -> Step:
    f = out / "train_step.json"

    def check(res: StepResult, proc) -> None:
        if not f.is_file():
            res.status, res.summary = "failed", f"no train_step.json (exit code {proc.returncode})"
            return
        data = json.loads(f.read_text())
        res.details = data
        missed = [t["target"] for t in data["targets"] if t["met"] is False]
        errors = [r for r in data["rows"] if "error" in r]
        res.status = "passed" if proc.returncode == 0 and not missed and not errors else "failed"
        res.summary = "; ".join(
            f"{t['target']}: {'n/a' if t['value'] is None else round(t['value'], 3)} "
            f"({'met' if t['met'] else 'not measured' if t['met'] is None else 'MISSED'})"
            for t in data["targets"]
        )

    return Step(
        "train_step_bench",
        budget,
        [sys.executable, "-m", "benchmarks.train_step_ds", "--preset", "bert-base", "--json", str(f)],
        check,
    )


def smoke_checks(records: list[dict], output: str, iters: int) -> list[str]:
    """Problems of a smoke run's log: the loss must fall by more than 1 nat (first vs last 10 logged), no
    recompile warnings, no skipped steps after step 50 and at most 16 before (the fp16 scaler's start)."""
    problems = []
    loss = [r["loss"] for r in records if "loss" in r and r["loss"] == r["loss"] and r["loss"] != float("inf")]
    if len(loss) < 20:
        problems.append(f"only {len(loss)} finite logged losses")
    elif not sum(loss[:10]) / 10 - sum(loss[-10:]) / 10 > 1.0:
        problems.append(f"the loss did not fall by 1 nat ({sum(loss[:10]) / 10:.3f} -> {sum(loss[-10:]) / 10:.3f})")
    for marker in ("recompile", "cache_size_limit", "recompile_limit"):
        if marker in output:
            problems.append(f"'{marker}' in the output")
            break
    skipped = {r["iteration"]: r.get("skipped_steps", 0) for r in records if "iteration" in r and "loss" in r}
    if skipped:
        last = skipped[max(skipped)]
        at50 = max((v for k, v in skipped.items() if k <= 50), default=0)
        if last > 16 or last > at50:
            problems.append(f"{last} skipped steps ({at50} by step 50)")
    if records and max((r.get("iteration", 0) for r in records), default=0) < iters:
        problems.append(f"the run stopped before iteration {iters}")
    return problems


def resume_comparison(straight: list[float], resumed: list[float], iters: int) -> tuple[float | None, list[str]]:
    """(largest |loss difference|, problems): a run stopped and resumed with --deterministic must log exactly the
    straight run's losses (docs/gpu_check.md), so any difference, or a missing loss, is a failure."""
    if not (len(straight) == len(resumed) == iters):
        return None, [f"resume comparison incomplete ({len(straight)} straight vs {len(resumed)} resumed losses)"]
    diffs = [abs(x - y) for x, y in zip(straight, resumed)]
    worst = max(diffs)
    if worst != 0.0:
        first = next(i for i, d in enumerate(diffs) if d != 0.0) + 1
        return worst, [
            f"the resumed run's losses differ from the straight run's (first at iteration {first}, largest "
            f"|difference| {worst:.3g}); with --deterministic they must be equal"
        ]
    return worst, []


def arch_runs_on(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a torch build with ``arch_list`` has kernels for a GPU of compute ``capability``.

    SASS ``sm_XY`` runs on the same major version with an equal or higher minor one only (``sm_75`` does not run on
    a 7.0 V100); PTX ``compute_XY`` is JIT-compiled for any GPU of capability XY or higher."""
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit() or len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _smoke_step(out: Path, budget: float, gpus: int) -> Step:
    d = out / "smoke"
    script = f"""
set -euo pipefail
cd {shlex.quote(str(REPO))}
D={shlex.quote(str(d))}
rm -rf "$D"; mkdir -p "$D"
PY={shlex.quote(sys.executable)}
$PY -m data_pipeline.train_tokenizer --input run_scripts/sample_data/corpus --output-dir "$D/tok" \\
    --model-type wordpiece --vocab-size 4000
$PY -m data_pipeline.preprocess --input run_scripts/sample_data/corpus --output-prefix "$D/data/sample" \\
    --tokenizer-type BertWordPieceLowerCase --vocab-file "$D/tok/vocab.txt" --split-sentences --workers 4 --no-progress
ARGS=(--deepspeed_config ds_configs/zero2_fp16.json --data-path "$D/data/sample_text_sentence"
  --vocab-file "$D/tok/vocab.txt" --model-preset tiny --hidden-size 256 --num-attention-heads 4
  --ffn-hidden-size 1024 --attention-dropout 0
  --sparsity-config '{{"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16}}'
  --seq-length 128 --max-position-embeddings 128 --micro-batch-size 16 --global-batch-size {16 * gpus}
  --lr 2e-3 --lr-warmup-fraction 0.1 --log-interval 1 --eval-interval 100 --eval-iters 5 --num-workers 2
  --max-predictions-per-seq 32)
DS="{REPO}/.venv/bin/deepspeed --num_gpus {gpus}"
$DS pretrain/train.py "${{ARGS[@]}}" --train-iters 200 --log-json "$D/smoke.jsonl" > "$D/smoke.out" 2>&1
$DS pretrain/train.py "${{ARGS[@]}}" --train-iters 200 --deterministic --log-json "$D/straight.jsonl" \\
    > "$D/straight.out" 2>&1
$DS pretrain/train.py "${{ARGS[@]}}" --train-iters 200 --deterministic --exit-interval 100 --save "$D/ck" \\
    --log-json "$D/resumed.jsonl" > "$D/first.out" 2>&1
$DS pretrain/train.py "${{ARGS[@]}}" --train-iters 200 --deterministic --save "$D/ck" --load "$D/ck" \\
    --log-json "$D/resumed.jsonl" > "$D/second.out" 2>&1
"""

    def check(res: StepResult, proc) -> None:
        def log(name):
            p = d / name
            return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.is_file() else []

        out_text = (d / "smoke.out").read_text(errors="replace") if (d / "smoke.out").is_file() else ""
        problems = [] if proc.returncode == 0 else [f"a command failed (exit code {proc.returncode})"]
        problems += smoke_checks(log("smoke.jsonl"), out_text, 200)
        a = [r["loss"] for r in log("straight.jsonl") if "loss" in r]
        b = [r["loss"] for r in log("resumed.jsonl") if "loss" in r]
        diff, resume_problems = resume_comparison(a, b, 200)
        problems += resume_problems
        res.details = {"problems": problems, "resume_max_abs_loss_diff": diff, "resume_bitwise": diff == 0.0}
        res.status = "failed" if problems else "passed"
        res.summary = (
            "; ".join(problems)
            if problems
            else (f"loss fell, no recompiles, resume with --deterministic: max |loss difference| {diff}")
        )

    return Step("smoke", budget, ["bash", "-c", script], check)


def environment_report() -> tuple[str, dict, list[str]]:
    """(markdown, data, problems) about torch, CUDA, the driver and the GPUs."""
    import torch

    data = {"torch": torch.__version__, "cuda": torch.version.cuda, "arch_list": torch.cuda.get_arch_list(), "gpus": []}
    problems = []
    try:
        data["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        data["driver"] = None
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
    gpus = "; ".join(f"{g['index']}: {g['name']} (sm {g['capability']})" for g in data["gpus"])
    md = (
        f"torch {data['torch']}, CUDA {data['cuda']}, driver {data['driver']}; arch list "
        f"{' '.join(data['arch_list'])}; GPUs: {gpus}"
    )
    return md, data, problems


def render(results: list[StepResult], env_md: str) -> str:
    lines = [
        "# GPU check report",
        "",
        f"Machine: {env_md}",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by run_scripts/gpu_check.sh.",
        "",
        "| step | status | seconds | result |",
        "|---|---|---:|---|",
    ]
    for r in results:
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.summary.replace('|', '/')} |")
    for r in results:
        if r.status not in ("passed", "skipped") and r.output_tail:
            lines += ["", f"## {r.name}: end of output", "", "```", r.output_tail[-2000:], "```"]
    return "\n".join(lines) + "\n"


def write_report(out: Path, results: list[StepResult], env_md: str, env_data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(
        json.dumps({"environment": env_data, "steps": [asdict(r) for r in results]}, indent=1, default=str)
    )
    (out / "report.md").write_text(render(results, env_md))


def plan(out: Path, gpus: int) -> list[Step]:
    return [
        _pytest_step(
            "cuda_tests",
            ["tests/test_cuda_kernels.py", "tests/test_attention.py::test_kernels_match_dense_on_cuda"],
            out,
            300,
        ),
        _pytest_step(
            "multirank_tests",
            ["tests/test_train_resume.py", "tests/test_faults.py", "tests/test_launch.py", "tests/test_exit_signal.py"],
            out,
            420,
        ),
        _attention_step("fp16", out, 180),
        _attention_step("bf16", out, 180) if gpus_support_bf16() else _skipped("attention_bench_bf16", NO_BF16),
        _train_step_step(out, 240),
        _smoke_step(out, 300, gpus),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.gpu_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out-dir", default=os.environ.get("GPU_CHECK_OUT", "out/gpu_check"))
    p.add_argument("--only", nargs="+", help="run only these steps (names as in the report)")
    p.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S, help="total time budget")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA GPU found: torch.cuda.is_available() is False on this machine (torch "
            f"{torch.__version__}); nothing to check here. Run it on a machine with one or more NVIDIA GPUs."
        )
        return 0
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    env_md, env_data, problems = environment_report()
    env_res = StepResult(
        "environment", status="failed" if problems else "passed", summary="; ".join(problems) or env_md
    )
    ds = subprocess.run([str(Path(sys.executable).parent / "ds_report")], capture_output=True, text=True, timeout=300)
    env_res.output_tail = ds.stdout[-3000:]
    env_data["ds_report"] = ds.stdout
    results = [env_res]
    steps = plan(out, torch.cuda.device_count())
    for step in steps:
        if args.only and step.name not in args.only:
            continue
        print(f"[gpu_check] {step.name} ...", flush=True)
        res = run_step(step, out, deadline)
        results.append(res)
        print(f"[gpu_check] {step.name}: {res.status} ({res.seconds:.0f} s) {res.summary}", flush=True)
        write_report(out, results, env_md, env_data)  # after every step: a crash keeps what was done
    write_report(out, results, env_md, env_data)
    print(f"[gpu_check] report: {out / 'report.md'}")
    return 0 if all(r.status in ("passed", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
