"""benchmarks/gpu_check.py on CPU, with mocks where a GPU is needed: the --quick plan, the budget (steps past
it are skipped and named, a step reaching it is cut), the process-group kill (a step's children die with it, also
when gpu_check itself is stopped), the failure when nvidia-smi sees GPUs that torch cannot use, the report's fields,
the smoke's two-phase resume run for real on CPU, and `gpu_check.sh --quick` end to end in its no-GPU mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check as gc

REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is dead too
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(") ")[-1].startswith("Z"))


def _ctx(tmp_path: Path, **kw) -> gc.Ctx:
    return gc.Ctx(tmp_path / "out", tmp_path / "work", **kw)


def test_help_list_and_shell_syntax():
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "report.md" in r.stdout and "--quick" in r.stdout
    assert subprocess.run(["bash", "-n", str(REPO / "run_scripts" / "gpu_check.sh")]).returncode == 0
    r = subprocess.run(
        ["bash", str(REPO / "run_scripts" / "gpu_check.sh"), "--bogus"], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 2 and "unknown option --bogus" in r.stderr


# ---------------------------------------------------------------------------------------------------- the plan
def test_quick_plan_is_a_selection_of_the_one_step_table(tmp_path):
    quick = gc.plan(_ctx(tmp_path, quick=True))
    full = gc.plan(_ctx(tmp_path, quick=False))
    names = [s.name for s in quick]
    assert names == ["kernel_tests", "contract_tests", "smoke", "kernel_table", "train_step", "profile", "smoke_zero3"]
    assert [s.name for s in full] == [s.name for s in gc.STEPS]  # the full check runs every row
    assert set(names) < {s.name for s in full}
    by = {s.name: s for s in quick}
    # the quick steps' limits fit 8 minutes with the set-up (~20 s from a wheelhouse); the profile and smoke_zero3,
    # last, run in the time left (the profile stops itself at its deadline with the variants it has; the contract
    # step counts with its limit, also where its file is missing)
    caps = {s.name: s.cap_s for s in quick} | {"contract_tests": 90}
    assert sum(v for k, v in caps.items() if k not in ("profile", "smoke_zero3")) <= 460
    assert all(s.cap_s <= f.cap_s for s, f in zip(quick, (x for x in full if x.name in names)))
    # the kernel tests: --quick leaves out N=4096 (test_cuda_kernels) and N=128 (test_attention), nothing else
    k = by["kernel_tests"].command
    assert (
        k[k.index("-k") + 1] == "not 4096 and not -128-"
        and "-k" not in {x.name: x for x in full}["kernel_tests"].command
    )
    # one GPU, no network: the training starts as plain python ranks (no deepspeed launcher, pdsh, ssh or mpirun)
    for s in quick:
        text = " ".join(s.command or [])
        for word in ("deepspeed --", "bin/deepspeed", "pdsh", "ssh ", "mpirun", "srun", "pip ", "apt-get", "http"):
            assert word not in text, (s.name, word)
    smoke = " ".join(by["smoke"].command)
    assert "-m pretrain.train" in smoke and "zero2_fp16.json" in smoke and "zero2_bf16.json" in smoke
    assert "zero3_fp16.json" in " ".join(by["smoke_zero3"].command)
    table = by["kernel_table"].command
    assert table[table.index("--seq-lens") + 1 : table.index("--repeats")] == ["512", "1024", "4096", "8192"]
    ts = " ".join(by["train_step"].command)
    assert "--cases dense@512 dense@4096 blockbert-n2@4096" in ts and "--data-path" in ts


def test_the_steps_reference_existing_files_and_configs(tmp_path):
    """Every ds_config, test file and module a step names exists (a typo would only show on the GPU node)."""
    for quick in (True, False):
        for s in gc.plan(_ctx(tmp_path, quick=quick)):
            text = " ".join(s.command or [])
            for word in text.replace("'", " ").replace('"', " ").split():
                if word.startswith(("ds_configs/", "tests/")):
                    assert (REPO / word.split("::")[0]).is_file(), (s.name, word)
            for i, word in enumerate(s.command or []):
                if word == "-m":
                    mod = s.command[i + 1]
                    assert (
                        mod in ("pytest", "deepspeed.env_report") or (REPO / (mod.replace(".", "/") + ".py")).is_file()
                    )


@pytest.mark.parametrize(
    "caps, precisions", [([(7, 0)], ["fp16"]), ([(8, 0)], ["fp16", "bf16"]), ([(9, 0), (7, 0)], ["fp16"])]
)
def test_bf16_is_gated_by_capability(monkeypatch, tmp_path, caps, precisions):
    """A V100 must pass the check: fp16 only in the smoke, fp16 benchmarks; bf16 on sm80+."""
    from tests import train_utils as tu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: caps[i])
    bf16 = gc.gpus_support_bf16()
    assert bf16 is (precisions == ["fp16", "bf16"])
    assert (tu.bf16_gpu_skip_reason() is None) is bf16
    ctx = _ctx(tmp_path, quick=True, bf16=bf16)
    assert ctx.precisions == precisions
    steps = {s.name: " ".join(s.command or []) for s in gc.plan(ctx)}
    assert ("zero2_bf16.json" in steps["smoke"]) is bf16
    assert f"--dtype {'bf16' if bf16 else 'fp16'}" in steps["kernel_table"]
    assert f"--precisions {'bf16' if bf16 else 'fp16'}" in steps["train_step"]


def test_a_step_that_cannot_be_prepared_is_an_error_not_a_crash(tmp_path, monkeypatch):
    """E.g. DeepSpeed missing on a half-installed node: that step is an error in the report, the others still run."""

    def broken(ctx):
        raise ImportError("No module named 'deepspeed'")

    monkeypatch.setattr(gc, "STEPS", [gc.StepSpec("smoke", "x", True, broken), *gc.STEPS[:1]])
    steps = gc.plan(_ctx(tmp_path, quick=True))
    assert [s.name for s in steps] == ["smoke", "kernel_tests"]
    res = gc.run_step(steps[0], tmp_path, time.monotonic() + 60)
    assert res.status == "error" and "No module named 'deepspeed'" in res.summary


def test_a_missing_contract_file_skips_that_step(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "CONTRACT_TESTS", "tests/test_no_such_file.py")
    step = {s.name: s for s in gc.plan(_ctx(tmp_path, quick=True))}["contract_tests"]
    res = gc.run_step(step, tmp_path, time.monotonic() + 60)
    assert res.status == "skipped" and "does not exist" in res.summary


# ---------------------------------------------------------------------------------- budget and process groups
def test_steps_run_within_their_limits_and_the_budget(tmp_path):
    deadline = time.monotonic() + 600
    ok = gc.run_step(gc.Step("ok", 30, [sys.executable, "-c", "print('fine')"]), tmp_path, deadline)
    bad = gc.run_step(
        gc.Step("bad", 30, [sys.executable, "-c", "import sys; print('broken'); sys.exit(3)"]), tmp_path, deadline
    )
    t0 = time.monotonic()
    slow = gc.run_step(
        gc.Step("slow", 2, [sys.executable, "-c", "import time; time.sleep(60)"], min_s=1), tmp_path, deadline
    )
    assert time.monotonic() - t0 < 30
    broken_check = gc.run_step(
        gc.Step("check", 30, [sys.executable, "-c", "pass"], check=lambda res, proc: 1 / 0), tmp_path, deadline
    )
    late = gc.run_step(gc.Step("late", 30, [sys.executable, "-c", "pass"]), tmp_path, time.monotonic() + 15)
    cut = gc.run_step(
        gc.Step("cut", 300, [sys.executable, "-c", "import time; time.sleep(60)"], min_s=1),
        tmp_path,
        time.monotonic() + gc.REPORT_RESERVE_S + 3,
    )
    assert (ok.status, bad.status, slow.status, broken_check.status, late.status, cut.status) == (
        "passed",
        "failed",
        "timeout",  # its own limit: a failure
        "error",
        "skipped",  # 15 s left, the step needs 20
        "cut",  # the budget ended while it ran: incomplete, not failed
    )
    assert late.details["past_budget"] and "past the budget" in late.summary
    assert "broken" in bad.output_tail and "exit code 3" in bad.summary and "ZeroDivisionError" in broken_check.summary
    assert "end of the budget" in cut.summary and "its 2 s limit" in slow.summary


def test_steps_see_the_repository_and_keep_the_callers_pythonpath(tmp_path, monkeypatch):
    """Wheels carried to a node may sit on PYTHONPATH (e.g. /tmp/site): the steps keep it, after the repository."""
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    res = gc.run_step(
        gc.Step("env", 30, [sys.executable, "-c", "import os; print(os.environ['PYTHONPATH'])"]),
        tmp_path,
        time.monotonic() + 600,
    )
    assert res.status == "passed" and res.output_tail.strip() == f"{REPO}{os.pathsep}/tmp/site"


def _child_pids_step(tmp_path: Path, name: str, seconds: int) -> tuple[gc.Step, Path]:
    """A step whose process starts a child (and a grandchild) that ignore nothing and sleep; their pids go to a file."""
    pids = tmp_path / f"{name}.pids"
    script = f"sleep 300 & echo $! >> {pids}; bash -c 'sleep 300 & echo $! >> {pids}; wait' & sleep {seconds}"
    return gc.Step(name, 3, ["bash", "-c", script], min_s=1), pids


def test_a_timed_out_step_is_killed_with_all_its_children(tmp_path):
    step, pids = _child_pids_step(tmp_path, "hang", 300)
    t0 = time.monotonic()
    res = gc.run_step(step, tmp_path, time.monotonic() + 600)
    assert res.status == "timeout" and time.monotonic() - t0 < 20
    children = [int(x) for x in pids.read_text().split()]
    assert len(children) == 2
    time.sleep(0.5)
    assert not [p for p in children if _alive(p)], "a timed-out step left processes running"


def test_a_finished_step_leaves_nothing_running(tmp_path):
    step, pids = _child_pids_step(tmp_path, "leaky", 1)
    res = gc.run_step(step, tmp_path, time.monotonic() + 600)
    assert res.status == "passed"
    time.sleep(0.5)
    assert not [p for p in map(int, pids.read_text().split()) if _alive(p)]


MOCKED_MAIN = """
import sys, time, torch
from benchmarks import gpu_check as gc
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
gc.gpus_support_bf16 = lambda: True
gc.environment_report = lambda: ("a mocked GPU", {{"gpus": [{{"name": "mock"}}]}}, [])
gc.plan = lambda ctx: {steps}
sys.exit(gc.main(sys.argv[1:]))
"""


def _mocked_main(tmp_path: Path, steps: str, *args: str, **popen) -> subprocess.Popen:
    script = tmp_path / "mocked_main.py"
    script.write_text(textwrap.dedent(MOCKED_MAIN.format(steps=steps)))
    return subprocess.Popen(
        [sys.executable, str(script), "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "w"), *args],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def test_past_the_budget_later_steps_are_skipped_and_named(tmp_path):
    """Budget 40 s: the first step takes 20, the next needs 30 (min_s) and is skipped, like everything after it; the
    report names them and the exit status is 3 (incomplete, nothing failed)."""
    steps = """[
        gc.Step("first", 60, [sys.executable, "-c", "import time; time.sleep(20)"]),
        gc.Step("second", 60, [sys.executable, "-c", "pass"], min_s=30),
        gc.Step("third", 60, [sys.executable, "-c", "pass"], min_s=30),
    ]"""
    p = _mocked_main(tmp_path, steps, "--quick", "--budget-s", "40")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 3, out
    assert "not run, past the budget: second, third" in out
    assert "[gpu_check] 1/3 first: passed in 20 s" in out  # each step's elapsed time is printed
    md = (tmp_path / "out" / "report.md").read_text()
    assert (
        "| first | passed |" in md and "| second | skipped |" in md and "Not run, past the budget: second, third" in md
    )
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [s["status"] for s in rep["steps"]] == ["passed", "passed", "skipped", "skipped"]
    assert rep["meta"]["mode"] == "quick" and rep["meta"]["budget_s"] == 40


def test_main_exits_1_when_a_step_fails_and_reports_it(tmp_path):
    steps = """[
        gc.Step("fine", 30, [sys.executable, "-c", "pass"]),
        gc.Step("boom", 30, [sys.executable, "-c", "print('kaputt'); raise SystemExit(1)"]),
    ]"""
    p = _mocked_main(tmp_path, steps)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 1 and "FAILED: boom" in out
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| fine | passed |" in md and "| boom | failed |" in md and "a mocked GPU" in md and "kaputt" in md
    assert "kaputt" in (tmp_path / "out" / "steps.log").read_text()


def test_stopping_gpu_check_kills_the_running_step_group_and_keeps_the_report(tmp_path):
    """The lead wraps the run in `timeout`: its SIGTERM reaches gpu_check, not the step's own session, so gpu_check
    must stop the step's group itself, and write the report saying so."""
    pids = tmp_path / "pids"
    steps = f"""[
        gc.Step("fine", 30, [sys.executable, "-c", "pass"]),
        gc.Step("hang", 300, ["bash", "-c", "sleep 300 & echo $! > {pids}; sleep 300"]),
        gc.Step("never", 30, [sys.executable, "-c", "pass"]),
    ]"""
    p = _mocked_main(tmp_path, steps)
    end = time.monotonic() + 60
    while not (pids.is_file() and pids.read_text().strip()) and time.monotonic() < end:
        time.sleep(0.2)
    child = int(pids.read_text())
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, out
    time.sleep(0.5)
    assert not _alive(child), "the step's child outlived gpu_check"
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(s["name"], s["status"]) for s in rep["steps"]][1:] == [("fine", "passed"), ("hang", "interrupted")]
    assert "SIGTERM" in rep["steps"][-1]["summary"]


