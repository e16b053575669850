"""devtools/gpu_check on CPU, with fake commands and mocks where a GPU is needed: the --quick plan (a selection of the
one step table; pytest -m gpu selections; the harness command lines, checked against their contract by name, since
the check never imports benchmarks/), the budget (steps past it are skipped and named, a step reaching it is cut),
the process-group kill (a step's children die with it, also when gpu_check itself is stopped), the failure when
nvidia-smi sees GPUs that torch cannot use, the report (written whole; report.md and report.json only, the logs
under logs/), and `gpu_check.sh` without a GPU and with a failed set-up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from devtools.gpu_check import cli, environment, plan, runner, smoke
from devtools.gpu_check.context import Ctx
from devtools.gpu_check.pytest_steps import junit_counts
from devtools.gpu_check.report import write_report
from devtools.gpu_check.runner import Step, StepResult, run_step

REPO = Path(__file__).resolve().parents[1]
HARNESSES = {
    "benchmarks.step": {"time", "profile", "memory", "host"},
    "benchmarks.attention": {"time", "memory", "tiles", "masks", "flex-tiles"},
}
"""The benchmark harnesses' command lines (their contract): module -> its --measure values."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is dead too
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(") ")[-1].startswith("Z"))


def _ctx(tmp_path: Path, **kw) -> Ctx:
    return Ctx(tmp_path / "out", tmp_path / "work", **kw)


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_help_list_and_shell_syntax():
    r = subprocess.run(
        [sys.executable, "-m", "devtools.gpu_check", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "report.md" in r.stdout and "--quick" in r.stdout
    for script in ("gpu_check.sh", "gpu_window.sh"):
        assert subprocess.run(["bash", "-n", str(REPO / "run_scripts" / script)]).returncode == 0
    r = subprocess.run(
        ["bash", str(REPO / "run_scripts" / "gpu_check.sh"), "--bogus"], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 2 and "unknown option --bogus" in r.stderr


# ---------------------------------------------------------------------------------------------------- the plan
def test_quick_plan_is_a_selection_of_the_one_step_table(tmp_path):
    quick = plan.plan(_ctx(tmp_path, quick=True))
    full = plan.plan(_ctx(tmp_path, quick=False))
    names = [s.name for s in quick]
    assert names == [
        *("kernel_tests", "contract_tests", "data", "smoke", "kernel_table", "train_step", "profile"),
        *("multirank_tests", "smoke_zero3"),
    ]
    assert [s.name for s in full] == [s.name for s in plan.STEPS]  # the full check runs every row
    assert set(names) < {s.name for s in full}
    by, full_by = {s.name: s for s in quick}, {s.name: s for s in full}
    # the quick steps' limits fit 8 minutes with the set-up (~20 s from a wheelhouse); the profile, the resume tests
    # and smoke_zero3, last, run in the time left (the profile stops itself at its deadline with what it has)
    when_time_allows = ("profile", "multirank_tests", "smoke_zero3")
    assert sum(s.cap_s for s in quick if s.name not in when_time_allows) <= 460
    assert all(s.cap_s <= full_by[s.name].cap_s for s in quick)
    # the kernel tests: the -m gpu tests of the kernel files; --quick leaves out N=4096 and N=128, nothing else
    k, kf = by["kernel_tests"].commands[0], full_by["kernel_tests"].commands[0]
    assert k[k.index("-m", 3) + 1] == "gpu" == kf[kf.index("-m", 3) + 1]
    assert k[k.index("-k") + 1] == "not 4096 and not -128-" and "-k" not in kf
    files = ["test_cuda_kernels", "test_attention", "test_triton_block", "test_triton_block_memory", "test_varlen"]
    assert k[-6:] == kf[-6:] == [*(f"tests/{f}.py" for f in files), "tests/test_fused_norm.py"]
    # exact resume is test_train_resume.py's (on CUDA here), not re-proved by the smoke
    m = by["multirank_tests"].commands[0]
    assert m[-1] == "tests/test_train_resume.py" and m[m.index("-k") + 1] == "runs_succeed or bitwise"
    assert full_by["multirank_tests"].commands[0][-4:] == plan.MULTIRANK_TESTS
    # one GPU, no network: the training starts as plain python ranks (no deepspeed launcher, pdsh, ssh or mpirun)
    for s in quick:
        text = " ".join(" ".join(c) for c in s.commands)
        for word in ("deepspeed --", "bin/deepspeed", "pdsh", "ssh ", "mpirun", "srun", "pip ", "apt-get", "http"):
            assert word not in text, (s.name, word)
    smoke_cmds = [" ".join(c) for c in by["smoke"].commands]
    assert len(smoke_cmds) == 2 and all("-m pretrain.train" in c and "--load" not in c for c in smoke_cmds)
    assert "zero2_fp16.json" in smoke_cmds[0] and "zero2_bf16.json" in smoke_cmds[1]
    assert "zero3_fp16.json" in " ".join(by["smoke_zero3"].commands[0])
    table = by["kernel_table"].commands[0]
    assert table[table.index("--cases") + 1] == "blockbert_n2,blockbert_n3,fixed_b64,local_bi_b64@512,1024,4096,8192"
    ts = " ".join(by["train_step"].commands[0])
    assert "--cases dense@512 dense,blockbert-n2@4096" in ts and "--data-path" in ts


def test_no_step_runs_a_shell_script(tmp_path):
    """Every command is an argv list run without a shell: no `bash -c`, `sh -c` or `python -c` built in Python."""
    for quick in (True, False):
        for s in plan.plan(_ctx(tmp_path, quick=quick)):
            for cmd in s.commands:
                assert Path(cmd[0]).name not in ("bash", "sh") and "-c" not in cmd, (s.name, cmd)
                assert not any("\n" in word for word in cmd), (s.name, cmd)


def _started_modules(cmd: list[str]) -> list[str]:
    """The module of ``python -m MODULE ...`` (not pytest's own ``-m MARKERS``)."""
    return [cmd[2]] if len(cmd) > 2 and cmd[1] == "-m" else []


def _harness_args(module: str, argv: list[str]):
    """``argv`` read by the harness's own parser (flags, choices, --cases words; CUDA swapped for CPU here)."""
    from benchmarks.attention import cli as attention_cli
    from benchmarks.step.cli import build_parser

    argv = [a if a != "cuda" else "cpu" for a in argv]
    if module == "benchmarks.attention":
        return attention_cli.parse(argv)
    return build_parser(argv[argv.index("--measure") + 1]).parse_args(argv)


def test_the_steps_reference_existing_files_and_the_harness_contract(tmp_path):
    """Every ds_config, test file and module a step names exists (a typo would only show on the GPU node); the
    benchmarks are the harnesses' command lines, by name (the module and its --measure value), that the harness's
    parser accepts today."""
    seen = set()
    for quick in (True, False):
        for s in plan.plan(_ctx(tmp_path, quick=quick)):
            for cmd in s.commands:
                for word in cmd:
                    if word.startswith(("ds_configs/", "tests/", "run_scripts/")):
                        assert (REPO / word.split("::")[0]).exists(), (s.name, word)
                for mod in _started_modules(cmd):
                    if mod in HARNESSES:
                        measure = cmd[cmd.index("--measure") + 1]
                        assert measure in HARNESSES[mod], (s.name, mod, measure)
                        seen.add((mod, measure))
                        _harness_args(mod, cmd[3:])
                        assert "--preset" not in cmd  # the alias is gone: --model-preset
                    else:
                        assert mod.split(".")[0] != "benchmarks", (s.name, mod)
                        assert (
                            mod in ("pytest", "deepspeed.env_report")
                            or (REPO / (mod.replace(".", "/") + ".py")).is_file()
                        ), (s.name, mod)
    assert seen == {("benchmarks.attention", "time"), ("benchmarks.step", "time"), ("benchmarks.step", "profile")}


def _window_commands(tmp_path: Path, budget: int = 480) -> list[list[str]]:
    """run_scripts/gpu_window.sh's parts as it would run them (DRY_RUN=1 prints each command line, runs nothing)."""
    import shlex

    env = dict(os.environ, DRY_RUN="1", BUDGET=str(budget))
    p = subprocess.run(
        ["bash", "run_scripts/gpu_window.sh", str(tmp_path / "win")], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    return [shlex.split(line) for line in p.stdout.splitlines() if line and not line.startswith("[win]")]


def test_gpu_window_parts_are_harness_command_lines_with_flags_that_exist(tmp_path):
    """Each part of the window is one command line of a harness (or the quick check), in priority order, and the
    harness's own parser accepts it today (flags, choices, --cases sets; CUDA swapped for CPU here): a part that would
    die on a misspelt flag costs the whole window. The parts answer #47 (dense profile rows) and #48 (the kernel table
    under dropout 0.1, the step table with its ideal at N=4096, the long rows, memory)."""
    cmds = _window_commands(tmp_path)
    assert cmds[0][:4] == ["bash", "run_scripts/gpu_check.sh", "--quick", "--budget-s"]
    assert cmds[0][cmds[0].index("--only") + 1 :] == ["kernel_tests", "data"]
    seen = []
    for cmd in cmds[1:]:
        assert cmd[:2] == [".venv/bin/python", "-m"], cmd
        module, argv = cmd[2], cmd[3:]
        measure = argv[argv.index("--measure") + 1]
        assert measure in HARNESSES[module]
        args = _harness_args(module, argv)
        if module == "benchmarks.attention":
            lengths = tuple(sorted({n for _, n in args.cases}))
            seen.append((module, measure, f"dropout {args.dropout}", lengths, len(args.cases)))
        else:
            cases = args.cases if measure != "profile" else []
            seen.append((module, measure, tuple(sorted({n for _, n in cases})), args.kernel, len(cases)))
            if measure == "profile":
                assert args.seq_len == 512 and args.batch in (32, 128)
    assert seen == [
        ("benchmarks.step", "profile", (), "auto", 0),
        ("benchmarks.step", "profile", (), "auto", 0),
        ("benchmarks.attention", "time", "dropout 0.1", (4096, 8192), 8),  # n=2, n=3, window, Fixed
        ("benchmarks.step", "time", (4096,), "auto", 4),  # dense, n=2, n=3, window
        ("benchmarks.step", "time", (16384, 32768), "auto", 8),
        ("benchmarks.attention", "time", "dropout 0.1", (16384, 32768), 6),
        ("benchmarks.step", "memory", (4096,), "auto", 3),
        ("benchmarks.attention", "time", "dropout 0.0", (4096, 8192), 8),
    ]


def test_gpu_window_skips_a_part_past_its_budget_and_says_so(tmp_path):
    """The budget guard: with a budget smaller than a part's least useful time, the part is skipped and named (the
    window's bash functions run with a stub timeout; nothing is measured)."""
    script = (REPO / "run_scripts" / "gpu_window.sh").read_text()
    assert "GPU_CHECK_STEP_DEADLINE=" in script  # the profile's variants stop at the part's end
    env = dict(os.environ, BUDGET="30", PATH=f"{tmp_path}:{os.environ['PATH']}")
    for tool in ("nvidia-smi", "timeout"):  # no GPU here: stubs that say what they were asked
        (tmp_path / tool).write_text(f'#!/bin/sh\necho {tool} "$@"\n')
        (tmp_path / tool).chmod(0o755)
    p = subprocess.run(
        ["bash", "run_scripts/gpu_window.sh", str(tmp_path / "win")], cwd=REPO, env=env, capture_output=True, text=True
    )
    skipped = re.findall(r"\[win\] (\w+) skipped: (-?\d+) s left of the budget, it needs (\d+)", p.stdout)
    assert [name for name, _, _ in skipped] == [
        "gc",
        "dense_padded",
        "dense_unpadded",
        "kernels_p01",
        "steps_4096",
        "steps_long",
        "kernels_long",
        "memory",
        "kernels_p0",
    ], p.stdout + p.stderr
    assert all(int(left) < int(need) for _, left, need in skipped)
    assert (tmp_path / "win" / "all.tgz").is_file()


def test_only_keeps_the_data_step_its_steps_read(tmp_path):
    assert [s.name for s in plan.selected(True, ["train_step", "kernel_tests"])] == [
        "kernel_tests",
        "data",
        "train_step",
    ]
    assert [s.name for s in plan.selected(True, ["kernel_table"])] == ["kernel_table"]
    assert [s.name for s in plan.selected(False, ["ds_report"])] == ["ds_report"]
    assert plan.selected(True, ["ds_report"]) == []  # a full-check row


def test_pytest_markers_are_registered():
    """-m gpu selects only with the marker registered (pytest.ini), and each kernel file marks some tests gpu."""
    assert re.search(r"^\s+gpu: ", (REPO / "pytest.ini").read_text(), re.M)
    for f in [*plan.KERNEL_TESTS, *plan.CONTRACT_TESTS]:
        assert "pytest.mark.gpu" in (REPO / f).read_text(), f


def test_xdist_workers_share_the_gpu_only_for_tests_without_ranks_of_their_own(tmp_path, monkeypatch):
    """One worker per two CPUs (at most 8) on CUDA; the multi-rank tests start their own ranks: one session. With
    pytest-timeout's --session-timeout a test step stops itself 15 s before its limit."""
    from devtools.gpu_check import pytest_steps

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(pytest_steps, "pytest_plugins_available", lambda: {"session_timeout": True, "xdist": True})
    by = {s.name: s.commands[0] for s in plan.plan(_ctx(tmp_path, quick=True))}
    k = by["kernel_tests"]
    assert k[k.index("-n") + 1] == "8" and k[k.index("--session-timeout") + 1] == "110"
    assert "-n" not in by["multirank_tests"] and "-n" in by["contract_tests"]
    cpu = {s.name: s.commands[0] for s in plan.plan(_ctx(tmp_path, quick=True, device="cpu"))}
    assert "-n" not in cpu["kernel_tests"]


@pytest.mark.parametrize(
    "caps, precisions", [([(7, 0)], ["fp16"]), ([(8, 0)], ["fp16", "bf16"]), ([(9, 0), (7, 0)], ["fp16"])]
)
def test_bf16_is_gated_by_capability(monkeypatch, tmp_path, caps, precisions):
    """A V100 must pass the check: fp16 only in the smoke, fp16 benchmarks; bf16 on sm80+."""
    from tests import train_utils as tu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: caps[i])
    bf16 = cli.gpus_support_bf16()
    assert bf16 is (precisions == ["fp16", "bf16"])
    assert (tu.bf16_gpu_skip_reason() is None) is bf16
    ctx = _ctx(tmp_path, quick=True, bf16=bf16)
    assert ctx.precisions == precisions
    steps = {s.name: " ".join(" ".join(c) for c in s.commands) for s in plan.plan(ctx)}
    assert ("zero2_bf16.json" in steps["smoke"]) is bf16
    assert f"--dtype {'bf16' if bf16 else 'fp16'}" in steps["kernel_table"]
    assert f"--precisions {'bf16' if bf16 else 'fp16'}" in steps["train_step"]


def test_a_step_that_cannot_be_prepared_is_an_error_not_a_crash(tmp_path, monkeypatch):
    """E.g. DeepSpeed missing on a half-installed node: that step is an error in the report, the others still run."""

    def broken(ctx):
        raise ImportError("No module named 'deepspeed'")

    monkeypatch.setattr(plan, "STEPS", [plan.StepSpec("smoke", "x", True, broken), *plan.STEPS[:1]])
    steps = plan.plan(_ctx(tmp_path, quick=True))
    assert [s.name for s in steps] == ["smoke", "kernel_tests"]
    res = run_step(steps[0], tmp_path, time.monotonic() + 60)
    assert res.status == "error" and "No module named 'deepspeed'" in res.summary


# ---------------------------------------------------------------------------------- budget and process groups
def test_steps_run_within_their_limits_and_the_budget(tmp_path):
    deadline = time.monotonic() + 600
    ok = run_step(Step("ok", 30, [_py("print('fine')")]), tmp_path, deadline)
    bad = run_step(Step("bad", 30, [_py("import sys; print('broken'); sys.exit(3)")]), tmp_path, deadline)
    t0 = time.monotonic()
    slow = run_step(Step("slow", 2, [_py("import time; time.sleep(60)")], min_s=1), tmp_path, deadline)
    assert time.monotonic() - t0 < 20
    broken_check = run_step(Step("check", 30, [_py("pass")], check=lambda res, proc: 1 / 0), tmp_path, deadline)
    late = run_step(Step("late", 30, [_py("pass")]), tmp_path, time.monotonic() + 15)
    cut = run_step(
        Step("cut", 300, [_py("import time; time.sleep(60)")], min_s=1),
        tmp_path,
        time.monotonic() + runner.REPORT_RESERVE_S + 3,
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
    assert (tmp_path / "bad.log").read_text().startswith(f"$ {sys.executable} -c")  # each command heads its output


def test_a_steps_commands_run_in_order_and_stop_at_the_first_failure(tmp_path):
    """The limit covers all the step's commands together; the first that fails ends the step."""
    mark = tmp_path / "third-ran"
    step = Step("seq", 30, [_py("print('one')"), _py("print('two'); raise SystemExit(4)"), ["touch", str(mark)]])
    res = run_step(step, tmp_path, time.monotonic() + 600)
    assert res.status == "failed" and res.summary == "exit code 4" and not mark.exists()
    assert "one" in res.output_tail and "two" in res.output_tail
    t0 = time.monotonic()
    both = [_py("import time; time.sleep(1.5)"), _py("import time; time.sleep(60)")]
    res = run_step(Step("shared", 3, both, min_s=1), tmp_path, time.monotonic() + 600)
    assert res.status == "timeout" and time.monotonic() - t0 < 20


def test_steps_see_the_repository_and_keep_the_callers_pythonpath(tmp_path, monkeypatch):
    """Wheels carried to a node may sit on PYTHONPATH (e.g. /tmp/site): the steps keep it, after the repository."""
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    res = run_step(
        Step("env", 30, [_py("import os; print(os.environ['PYTHONPATH'])")]), tmp_path, time.monotonic() + 60
    )
    assert res.status == "passed" and res.output_tail.splitlines()[-1] == f"{REPO}{os.pathsep}/tmp/site"


def _child_pids_step(tmp_path: Path, name: str, seconds: int) -> tuple[Step, Path]:
    """A step whose process starts a child (and a grandchild) that ignore nothing and sleep; their pids go to a file."""
    pids = tmp_path / f"{name}.pids"
    script = f"sleep 300 & echo $! >> {pids}; bash -c 'sleep 300 & echo $! >> {pids}; wait' & sleep {seconds}"
    return Step(name, 3, [["bash", "-c", script]], min_s=1), pids


def test_a_timed_out_step_is_killed_with_all_its_children(tmp_path):
    step, pids = _child_pids_step(tmp_path, "hang", 300)
    t0 = time.monotonic()
    res = run_step(step, tmp_path, time.monotonic() + 600)
    assert res.status == "timeout" and time.monotonic() - t0 < 20
    children = [int(x) for x in pids.read_text().split()]
    assert len(children) == 2
    time.sleep(0.5)
    assert not [p for p in children if _alive(p)], "a timed-out step left processes running"


def test_a_finished_step_leaves_nothing_running(tmp_path):
    step, pids = _child_pids_step(tmp_path, "leaky", 1)
    res = run_step(step, tmp_path, time.monotonic() + 600)
    assert res.status == "passed"
    time.sleep(0.5)
    assert not [p for p in map(int, pids.read_text().split()) if _alive(p)]


MOCKED_MAIN = """
import sys, time, torch
from devtools.gpu_check import cli
from devtools.gpu_check.runner import Step
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
cli.gpus_support_bf16 = lambda: True
cli.environment_report = lambda: ("a mocked GPU", {{"gpus": [{{"name": "mock"}}]}}, [])
cli.plan = lambda ctx, only=None: {steps}
sys.exit(cli.main(sys.argv[1:]))
"""


def _mocked_main(tmp_path: Path, steps: str, *args: str) -> subprocess.Popen:
    script = tmp_path / "mocked_main.py"
    script.write_text(textwrap.dedent(MOCKED_MAIN.format(steps=steps)))
    return subprocess.Popen(
        [sys.executable, str(script), "--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "w"), *args],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_past_the_budget_later_steps_are_skipped_and_named(tmp_path):
    """Budget 25 s: the first step runs, the next needs 30 (min_s) and is skipped, like everything after it; the
    report names them and the exit status is 3 (incomplete, nothing failed)."""
    steps = """[
        Step("first", 60, [[sys.executable, "-c", "import time; time.sleep(2)"]], min_s=1),
        Step("second", 60, [[sys.executable, "-c", "pass"]], min_s=30),
        Step("third", 60, [[sys.executable, "-c", "pass"]], min_s=30),
    ]"""
    p = _mocked_main(tmp_path, steps, "--quick", "--budget-s", "25")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 3, out
    assert "not run, past the budget: second, third" in out
    assert re.search(r"\[gpu_check\] 1/3 first: passed in \d+ s \(\d+ s of 25 elapsed\)", out)
    md = (tmp_path / "out" / "report.md").read_text()
    assert (
        "| first | passed |" in md and "| second | skipped |" in md and "Not run, past the budget: second, third" in md
    )
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [s["status"] for s in rep["steps"]] == ["passed", "passed", "skipped", "skipped"]
    assert rep["meta"]["mode"] == "quick" and rep["meta"]["budget_s"] == 25


def test_main_exits_1_when_a_step_fails_and_reports_it(tmp_path):
    """The report directory holds report.md and report.json, the steps' full outputs under logs/."""
    steps = """[
        Step("fine", 30, [[sys.executable, "-c", "pass"]]),
        Step("boom", 30, [[sys.executable, "-c", "print('kaputt'); raise SystemExit(1)"]]),
    ]"""
    p = _mocked_main(tmp_path, steps)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 1 and "FAILED: boom" in out
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| fine | passed |" in md and "| boom | failed |" in md and "a mocked GPU" in md and "kaputt" in md
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["logs", "report.json", "report.md"]
    assert sorted(p.name for p in (tmp_path / "out" / "logs").iterdir()) == ["boom.log", "fine.log"]
    assert "kaputt" in (tmp_path / "out" / "logs" / "boom.log").read_text()


def test_stopping_gpu_check_kills_the_running_step_group_and_keeps_the_report(tmp_path):
    """The lead wraps the run in `timeout`: its SIGTERM reaches gpu_check, not the step's own session, so gpu_check
    must stop the step's group itself, and write the report saying so."""
    pids = tmp_path / "pids"
    steps = f"""[
        Step("fine", 30, [[sys.executable, "-c", "pass"]]),
        Step("hang", 300, [["bash", "-c", "sleep 300 & echo $! > {pids}; sleep 300"]]),
        Step("never", 30, [[sys.executable, "-c", "pass"]]),
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
        [sys.executable, "-m", "devtools.gpu_check", "--quick", "--out-dir", str(tmp_path / "o")],
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
    msg = environment.unusable_gpus_problem(
        smi, "2.11.0", torch_cuda, ["CUDA initialization: The NVIDIA driver is too old"]
    )
    assert expect in msg and f"driver {driver}" in msg and "driver is too old" in msg


def test_without_a_gpu_it_writes_a_report_naming_every_step_and_exits_0(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU mode (this machine has a GPU)")
    r = subprocess.run(
        [sys.executable, "-m", "devtools.gpu_check", "--quick", "--out-dir", str(tmp_path / "o")],
        cwd=REPO,
        env=dict(os.environ, PATH="/usr/bin:/bin"),  # no nvidia-smi
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "no CUDA GPU found" in r.stdout, r.stdout + r.stderr
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [s["name"] for s in rep["steps"][1:]] == [s.name for s in plan.STEPS if s.quick]
    assert {s["status"] for s in rep["steps"][1:]} == {"skipped"}
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["report.json", "report.md"]


def test_report_fields_and_the_commit_without_git(tmp_path, monkeypatch):
    """GPU, driver, CUDA, torch, DeepSpeed, date and commit; without git (a copied tree) the commit comes from
    GPU_CHECK_COMMIT, else from a COMMIT file, else it says unknown."""
    import common.provenance as provenance

    md, data, _ = environment.environment_report()
    for key in ("gpus", "driver", "cuda", "torch", "deepspeed", "date_utc", "commit", "commit_source"):
        assert key in data
    assert data["torch"] == torch.__version__ and data["commit_source"] == "git" and data["commit"]
    assert "DeepSpeed" in md and "commit" in md
    monkeypatch.setenv("GPU_CHECK_COMMIT", "cafe123")  # wins over git: a copied tree's .git may be stale
    assert environment.environment_report()[1]["commit"] == "cafe123"
    monkeypatch.setattr(provenance, "REPO", tmp_path)  # no .git here
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setenv("GPU_CHECK_COMMIT", "abc1234")
    assert provenance.commit_info() == ("abc1234", "GPU_CHECK_COMMIT")
    monkeypatch.delenv("GPU_CHECK_COMMIT")
    (tmp_path / "COMMIT").write_text("def5678\n")
    assert provenance.commit_info() == ("def5678", "COMMIT file")
    (tmp_path / "COMMIT").unlink()
    assert provenance.commit_info()[0] is None


def test_the_report_is_two_files_with_the_benchmark_tables(tmp_path):
    res = [StepResult("environment", "passed", summary="ok"), StepResult("kernel_table", "passed")]
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
    profile = StepResult("profile", "passed", details={"device": "H200", "preset": "bert-base"})
    profile.details["rows"] = [
        dict(
            variant="eager",
            case={"seq_len": 512, "batch": 32},
            kernel_used="dense",
            step_s=0.0502,
            tflops=183.0,
            mfu=0.185,
            busy_fraction=0.87,
            host_syncs_per_step=1,
            peak_memory_mib=8244.0,
        )
    ]
    failed = StepResult("smoke", "failed", summary="fp16: a | b", output_tail="x" * 5000 + "the end")
    write_report(tmp_path / "rep", [*res, profile, failed], "machine", {}, {"mode": "quick", "budget_s": 480.0})
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["report.json", "report.md"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| 512 | blockbert_n2 | flex | 0.583 | 1.00 | 2.00 | 0.50 | 10 | 20 | 0.50 |" in md and "flash" in md
    assert "| eager | 512 | 32 | dense | 50.2 | 183 | 18.5% | 87% | 1 | 8244 |" in md
    assert "| smoke | failed | 0 | fp16: a / b |" in md and "the end" in md and "x" * 2001 not in md
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert [s["name"] for s in rep["steps"]] == ["environment", "kernel_table", "profile", "smoke"]
    assert rep["steps"][3]["output_tail"].endswith("the end")


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
    c = junit_counts(xml)
    assert (c["passed"], c["failed"], c["skipped"]) == (1, 1, 1) and c["failures"][0].endswith("test_b")
    assert c["skip_reasons"] == {"r": 1}


def test_a_pytest_step_counts_its_tests_and_fails_on_a_failure(tmp_path):
    """The step's own command on a tiny test file: the JUnit counts make its summary; -m selects by marker. (Names
    that no directory of the run contains: ``-k`` matches the names of the parent directories too, and this test's
    tmp_path is named after it.)"""
    t = tmp_path / "test_y.py"
    t.write_text(
        "import pytest\n@pytest.mark.gpu\ndef test_alpha(): pass\n@pytest.mark.gpu\ndef test_beta(): assert 0\n"
        "def test_gamma(): pass\n"
    )
    from devtools.gpu_check.pytest_steps import pytest_step

    step = pytest_step("t", [str(t)], tmp_path, sys.executable, "cpu", 60, markers="gpu")
    res = run_step(step, tmp_path, time.monotonic() + 120)
    assert res.status == "failed" and res.summary.startswith("1 passed, 1 failed, 0 skipped; failed: test_beta")
    ok = pytest_step("t2", [str(t)], tmp_path, sys.executable, "cpu", 60, markers="gpu", select="test_alpha")
    res = run_step(ok, tmp_path, time.monotonic() + 120)
    assert res.status == "passed" and res.summary == "1 passed, 0 failed, 0 skipped"


# --------------------------------------------------------------------------------------------------- the smoke
def test_smoke_checks():
    good = [{"iteration": i, "loss": 8.0 - 3.0 * i / 200, "skipped_steps": min(i, 5)} for i in range(1, 201)]
    assert smoke.smoke_checks(good, "all fine", 200) == []
    flat = [dict(r, loss=7.0) for r in good]
    assert "did not fall" in smoke.smoke_checks(flat, "", 200)[0]
    late_skips = [dict(r, skipped_steps=(6 if r["iteration"] > 120 else 5)) for r in good]
    assert any("skipped steps" in p for p in smoke.smoke_checks(late_skips, "", 200))
    assert any("recompile" in p for p in smoke.smoke_checks(good, "torch._dynamo hit config.recompile_limit (8)", 200))
    assert any("stopped before" in p for p in smoke.smoke_checks(good[:150], "", 200))
    short = [{"iteration": i, "loss": 8.0 - i / 40, "skipped_steps": 2} for i in range(1, 41)]
    assert smoke.smoke_checks(short, "", 40, min_drop=0.3) == [] and smoke.smoke_checks(short, "", 40, min_drop=1.0)
    assert smoke.smoke_checks([], "", 40) == ["only 0 finite logged losses"]


def test_the_smoke_step_reads_each_precisions_log(tmp_path):
    """The smoke's check on logs as the trainer writes them (--log-json): one run per precision, each judged."""
    ctx = _ctx(tmp_path, quick=True)
    step = smoke.smoke_step(ctx, 2, "smoke", 60)
    step.prepare()
    falling = [{"iteration": i, "loss": 8.0 - i / 20, "skipped_steps": 1} for i in range(1, 41)]
    for prec, records in (("fp16", falling), ("bf16", falling[:10])):
        (ctx.work / "smoke" / f"zero2_{prec}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    res = StepResult("smoke")
    step.check(res, subprocess.CompletedProcess([], 0, "", ""))
    assert (
        res.status == "failed"
        and res.summary == "bf16: only 10 finite logged losses; bf16: the run stopped before iteration 40"
    )
    assert (
        res.details["precisions"]["fp16"]["problems"] == [] and res.details["precisions"]["fp16"]["loss_first"] == 7.95
    )
    (ctx.work / "smoke" / "zero2_bf16.jsonl").write_text("".join(json.dumps(r) + "\n" for r in falling))
    step.check(res, subprocess.CompletedProcess([], 0, "", ""))
    assert (
        res.status == "passed"
        and res.summary == "fp16: loss 7.95 -> 6.00, bf16: loss 7.95 -> 6.00 (ZeRO-2, 40 iterations)"
    )


def test_the_data_step_builds_the_shards_for_real(tmp_path):
    """The data step's commands (vocab, shards of the sample corpus) are real command lines; built once per work
    directory."""
    ctx = _ctx(tmp_path, quick=True, device="cpu", gpus=0)
    data = run_step(smoke.data_step(ctx, 120), ctx.logs, time.monotonic() + 300)
    assert data.status == "passed", data.summary + data.output_tail
    assert (ctx.data / "vocab.txt").is_file() and (ctx.data / "sample_text_sentence.bin").stat().st_size > 0
    assert smoke.data_step(ctx, 120).commands == []


def test_the_smoke_commands_are_trainer_command_lines():
    """Each smoke run parses as the trainer's own command line (the flags, the ds_config, the model), at the CUDA
    and the CPU sizes: a typo would only show on the GPU node."""
    from pretrain.args import parse_args

    for device, quick, iters in (("cuda", True, 40), ("cuda", False, 200), ("cpu", True, 6)):
        ctx = Ctx(Path("out"), Path("work"), quick=quick, device=device)
        for zero in (2, 3):
            for precision in ("fp16", "bf16"):
                cmd = smoke.smoke_command(ctx, zero, precision, Path("log.jsonl"))
                assert cmd[1:3] == ["-m", "pretrain.train"]
                cfg = parse_args(cmd[3:])
                assert cfg.loop.train_iters == iters and cfg.system.deepspeed_config.endswith(
                    f"zero{zero}_{precision}.json"
                )


@pytest.mark.extended
def test_the_smoke_step_trains_for_real_on_cpu(tmp_path):
    """The data step and the smoke's training run on CPU in bf16, as --rehearse-on-cpu runs them (~50 s under load):
    the check reads the log the trainer writes."""
    ctx = _ctx(tmp_path, quick=True, device="cpu", gpus=0, bf16=True, fp16=False)
    assert run_step(smoke.data_step(ctx, 300), ctx.logs, time.monotonic() + 900).status == "passed"
    res = run_step(smoke.smoke_step(ctx, 2, "smoke", 600), ctx.logs, time.monotonic() + 900)
    assert res.status == "passed", res.summary + res.output_tail
    v = res.details["precisions"]["bf16"]
    assert v["iterations"] == 6 and v["problems"] == [] and v["loss_first"] > 0
    assert res.command.count("-m pretrain.train") == 1 and (ctx.logs / "smoke.log").read_text().startswith("$ ")


# ------------------------------------------------------------------------------------------------- end to end
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU mode (this machine has a GPU)")
def test_gpu_check_sh_quick_end_to_end_without_a_gpu(tmp_path):
    """`gpu_check.sh --quick --budget-s 480 OUT` on this CPU machine: the set-up (a no-op once done), then the
    no-GPU report with every quick step named, exit 0; the set-up's log under OUT/logs/."""
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
    assert sorted(p.name for p in (tmp_path / "gc").iterdir()) == ["logs", "report.json", "report.md"]
    assert [p.name for p in (tmp_path / "gc" / "logs").iterdir()] == ["setup.log"]


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
    assert "hjson" in (tmp_path / "gc" / "logs" / "setup.log").read_text()


def test_committed_reports_keep_their_logs_out_of_git():
    """docs/gpu_reports/ holds reports and their JSON; logs and traces (OUT_DIR/logs/) are ignored there."""
    tracked = subprocess.run(
        ["git", "ls-files", "docs/gpu_reports"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert not [f for f in tracked if f.endswith((".log", ".gz")) or "/logs/" in f]
    probe = ["docs/gpu_reports/d/logs/steps.log", "docs/gpu_reports/d/console.log", "docs/gpu_reports/d/t.json.gz"]
    ignored = subprocess.run(["git", "check-ignore", *probe], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert ignored == probe
