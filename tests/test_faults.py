"""Faults on two CPU ranks: fp16 overflow skipped together without advancing the LR, a non-finite bf16 loss
stopping every rank with the step named, a kill during a save resuming from the previous complete checkpoint,
and a dead rank ending the job non-zero within a bounded time. Faults are injected through the test-only
SPARSEBERT_FAULT_* variables (pretrain/faults.py)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from pretrain.schedule import lr_at
from tests import train_utils as tu

pytestmark = [pytest.mark.slow, pytest.mark.multirank, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tu.prepare(tmp_path_factory.mktemp("faults"))


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
    p = tu.launch("deepspeed", args, entry=entry, SPARSEBERT_FAULT_NONFINITE_LOSS="2,4")
    assert p.returncode == 0, p.stdout[-4000:]
    return p


@pytest.mark.skipif(tu.cpu_fp16_missing() is not None, reason=str(tu.cpu_fp16_missing()))
def test_fp16_overflow_skipped_on_all_ranks_and_lr_not_advanced(data, tmp_path):
    _overflow_run(data, tmp_path)
    _check_overflow_log(tmp_path)


def test_fp16_overflow_logic_on_any_cpu(data, tmp_path):
    """The same fp16 overflow run on every CPU: DeepSpeed's fp16 policy is lifted in the launched script (torch's
    fp16 CPU kernels are exact, only slow, without AVX512-FP16/AMX), so DeepSpeed's real loss scaler skips the
    steps and our part is checked everywhere: no stop on an fp16 inf loss, the LR read before the step, ranks
    agreeing on skipped steps, the log."""
    _overflow_run(data, tmp_path, entry=tu.fp16_policy_entry(tmp_path, supported=True))
    _check_overflow_log(tmp_path)


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
