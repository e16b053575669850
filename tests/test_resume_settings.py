"""Resuming with settings that differ from the checkpoint's is never silent (Megatron-LM's rules): the LR schedule
is refused, or overridden by --override-opt-param-scheduler, or kept by --use-checkpoint-opt-param-scheduler; a new
global batch continues at the stored sample; a new sequence length is refused; a new sample stream is said."""

from __future__ import annotations

import pytest

from pretrain.args import parse_args
from pretrain.checkpoint import CheckpointError
from pretrain.resume import plan_resume, schedule_settings
from pretrain.schedule import lr_at
from tests import train_utils as tu

LR = 1e-3


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """4 iterations (warmup fraction 0.2 of 4 = 0 steps, decay over 4), saved."""
    tmp = tu.prepare(tmp_path_factory.mktemp("resume_settings"))
    ck = tmp / "ck"
    p = tu.launch("python", _args(tmp, 4, ck, tmp / "first.jsonl"))
    assert p.returncode == 0, p.stdout[-3000:]
    return tmp, ck


def _args(tmp, iters, ck, log, *extra, global_batch=4):
    return tu.train_args(
        tmp,
        "zero2_fp32.json",
        iters,
        "--save",
        str(ck),
        "--load",
        str(ck),
        "--log-json",
        str(log),
        *extra,
        global_batch=global_batch,
    )


def _copy(ck, tmp_path):
    import shutil

    shutil.copytree(ck, tmp_path / "ck")
    return tmp_path / "ck"


@pytest.mark.timeout(300)
def test_extending_train_iters_is_refused_naming_each_schedule_flag(first, tmp_path):
    data, ck = first
    p = tu.launch("python", _args(data, 8, _copy(ck, tmp_path), tmp_path / "log.jsonl"))
    assert p.returncode == 2, p.stdout[-3000:]
    assert "the LR schedule of the checkpoint differs from the flags'" in p.stdout
    assert "--lr-decay-iters (default: --train-iters): checkpoint 4, now 8" in p.stdout
    assert "warmup steps (--lr-warmup-iters, or --lr-warmup-fraction x decay steps): checkpoint 0, now 1" in p.stdout
    assert "--override-opt-param-scheduler" in p.stdout and "--use-checkpoint-opt-param-scheduler" in p.stdout
    assert "Traceback" not in p.stdout
    assert not (tmp_path / "log.jsonl").exists() or not tu.train_records(tmp_path / "log.jsonl")


@pytest.mark.timeout(300)
def test_override_uses_the_flags_schedule_from_the_stored_step(first, tmp_path):
    data, ck = first
    p = tu.launch(
        "python", _args(data, 8, _copy(ck, tmp_path), tmp_path / "log.jsonl", "--override-opt-param-scheduler")
    )
    assert p.returncode == 0, p.stdout[-3000:]
    assert "--override-opt-param-scheduler: the LR follows the flags' schedule from step 4 on" in p.stdout
    recs = tu.train_records(tmp_path / "log.jsonl")
    assert [r["iteration"] for r in recs] == [5, 6, 7, 8]
    # the new schedule: warmup floor(0.2 x 8) = 1 step, linear decay over 8, at applied steps 4..7
    assert [r["lr"] for r in recs] == pytest.approx([lr_at(s, LR, 0.0, 1, 8) for s in range(4, 8)])
    assert recs[0]["lr"] > 0


@pytest.mark.timeout(300)
def test_use_checkpoint_keeps_the_stored_schedule(first, tmp_path):
    data, ck = first
    p = tu.launch(
        "python",
        _args(
            data, 6, _copy(ck, tmp_path), tmp_path / "log.jsonl", "--lr", "5e-4", "--use-checkpoint-opt-param-scheduler"
        ),
    )
    assert p.returncode == 0, p.stdout[-3000:]
    assert "--use-checkpoint-opt-param-scheduler: keeping the checkpoint's LR schedule" in p.stdout
    assert "--lr: checkpoint 0.001, now 0.0005" in p.stdout
    recs = tu.train_records(tmp_path / "log.jsonl")
    # the stored schedule (peak 1e-3, no warmup, decay over 4) has reached min_lr at step 4
    assert [r["lr"] for r in recs] == pytest.approx([lr_at(s, LR, 0.0, 0, 4) for s in (4, 5)])


@pytest.mark.timeout(300)
def test_new_global_batch_continues_at_the_stored_sample_and_says_so(first, tmp_path):
    data, ck = first
    p = tu.launch(
        "python", _args(data, 6, _copy(ck, tmp_path), tmp_path / "log.jsonl", "--lr-decay-iters", "4", global_batch=8)
    )
    assert p.returncode == 0, p.stdout[-3000:]
    assert "global batch size 8 differs from the checkpoint's 4: continuing at sample 16" in p.stdout
    recs = tu.train_records(tmp_path / "log.jsonl")
    assert [r["consumed_samples"] for r in recs] == [24, 32]


