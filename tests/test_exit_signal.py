"""--exit-signal-handler (what a Slurm job's time-limit warning triggers): one rank receives the signal, every rank
stops after the same iteration with a committed checkpoint and exit code 4, and the same command with --load
resumes exactly where a straight run would be. (Slurm's rank discovery: tests/test_launch_module.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import train_utils as tu


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_signal_on_one_rank_saves_stops_all_and_resumes_exactly(tmp_path):
    tu.prepare(tmp_path)
    ck = tmp_path / "ck"
    common = tu.train_args(tmp_path, "zero2_fp32.json", 6, *tu.DETERMINISTIC, global_batch=4)
    straight = tu.launch("deepspeed", common + ["--log-json", str(tmp_path / "a.jsonl")])
    assert straight.returncode == 0, straight.stdout[-3000:]
    rank = tu.NPROCS - 1  # not rank 0: the others must learn of it
    args = common + [
        "--log-json",
        str(tmp_path / "b.jsonl"),
        "--save",
        str(ck),
        "--load",
        str(ck),
        "--exit-signal-handler",
        "--exit-signal",
        "SIGUSR1",
    ]
    first = tu.launch("deepspeed", args, SPARSEBERT_FAULT_SIGNAL=f"{rank}:3:SIGUSR1")
    assert first.returncode == 4, first.stdout[-3000:]  # the launcher passes the ranks' code on
    assert "SIGUSR1 received: stopping at iteration 3; saved" in first.stdout
    assert (ck / "latest").read_text() == "iter_0000003" and (ck / "iter_0000003" / "commit.json").is_file()
    second = tu.launch("deepspeed", args)  # the requeued job: same command
    assert second.returncode == 0, second.stdout[-3000:]
    a, b = tu.train_records(tmp_path / "a.jsonl"), tu.train_records(tmp_path / "b.jsonl")
    assert [r["iteration"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # exact


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_exit_code_4_and_no_traceback_on_one_rank(tmp_path):
    """SIGTERM (Slurm's time limit, preemption, scancel) saves too when the configured warning signal is SIGUSR1."""
    tu.prepare(tmp_path)
    args = tu.train_args(
        tmp_path,
        "zero1_fp32.json",
        5,
        "--save",
        str(tmp_path / "ck"),
        "--exit-signal-handler",
        "--exit-signal",
        "SIGUSR1",
    )
    p = tu.launch("python", args, SPARSEBERT_FAULT_SIGNAL="0:2:SIGTERM")
    assert p.returncode == 4, p.stdout[-3000:]
    assert "SIGTERM received: stopping at iteration 2" in p.stdout and "Traceback" not in p.stdout
    assert (tmp_path / "ck" / "latest").read_text() == "iter_0000002"


COUNTING_ENTRY = """import sys
sys.path.insert(0, {repo!r})
from pretrain import distributed
real = distributed.ExitSignal.received_anywhere
checked = []
def counting(self, device):
    checked.append(1)
    return real(self, device)
distributed.ExitSignal.received_anywhere = counting
from pretrain.train import main
code = main(sys.argv[1:])
print(f"[count] signal checks: {{len(checked)}}", flush=True)
sys.exit(code)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "extra, checks",
    [([], 1), (["--exit-signal-interval", "2"], 3), (["--save-interval", "3"], 3)],
    ids=["log_interval", "every_2", "saves"],
)
def test_the_signal_check_is_not_a_sync_per_step(tmp_path, extra, checks):
    """8 iterations, log interval 4: the all-reduce that asks about the signal runs at iteration 4 only (the last
    iteration ends the run anyway), every 2 with --exit-signal-interval 2, and at every save (3 and 6, plus 4)."""
    tu.prepare(tmp_path)
    entry = tmp_path / "count_checks.py"
    entry.write_text(COUNTING_ENTRY.format(repo=str(tu.REPO)))
    args = tu.train_args(tmp_path, "zero1_fp32.json", 8, "--exit-signal-handler", "--log-interval", "4", *extra)
    if "--save-interval" in extra:
        args += ["--save", str(tmp_path / "ck")]
    p = subprocess.run(
        [sys.executable, str(entry)] + args, cwd=tu.REPO, env=tu.env(), capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert f"[count] signal checks: {checks}" in p.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_signal_stops_the_run_at_the_next_check(tmp_path):
    tu.prepare(tmp_path)
    args = tu.train_args(tmp_path, "zero1_fp32.json", 12, "--save", str(tmp_path / "ck"), "--exit-signal-handler")
    args += ["--log-interval", "4"]
    p = tu.launch("python", args, SPARSEBERT_FAULT_SIGNAL="0:5:SIGTERM")
    assert p.returncode == 4, p.stdout[-3000:]
    assert "SIGTERM received: stopping at iteration 8" in p.stdout
