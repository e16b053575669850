"""--exit-signal-handler (what a Slurm job's time-limit warning triggers): one rank receives the signal, every rank
stops after the same iteration with a committed checkpoint and exit code 4, and the same command with --load
resumes exactly where a straight run would be. Which steps ask about the signal and where the run stops are
pretrain/decision.py's pure decision, proven without ranks in tests/test_loop.py; these are the real canaries (two
ranks; one rank counting the questions). (Slurm's rank discovery: tests/test_launch_module.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import train_utils as tu


@pytest.mark.extended  # ~55 s of 2-rank launches; the default tier's signal canary is the one-rank test below
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


@pytest.mark.timeout(300)
def test_one_rank_asks_at_logs_and_saves_only_and_a_sigterm_stops_it_at_the_next_ask(tmp_path):
    """The one-rank canary of what tests/test_loop.py proves of the decision, and of the loop with stand-ins: 8 steps,
    --log-interval 4, --save-interval 3, the handler configured for SIGUSR1. SIGTERM (Slurm's time limit, preemption,
    scancel) arrives at the start of step 5. The all-reduce that asks about the signal runs at 3 (a save) and 4 (a
    log) only, not every step, then at 6, a save: the run saves there and exits 4, without a traceback."""
    tu.prepare(tmp_path)
    entry = tmp_path / "count_checks.py"
    entry.write_text(COUNTING_ENTRY.format(repo=str(tu.REPO)))
    ck = tmp_path / "ck"
    args = tu.train_args(tmp_path, "zero1_fp32.json", 8, "--log-interval", "4", "--save", str(ck), "--save-interval")
    args += ["3", "--exit-signal-handler", "--exit-signal", "SIGUSR1"]
    p = subprocess.run(
        [sys.executable, str(entry)] + args,
        cwd=tu.REPO,
        env=tu.env(SPARSEBERT_FAULT_SIGNAL="0:5:SIGTERM"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 4, out[-3000:]
    assert "[count] signal checks: 3" in out, out[-3000:]
    assert "SIGTERM received: stopping at iteration 6; saved" in out and "Traceback" not in out
    assert (ck / "latest").read_text() == "iter_0000006" and (ck / "iter_0000003" / "commit.json").is_file()