@pytest.mark.timeout(300)
def test_new_seq_length_is_refused_and_a_new_seed_is_said(first, tmp_path):
    data, ck = first
    ck2 = _copy(ck, tmp_path)
    p = tu.launch("python", _args(data, 4, ck2, tmp_path / "log.jsonl") + ["--seq-length", "32"])
    assert p.returncode == 2, p.stdout[-3000:]
    assert "--seq-length 32 differs from the checkpoint's 64" in p.stdout and "--finetune" in p.stdout
    extra = ["--lr-decay-iters", "4", "--seed", "8", "--max-predictions-per-seq", "16"]
    p = tu.launch("python", _args(data, 5, ck2, tmp_path / "log.jsonl", *extra))
    assert p.returncode == 0, p.stdout[-3000:]
    assert (
        "--seed 8 differs from the checkpoint's 7: the run continues at sample 16 of the new sample stream" in p.stdout
    )
    assert "--max-predictions-per-seq 16 differs from the checkpoint's None" in p.stdout  # the masks' cap


def _client(**over):
    run = parse_args(["--data-path", "d", "--micro-batch-size", "2", "--train-iters", "10", "--seq-length", "64"])
    client = {
        "args": run.to_dict(),
        "global_batch": 4,
        "consumed_train_samples": 40,
        "iteration": 10,
        "lr_scheduler": {
            "peak": 1e-4,
            "min_lr": 0.0,
            "warmup": 0,
            "decay_iters": 10,
            "style": "linear",
            "last_epoch": 10,
        },
    }
    client.update(over)
    return client


def test_plan_resume_unit():
    run = parse_args(
        [
            "--data-path",
            "d",
            "--micro-batch-size",
            "2",
            "--train-iters",
            "20",
            "--seq-length",
            "64",
            "--override-opt-param-scheduler",
        ]
    )
    now = schedule_settings(1e-4, 0.0, 0, 20, "linear")
    plan = plan_resume("ck/iter", _client(), run, now, global_batch=4, micro_batch=2)
    assert plan.schedule == now and len(plan.notes) == 1
    same = schedule_settings(1e-4, 0.0, 0, 10, "linear")
    assert plan_resume("ck/iter", _client(), run, same, 4, 2).schedule is None
    run.checkpoint.override_opt_param_scheduler = False
    with pytest.raises(CheckpointError, match="--lr-decay-iters .*: checkpoint 10, now 20"):
        plan_resume("ck/iter", _client(), run, now, 4, 2)
    with pytest.raises(CheckpointError, match="no LR scheduler state"):
        plan_resume("ck/iter", _client(lr_scheduler=None), run, same, 4, 2)
    notes = plan_resume("ck/iter", _client(), run, same, global_batch=4, micro_batch=1).notes
    assert notes == [
        "micro batch size 1 differs from the checkpoint's 2: same samples per step, gradient accumulation steps change"
    ]


def test_plan_resume_refuses_another_schedule_unit_and_divides_a_decoupled_decay():
    """A checkpoint counted in steps cannot carry its count into a sample-counted schedule (--train-samples) even
    with --override-opt-param-scheduler; --use-checkpoint-opt-param-scheduler keeps its schedule. With
    --fully-decoupled-weight-decay the decayed group gets weight_decay / peak LR, and turning the flag on at a
    resume is refused like a changed --weight-decay (a checkpoint without the key ran without it)."""
    base = ["--data-path", "d", "--micro-batch-size", "2", "--seq-length", "64", "--global-batch-size", "4"]
    samples = schedule_settings(1e-4, 0.0, 0, 80, "linear", unit="samples")
    run = parse_args(base + ["--train-samples", "80", "--override-opt-param-scheduler"])
    with pytest.raises(CheckpointError, match="the checkpoint's LR schedule counts iters, this run's samples"):
        plan_resume("ck/iter", _client(), run, samples, 4, 2)
    run = parse_args(base + ["--train-samples", "80", "--use-checkpoint-opt-param-scheduler"])
    assert plan_resume("ck/iter", _client(), run, samples, 4, 2).schedule is None  # the checkpoint's, in steps

    steps = schedule_settings(1e-4, 0.0, 0, 10, "linear")
    run = parse_args(base + ["--train-iters", "10", "--weight-decay", "0.01", "--fully-decoupled-weight-decay"])
    with pytest.raises(CheckpointError, match="--fully-decoupled-weight-decay: checkpoint False, now True"):
        plan_resume("ck/iter", _client(), run, steps, 4, 2)
    saved = _client(args=run.to_dict())
    assert plan_resume("ck/iter", saved, run, steps, 4, 2).optimizer["weight_decay"] == pytest.approx(0.01 / 1e-4)