# ------------------------------------------------------------------------------------------- GPUs and the report
def _fake_smi(bin_dir: Path, driver: str = "535.183.01") -> dict[str, str]:
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=compute_cap) echo 9.0;;\n"
        f"  --query-gpu=driver_version) echo {driver};;\n"
        f"  *) echo '0, NVIDIA H100 80GB HBM3, {driver}, 81559 MiB';;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch cannot use a GPU")
def test_gpus_that_torch_cannot_use_fail_the_check(tmp_path):
    """nvidia-smi lists an H100 but this torch (a CPU build here) cannot use it: a failure naming both, not 'no GPU'."""
    env = _fake_smi(tmp_path / "bin")
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--quick", "--out-dir", str(tmp_path / "o")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no CUDA GPU found" not in r.stdout
    assert "nvidia-smi sees 1 GPU(s) (NVIDIA H100 80GB HBM3, driver 535.183.01)" in r.stdout
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["steps"][0]["status"] == "failed" and "CPU-only build" in rep["steps"][0]["summary"]
    assert rep["environment"]["nvidia_smi_gpus"][0]["capability"] == "9.0"


@pytest.mark.parametrize(
    "torch_cuda, driver, expect",
    [
        ("13.0", "535.183.01", "built for CUDA 13.0, which needs a driver >= 580"),
        ("12.6", "470.256.02", "built for CUDA 12.6, which needs a driver >= 525.60.13"),
        ("13.0", "580.159.04", "torch.cuda.is_available() is False"),  # the driver is fine: something else
        (None, "580.159.04", "CPU-only build"),
    ],
)
def test_why_torch_cannot_use_the_gpus(torch_cuda, driver, expect):
    smi = [{"index": "0", "name": "NVIDIA H100 80GB HBM3", "driver": driver, "memory": "81559 MiB"}]
    msg = gc.unusable_gpus_problem(smi, "2.11.0", torch_cuda, ["CUDA initialization: The NVIDIA driver is too old"])
    assert expect in msg and f"driver {driver}" in msg and "driver is too old" in msg


