"""Faults on two CPU ranks: fp16 overflow skipped together without advancing the LR, a non-finite bf16 loss
stopping every rank with the step named, a kill during a save resuming from the previous complete checkpoint,
and a dead rank ending the job non-zero within a bounded time. Faults are injected through the trainer's fault hook
(pretrain/faults.py), which the test-only SPARSEBERT_FAULT_* variables set; the hook itself is tested first, in
this process."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

from pretrain import faults
from pretrain.schedule import lr_at
from tests import train_utils as tu


def launched(test):
    """A test that launches ranks: slow, multirank, 400 s."""
    for mark in (pytest.mark.multirank, pytest.mark.timeout(400)):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tu.prepare(tmp_path_factory.mktemp("faults"))


# ------------------------------------------------------------------ the hook, in this process
class Recorded(Exception):
    """Raised by the stand-in for time.sleep: a stall or a slow read would otherwise sleep."""


@pytest.fixture
def calls(monkeypatch):
    """What the hook would do to this process: the signals it would send (os.kill) and the sleeps it would take."""
    done = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: done.append(("kill", pid, signal.Signals(sig).name)))

    def sleep(seconds):
        done.append(("sleep", seconds))
        if seconds >= 3600:
            raise Recorded

    monkeypatch.setattr(faults.time, "sleep", sleep)
    return done


def test_the_default_hook_does_nothing(calls):
    hook = faults.from_environment({"PATH": "/bin"})
    assert type(hook) is faults.Faults
    loss = torch.tensor(2.0)
    assert hook.on_loss(loss, 1, 0) is loss
    hook.before_step(1, 0)
    hook.before_micro_batch(0)
    assert calls == []


def test_each_variable_injects_its_fault_at_its_rank_and_iteration_only(calls, capsys):
    me = os.getpid()
    env = {
        "SPARSEBERT_FAULT_NONFINITE_LOSS": "2,4",
        "SPARSEBERT_FAULT_KILL_RANK": "1:3",
        "SPARSEBERT_FAULT_SIGNAL": "0:5:SIGUSR1",
        "SPARSEBERT_FAULT_STALL": "1:6",
        "SPARSEBERT_FAULT_SLOW_DATA": "1:0.4",
    }
    hook = faults.from_environment(env)
    loss = torch.tensor(2.0)
    assert [float(hook.on_loss(loss, it, 0)) for it in (1, 2, 3, 4)] == [2.0, float("inf"), 2.0, float("inf")]
    assert float(hook.on_loss(loss, 2, 1)) == 2.0  # rank 0's loss only
    for it in range(1, 6):
        for rank in (0, 1):
            hook.before_step(it, rank)
    assert calls == [("kill", me, "SIGKILL"), ("kill", me, "SIGUSR1")]
    with pytest.raises(Recorded):
        hook.before_step(6, 1)
    hook.before_micro_batch(0)
    hook.before_micro_batch(1)
    assert calls[2:] == [("sleep", 3600), ("sleep", 0.4)]
    out = capsys.readouterr().out
    assert "[fault] rank 1: dying at iteration 3" in out
    assert "[fault] rank 0: sending itself SIGUSR1 at iteration 5" in out
    assert "[fault] rank 1: stalling at iteration 6" in out


def test_with_a_once_dir_a_fault_fires_once_across_restarts(calls, tmp_path):
    """A requeued job reruns the same command with the same environment: the marker keeps it from dying again."""
    env = {"SPARSEBERT_FAULT_KILL_RANK": "0:2", "SPARSEBERT_FAULT_ONCE_DIR": str(tmp_path / "once")}
    faults.from_environment(env).before_step(2, 0)
    assert calls == [("kill", os.getpid(), "SIGKILL")]
    assert (tmp_path / "once" / "SPARSEBERT_FAULT_KILL_RANK.0.2").is_file()
    faults.from_environment(env).before_step(2, 0)  # the restarted job
    assert len(calls) == 1


def _overflow_run(data, tmp_path, entry=None):
    cfg = json.loads((tu.REPO / "ds_configs" / "zero2_fp16.json").read_text())
    cfg["fp16"]["initial_scale_power"] = 8  # small enough that the tiny model never overflows by itself
    (tmp_path / "fp16.json").write_text(json.dumps(cfg))
    args = tu.train_args(
        data,
        "zero2_fp16.json",
        6,
        "--log-json",
        str(tmp_path / "log.jsonl"),
        "--lr-warmup-fraction",
        "0.5",
        global_batch=4,
    )
    args[args.index("--deepspeed_config") + 1] = str(tmp_path / "fp16.json")
    # torchrun: its agent imports torch only, the deepspeed launcher imports DeepSpeed twice before the ranks start
    # (issue #46: ~13 s of a launch on the loaded 2-core box); the ranks run the same DeepSpeed engine either way
    p = tu.launch("torchrun", args, entry=entry, SPARSEBERT_FAULT_NONFINITE_LOSS="2,4")
    assert p.returncode == 0, p.stdout[-4000:]
    return p


@launched
@pytest.mark.skipif(tu.cpu_fp16_missing() is not None, reason=str(tu.cpu_fp16_missing()))
def test_fp16_overflow_skipped_on_all_ranks_and_lr_not_advanced(data, tmp_path):
    _overflow_run(data, tmp_path)
    _check_overflow_log(tmp_path)


@launched
def test_fp16_overflow_logic_on_any_cpu(data, tmp_path):
    """The same fp16 overflow run on every CPU: DeepSpeed's fp16 policy is lifted in the launched script (torch's
    fp16 CPU kernels are exact, only slow, without AVX512-FP16/AMX), so DeepSpeed's real loss scaler skips the
    steps and our part is checked everywhere: no stop on an fp16 inf loss, the LR read before the step, ranks
    agreeing on skipped steps, the log."""
    _overflow_run(data, tmp_path, entry=tu.fp16_policy_entry(tmp_path, supported=True))
    _check_overflow_log(tmp_path)


@launched
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks CPU ranks (a CUDA machine runs fp16 on the GPU)")
def test_fp16_on_a_cpu_without_it_fails_before_any_work_with_one_line(data, tmp_path):
    """The ranks exit 2 with the same one line naming the file, the missing CPU feature and the configs to use,
    before the process group or the model exist (no DeepSpeed traceback). DeepSpeed's launcher ends the other ranks
    as soon as one exits non-zero, so on a busy machine a slower rank may be stopped before it prints its line."""
    args = tu.train_args(data, "zero2_fp16.json", 2, global_batch=4)
    p = tu.launch("deepspeed", args, timeout=120, entry=tu.fp16_policy_entry(tmp_path, supported=False))
    assert p.returncode == 2, p.stdout[-4000:]
    errors = [line for line in p.stdout.splitlines() if "pretrain: error:" in line]
    assert 1 <= len(errors) <= tu.NPROCS and len({e.split("pretrain: error:")[1] for e in errors}) == 1
    assert "zero2_fp16.json enables fp16" in errors[0] and "AVX512-FP16 or AMX" in errors[0]
    assert "zero2_bf16.json or " in errors[0] and "zero2_fp32.json" in errors[0]
    assert "Traceback" not in p.stdout and "rank(s), backend" not in p.stdout


def _check_overflow_log(tmp_path):
    recs = tu.train_records(tmp_path / "log.jsonl")
    assert [r["skipped_steps"] for r in recs] == [0, 1, 1, 2, 2, 2]  # ranks agree (the trainer checks min == max)
    lrs = [r["lr"] for r in recs]
    assert lrs[2] == lrs[1] and lrs[4] == lrs[3]  # the step after a skip uses the same LR
    applied = [0, 1, 1, 2, 2, 3]  # optimizer steps applied before each iteration (2 and 4 skipped)
    assert lrs == pytest.approx([lr_at(a, 1e-3, 0.0, 3, 6) for a in applied])
    scales = [r["loss_scale"] for r in recs]
    assert scales[0] == 256.0 and scales[-1] < scales[0]  # the dynamic scaler backed off
    for r in recs:
        assert (r["loss"] == float("inf")) == (r["iteration"] in (2, 4))


@pytest.mark.extended  # ~7 s of 2-rank launches; the fault canary: test_dead_rank_ends_the_job_nonzero_in_bounded_time
@launched
@pytest.mark.skipif(tu.bf16_gpu_skip_reason() is not None, reason=str(tu.bf16_gpu_skip_reason()))
def test_nonfinite_loss_in_bf16_stops_every_rank_naming_the_step(data, tmp_path):
    args = tu.train_args(
        data, "zero2_bf16.json", 6, "--save", str(tmp_path / "ck"), "--save-interval", "2", global_batch=4
    )
    start = time.monotonic()
    p = tu.launch("deepspeed", args, timeout=180, SPARSEBERT_FAULT_NONFINITE_LOSS="3")
    assert p.returncode == 3, p.stdout[-4000:]
    assert p.stdout.count("non-finite loss at iteration 3 (bf16)") == tu.NPROCS  # every rank stopped on its own
    assert "Last complete checkpoint" in p.stdout and "iter_0000002" in p.stdout
    assert (tmp_path / "ck" / "latest").read_text() == "iter_0000002"
    assert not (tmp_path / "ck" / "iter_0000003").exists()
    assert time.monotonic() - start < 180


@pytest.mark.extended  # ~15 s of launches; the fault canary stays
@launched
@pytest.mark.skipif(tu.bf16_gpu_skip_reason() is not None, reason=str(tu.bf16_gpu_skip_reason()))
def test_kill_during_save_resumes_from_previous_complete_checkpoint(data, tmp_path):
    ck = tmp_path / "ck"  # ZeRO-3 bf16: the other tests cover ZeRO-2 checkpoints
    args = tu.train_args(
        data,
        "zero3_bf16.json",
        6,
        "--save",
        str(ck),
        "--save-interval",
        "2",
        "--log-json",
        str(tmp_path / "log.jsonl"),
        global_batch=4,
    )
    p = tu.launch("deepspeed", args, timeout=180, SPARSEBERT_FAULT_KILL_IN_SAVE="4")
    assert p.returncode != 0
    assert (ck / "latest").read_text() == "iter_0000002"
    assert (ck / "iter_0000004").is_dir() and not (ck / "iter_0000004" / "commit.json").exists()
    p = tu.launch("deepspeed", args + ["--load", str(ck)], timeout=180)
    assert p.returncode == 0, p.stdout[-4000:]
    assert "resumed from" in p.stdout and "iter_0000002: iteration 2" in p.stdout
    its = [r["iteration"] for r in tu.train_records(tmp_path / "log.jsonl")]
    assert its == [1, 2, 3, 4, 3, 4, 5, 6]  # iterations 3-4 ran again after the crash
    assert (ck / "latest").read_text() == "iter_0000006"
    assert (ck / "iter_0000004" / "commit.json").exists()  # the re-run completed the interrupted tag


@launched
@pytest.mark.skipif(tu.NPROCS < 2, reason="needs 2 ranks (one CUDA GPU here: NCCL needs a GPU per rank)")
def test_dead_rank_ends_the_job_nonzero_in_bounded_time(data, tmp_path):
    args = tu.train_args(data, "zero2_fp32.json", 50, "--distributed-timeout-minutes", "0.5", global_batch=4)
    start = time.monotonic()
    p = tu.launch("deepspeed", args, timeout=240, SPARSEBERT_FAULT_KILL_RANK="1:3")
    assert p.returncode != 0
    assert "rank 1: dying at iteration 3" in p.stdout
    assert "iteration 50/50" not in p.stdout
    # the survivor ends by whichever comes first: its collective fails on the lost peer (the one line, exit code 5;
    # on a host of its own that is what ends it: test_multinode.py), or DeepSpeed's launcher, polling each second,
    # sees rank 1's -9 and kills it. Under load the second won (rank 0 was still in its forward): both are bounded.
    survivor_named_the_peer = "a collective failed because a peer rank stopped answering or died" in p.stdout
    launcher_ended_the_survivor = "Killing subprocess" in p.stdout and "exits with return code = -9" in p.stdout
    assert survivor_named_the_peer or launcher_ended_the_survivor, p.stdout[-3000:]
    assert time.monotonic() - start < 240


@pytest.mark.extended  # ~7 s; the fault canary stays
@launched
@pytest.mark.skipif(tu.NPROCS < 2, reason="needs 2 ranks (one CUDA GPU here: NCCL needs a GPU per rank)")
def test_a_slow_rank_is_named_with_its_host_at_the_log_interval_and_the_run_goes_on(data, tmp_path):
    """Rank 1 reads each micro-batch 0.4 s late (a slow data path): at each log the straggler line names rank 1 and
    its host, the JSON log records it, and the run completes (a straggler is not a failure)."""
    import socket

    log = tmp_path / "log.jsonl"
    args = tu.train_args(data, "zero2_fp32.json", 6, "--log-interval", "2", "--log-json", str(log), global_batch=4)
    p = tu.launch("deepspeed", args, timeout=300, SPARSEBERT_FAULT_SLOW_DATA="1:0.4")
    assert p.returncode == 0, p.stdout[-4000:]
    host = socket.gethostname()
    assert "straggler at iteration 2:" not in p.stdout  # the first window (warm-up) is not judged
    for it in (4, 6):
        assert f"straggler at iteration {it}: rank 1 on {host} spent" in p.stdout, p.stdout[-3000:]
    assert "time in data loading" in p.stdout and "the other ranks wait for it" in p.stdout
    recs = tu.train_records(log)
    assert [r.get("straggler_rank") for r in recs] == [None, 1, 1]
    assert all(r["straggler_ratio"] > 10 for r in recs[1:])  # 0.4 s against a few ms
