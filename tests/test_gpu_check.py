"""tools/gpu_check.py's own logic on CPU: it parses, says "no CUDA GPU" and exits 0 without one, runs steps within
their budgets (a step that overruns is recorded as a timeout), always writes the report, reads pytest's JUnit XML,
judges a smoke run's log, and exits non-zero when a step failed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tools import gpu_check as gc

REPO = Path(__file__).resolve().parents[1]


def test_help_and_shell_syntax():
    r = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "report.md" in r.stdout
    assert subprocess.run(["bash", "-n", str(REPO / "run_scripts" / "gpu_check.sh")]).returncode == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message (this machine has a GPU)")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--out-dir", str(tmp_path / "o")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "no CUDA GPU found" in r.stdout
    assert not (tmp_path / "o").exists()  # nothing ran, nothing written


def test_steps_run_within_budgets_and_the_report_is_always_written(tmp_path):
    deadline = time.monotonic() + 600
    ok = gc.run_step(gc.Step("ok", 30, [sys.executable, "-c", "print('fine')"]), tmp_path, deadline)
    bad = gc.run_step(
        gc.Step("bad", 30, [sys.executable, "-c", "import sys; print('broken'); sys.exit(3)"]), tmp_path, deadline
    )
    t0 = time.monotonic()
    slow = gc.run_step(gc.Step("slow", 2, [sys.executable, "-c", "import time; time.sleep(60)"]), tmp_path, deadline)
    assert time.monotonic() - t0 < 30
    broken_check = gc.run_step(
        gc.Step("check", 30, [sys.executable, "-c", "pass"], check=lambda res, proc: 1 / 0), tmp_path, deadline
    )
    late = gc.run_step(gc.Step("late", 30, [sys.executable, "-c", "pass"]), tmp_path, time.monotonic() + 5)
    assert (ok.status, bad.status, slow.status, broken_check.status, late.status) == (
        "passed",
        "failed",
        "timeout",
        "error",
        "skipped",
    )
    assert "broken" in bad.output_tail and "exit code 3" in bad.summary and "ZeroDivisionError" in broken_check.summary
    gc.write_report(tmp_path / "rep", [ok, bad, slow], "test machine", {"gpus": []})
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| bad | failed |" in md and "| slow | timeout |" in md and "broken" in md
    assert [s["status"] for s in json.loads((tmp_path / "rep" / "report.json").read_text())["steps"]] == [
        "passed",
        "failed",
        "timeout",
    ]


def test_junit_counts_from_a_real_pytest_run(tmp_path):
    t = tmp_path / "test_x.py"
    t.write_text(
        "import pytest\ndef test_a(): pass\ndef test_b(): assert 0\n@pytest.mark.skip(reason='r')\ndef test_c(): pass\n"
    )
    xml = tmp_path / "r.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", str(t)],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    c = gc.junit_counts(xml)
    assert (c["passed"], c["failed"], c["skipped"]) == (1, 1, 1) and c["failures"][0].endswith("test_b")


def test_smoke_checks():
    good = [{"iteration": i, "loss": 8.0 - 3.0 * i / 200, "skipped_steps": min(i, 5)} for i in range(1, 201)]
    assert gc.smoke_checks(good, "all fine", 200) == []
    flat = [dict(r, loss=7.0) for r in good]
    assert "did not fall" in gc.smoke_checks(flat, "", 200)[0]
    late_skips = [dict(r, skipped_steps=(6 if r["iteration"] > 120 else 5)) for r in good]
    assert any("skipped steps" in p for p in gc.smoke_checks(late_skips, "", 200))
    assert any("recompile" in p for p in gc.smoke_checks(good, "torch._dynamo hit config.recompile_limit (8)", 200))
    assert any("stopped before" in p for p in gc.smoke_checks(good[:150], "", 200))


def test_main_exits_1_when_a_step_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(gc, "environment_report", lambda: ("fake GPU", {"gpus": []}, []))
    steps = [
        gc.Step("fine", 30, [sys.executable, "-c", "pass"]),
        gc.Step("boom", 30, [sys.executable, "-c", "raise SystemExit(1)"]),
    ]
    monkeypatch.setattr(gc, "plan", lambda out, gpus: steps)
    ds = Path(sys.executable).parent / "ds_report"
    if not ds.exists():
        pytest.skip("ds_report not installed next to this python")
    assert gc.main(["--out-dir", str(tmp_path)]) == 1
    md = (tmp_path / "report.md").read_text()
    assert "| fine | passed |" in md and "| boom | failed |" in md and "fake GPU" in md


CUDA_126 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CUDA_13 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


@pytest.mark.parametrize(
    "gpu, capability, arch_list, runs",
    [
        ("V100", (7, 0), CUDA_126, True),
        ("V100", (7, 0), CUDA_13, False),  # sm_75 SASS does not run on 7.0, compute_120 PTX needs 12.0
        ("V100", (7, 0), ["sm_75", "compute_70"], True),  # PTX of 7.0 is JIT-compiled
        ("T4", (7, 5), CUDA_13, True),
        ("A100", (8, 0), CUDA_13, True),
        ("A10", (8, 6), ["sm_80"], True),  # same major, lower minor SASS runs
        ("H100", (9, 0), CUDA_13, True),
        ("H100", (9, 0), ["sm_80", "sm_86"], False),
    ],
)
def test_environment_step_matches_the_gpu_to_the_builds_architectures(gpu, capability, arch_list, runs, monkeypatch):
    assert gc.arch_runs_on(capability, arch_list) is runs
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: arch_list)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: gpu)
    _, _, problems = gc.environment_report()
    assert (problems == []) is runs, problems


def test_smoke_resume_comparison_fails_on_any_loss_difference():
    straight = [8.0 - i / 100 for i in range(200)]
    assert gc.resume_comparison(straight, list(straight), 200) == (0.0, [])
    resumed = list(straight)
    resumed[150] += 1e-6
    worst, problems = gc.resume_comparison(straight, resumed, 200)
    assert worst == pytest.approx(1e-6) and "first at iteration 151" in problems[0]
    assert "incomplete (200 straight vs 120 resumed" in gc.resume_comparison(straight, straight[:120], 200)[1][0]


@pytest.mark.parametrize("caps, bf16", [([(7, 0)], False), ([(8, 0), (8, 0)], True), ([(9, 0), (7, 0)], False)])
def test_bf16_steps_are_gated_by_capability(monkeypatch, tmp_path, caps, bf16):
    """A healthy V100 must pass the check: bf16 benchmark steps are skipped below sm80 (the trainer refuses bf16
    there), and the bf16 training tests skip with the reason."""
    from tests import train_utils as tu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: caps[i])
    assert gc.gpus_support_bf16() is bf16
    assert (tu.bf16_gpu_skip_reason() is None) is bf16
    steps = {s.name: s for s in gc.plan(tmp_path, len(caps))}
    res = gc.run_step(steps["attention_bench_bf16"], tmp_path, time.monotonic() + 600)
    assert (res.status == "skipped") is not bf16