def test_without_a_gpu_it_writes_a_report_naming_every_step_and_exits_0(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU mode (this machine has a GPU)")
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--quick", "--out-dir", str(tmp_path / "o")],
        cwd=REPO,
        env=dict(os.environ, PATH="/usr/bin:/bin"),  # no nvidia-smi
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "no CUDA GPU found" in r.stdout, r.stdout + r.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [s["name"] for s in rep["steps"][1:]] == [s.name for s in gc.STEPS if s.quick]
    assert {s["status"] for s in rep["steps"][1:]} == {"skipped"}


def test_report_fields_and_the_commit_without_git(tmp_path, monkeypatch):
    """GPU, driver, CUDA, torch, DeepSpeed, date and commit; without git (a copied tree) the commit comes from
    GPU_CHECK_COMMIT, else from a COMMIT file, else it says unknown."""
    md, data, _ = gc.environment_report()
    for key in ("gpus", "driver", "cuda", "torch", "deepspeed", "date_utc", "commit", "commit_source"):
        assert key in data
    assert data["torch"] == torch.__version__ and data["commit_source"] == "git" and data["commit"]
    assert "DeepSpeed" in md and "commit" in md
    monkeypatch.setenv("GPU_CHECK_COMMIT", "cafe123")  # wins over git: a copied tree's .git may be stale
    assert gc.commit_info() == ("cafe123", "GPU_CHECK_COMMIT")
    monkeypatch.delenv("GPU_CHECK_COMMIT")
    import common.provenance as provenance

    monkeypatch.setattr(provenance, "REPO", tmp_path)  # no .git here
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setenv("GPU_CHECK_COMMIT", "abc1234")
    assert gc.commit_info() == ("abc1234", "GPU_CHECK_COMMIT")
    monkeypatch.delenv("GPU_CHECK_COMMIT")
    (tmp_path / "COMMIT").write_text("def5678\n")
    assert gc.commit_info() == ("def5678", "COMMIT file")
    (tmp_path / "COMMIT").unlink()
    assert gc.commit_info()[0] is None
    # the report: few flat files, rewritten whole
    res = [gc.StepResult("environment", "passed", summary="ok"), gc.StepResult("kernel_table", "passed")]
    res[1].details = {
        "meta": {"dtype": "bf16", "batch": 1, "heads": 12, "head_dim": 64, "dense_backend": "flash"},
        "rows": [
            dict(
                n=512,
                layout="blockbert_n2",
                kernel="flex",
                density=0.583,
                time_best_s=1e-3,
                dense_time_best_s=2e-3,
                time_ratio=0.5,
                mem_mib=10.0,
                dense_mem_mib=20.0,
                mem_ratio=0.5,
            )
        ],
    }
    gc.write_report(tmp_path / "rep", res, "machine", data, {"mode": "quick", "budget_s": 480.0, "elapsed_s": 1.0})
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["report.json", "report.md"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| 512 | blockbert_n2 | flex | 0.583 | 1.00 | 2.00 | 0.50 | 10 | 20 | 0.50 |" in md and "flash" in md


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
    assert c["skip_reasons"] == {"r": 1}


# --------------------------------------------------------------------------------------------------- the smoke
def test_smoke_checks():
    good = [{"iteration": i, "loss": 8.0 - 3.0 * i / 200, "skipped_steps": min(i, 5)} for i in range(1, 201)]
    assert gc.smoke_checks(good, "all fine", 200) == []
    flat = [dict(r, loss=7.0) for r in good]
    assert "did not fall" in gc.smoke_checks(flat, "", 200)[0]
    late_skips = [dict(r, skipped_steps=(6 if r["iteration"] > 120 else 5)) for r in good]
    assert any("skipped steps" in p for p in gc.smoke_checks(late_skips, "", 200))
    assert any("recompile" in p for p in gc.smoke_checks(good, "torch._dynamo hit config.recompile_limit (8)", 200))
    assert any("stopped before" in p for p in gc.smoke_checks(good[:150], "", 200))
    short = [{"iteration": i, "loss": 8.0 - i / 40, "skipped_steps": 2} for i in range(1, 41)]
    assert gc.smoke_checks(short, "", 40, min_drop=0.3) == [] and gc.smoke_checks(short, "", 40, min_drop=1.0)


def test_smoke_resume_comparison_fails_on_any_loss_difference():
    straight = [8.0 - i / 100 for i in range(200)]
    assert gc.resume_comparison(straight, list(straight), 200) == (0.0, [])
    resumed = list(straight)
    resumed[150] += 1e-6
    worst, problems = gc.resume_comparison(straight, resumed, 200)
    assert worst == pytest.approx(1e-6) and "first at compared iteration 151" in problems[0]
    assert "incomplete (200 straight vs 120 resumed" in gc.resume_comparison(straight, straight[:120], 200)[1][0]


@pytest.mark.slow
def test_the_smoke_step_runs_its_two_phases_for_real_on_cpu(tmp_path):
    """The smoke's commands (data prep, a straight run saving halfway, a second process resuming from there) on CPU
    in bf16, as --rehearse-on-cpu runs them: the resumed losses equal the straight run's bit for bit."""
    ctx = _ctx(tmp_path, quick=True, device="cpu", gpus=0, bf16=True, fp16=False)
    step = gc.smoke_step(ctx, 2, "smoke", 800)
    res = gc.run_step(step, ctx.work, time.monotonic() + 900)
    assert res.status == "passed", res.summary + res.output_tail
    v = res.details["precisions"]["bf16"]
    assert v["resume_bitwise"] and v["resumed_from"] == 3 and v["iterations"] == 6
    # and a resumed run that does not match is caught: corrupt one logged loss of phase 2
    log = ctx.work / "smoke" / "zero2_bf16" / "resumed.jsonl"
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    rows[-1]["loss"] += 1e-7
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = gc.StepResult("smoke")
    step.check(again, subprocess.CompletedProcess([], 0, "", ""))
    assert again.status == "failed" and "differ from the straight run's" in again.summary


# ------------------------------------------------------------------------------------------------ benchmarks
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("module", ["benchmarks.attention", "benchmarks.train_step_ds"])
def test_benchmarks_refuse_device_cuda_cleanly_without_a_gpu(module, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--device",
            "cuda",
            "--out-dir" if "attention" in module else "--json",
            str(tmp_path / "x"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--device cuda: no CUDA GPU here" in r.stderr and "Traceback" not in r.stderr


def test_train_step_cases_and_comparisons():
    from benchmarks import train_step_ds as ts

    assert ts.parse_cases(["dense@512", "blockbert-n2@4096"]) == [("dense", 512), ("blockbert-n2", 4096)]
    with pytest.raises(ValueError, match="VARIANT@N"):
        ts.parse_cases(["dense4096"])
    rows = [
        {"variant": "dense", "precision": "bf16", "seq_len": 4096, "step_s": 0.4, "peak_memory_mib": 1000.0},
        {"variant": "blockbert-n2", "precision": "bf16", "seq_len": 4096, "step_s": 0.2, "peak_memory_mib": 600.0},
        {"variant": "dense", "precision": "bf16", "seq_len": 512, "step_s": 0.1, "peak_memory_mib": 100.0},
    ]
    assert ts.comparisons(rows) == [{"precision": "bf16", "seq_len": 4096, "step_ratio": 0.5, "memory_ratio": 0.6}]


# ------------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU mode (this machine has a GPU)")
def test_gpu_check_sh_quick_end_to_end_without_a_gpu(tmp_path):
    """`gpu_check.sh --quick --budget-s 480 OUT` on this CPU machine: the set-up (a no-op once done), then the
    no-GPU report with every quick step named, exit 0."""
    env = dict(
        os.environ,
        PATH="/usr/local/bin:/usr/bin:/bin",
        TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions")),
    )
    r = subprocess.run(
        ["bash", "run_scripts/gpu_check.sh", "--quick", "--budget-s", "480", str(tmp_path / "gc")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[gpu_check] set-up done in" in r.stdout and "no CUDA GPU found" in r.stdout
    rep = json.loads((tmp_path / "gc" / "report.json").read_text())
    assert rep["meta"]["mode"] == "quick" and rep["meta"]["budget_s"] == 480
    assert rep["meta"]["elapsed_s"] >= 0 and rep["environment"]["commit"]
    assert sorted(p.name for p in (tmp_path / "gc").iterdir()) == ["report.json", "report.md", "setup.log", "steps.log"]


def test_a_failed_set_up_still_leaves_a_report(tmp_path):
    """An offline node where the set-up cannot install what it needs: gpu_check.sh writes report.md saying so (with
    the end of the set-up's output) where the report would be, and exits 1."""
    root = tmp_path / "repo"
    (root / "run_scripts").mkdir(parents=True)
    (root / "run_scripts" / "gpu_check.sh").write_text((REPO / "run_scripts" / "gpu_check.sh").read_text())
    (root / "run_scripts" / "setup_env.sh").write_text(
        "echo 'ERROR: No matching distribution found for hjson'; exit 2\n"
    )
    r = subprocess.run(
        ["bash", str(root / "run_scripts" / "gpu_check.sh"), "--quick", str(tmp_path / "gc")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "the set-up failed (exit 2)" in r.stderr
    md = (tmp_path / "gc" / "report.md").read_text()
    assert "failed with exit code 2" in md and "No matching distribution found for hjson" in md
