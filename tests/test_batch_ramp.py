"""--rampup-batch-size (Megatron's semantics, megatron-core's calculator): the batch of each step, the run's length,
refusals, and through the real trainer on 2 ranks: the logged batches follow the ramp, the first steps equal a run
with that fixed batch, and a run stopped mid-ramp resumes to the straight run's losses bitwise."""

from __future__ import annotations

import pytest

from pretrain.args import ArgsError, parse_args
from pretrain.batch_ramp import BatchRamp
from tests import train_utils as tu
from tests.megatron_lr import megatron_get_lr


def test_batches_follow_megatron_rampup():
    r = BatchRamp([4, 4, 16], 12, micro=2, dp=2)  # 2 increments, one every 8 samples
    consumed, batches = 0, []
    for _ in range(6):
        batches.append(r.batch_at(consumed))
        consumed += batches[-1]
    assert batches == [4, 4, 8, 12, 12, 12]
    # Megatron's update_train_iters: ramp steps while consumed <= 16 (4, 4, 8, 12 -> 28), then (100 - 28) // 12 = 6
    assert r.train_iters(100) == 10
    assert r.samples_after(0, 10) == 28 + 6 * 12
    assert BatchRamp([12, 4, 16], 12, micro=2, dp=2).batch_at(0) == 12  # start = global: no ramp


@pytest.mark.parametrize(
    "ramp, match",
    [
        ([6, 4, 16], "multiples of micro batch 2 x 2"),
        ([4, 6, 16], "multiples"),
        ([4, 12, 16], "whole increments"),
        ([16, 4, 16], "whole increments"),
    ],
)
def test_a_ramp_that_does_not_fit_is_refused(ramp, match):
    with pytest.raises(ArgsError, match=match):
        BatchRamp(ramp, 12, micro=2, dp=2)


def test_ramp_needs_train_samples(tmp_path):
    tu.prepare(tmp_path)
    args = tu.train_args(tmp_path, "zero2_fp32.json", 4) + ["--rampup-batch-size", "4", "4", "16"]
    with pytest.raises(ArgsError, match="needs --train-samples"):
        parse_args(args)


def _run(tmp_path, name: str, *extra: str, samples: int = 64, global_batch: int = 12):
    args = tu.train_args(tmp_path, "zero2_fp32.json", 1, "--log-json", str(tmp_path / f"{name}.jsonl"), *extra)
    i = args.index("--train-iters")
    args[i : i + 2] = ["--train-samples", str(samples), "--global-batch-size", str(global_batch)]
    # a constant LR: the first steps of runs of different lengths must see the same LR (a warmup or a decay is counted
    # over the whole run, as Megatron counts it)
    w = args.index("--lr-warmup-fraction")
    args[w : w + 2] = ["--lr-decay-style", "constant"]
    p = tu.launch("deepspeed", args)
    assert p.returncode == 0, p.stdout[-4000:]
    return tu.train_records(tmp_path / f"{name}.jsonl"), p.stdout


@pytest.mark.extended  # ~45 s of 2-rank launches; the ramp itself is unit-tested here
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_ramp_through_the_trainer_and_an_exact_resume(tmp_path):
    tu.prepare(tmp_path, hidden_dropout=0.0, attention_dropout=0.0)
    ramp = ["--rampup-batch-size", "4", "4", "16"]
    straight, _ = _run(tmp_path, "straight", *ramp)
    assert [r["global_batch_size"] for r in straight] == [4, 4, 8, 12, 12, 12, 12]  # 28 + 3 x 12 = 64 samples
    assert [r["consumed_samples"] for r in straight] == [4, 8, 16, 28, 40, 52, 64]
    fixed, _ = _run(tmp_path, "fixed4", samples=8, global_batch=4)
    assert [r["loss"] for r in straight[:2]] == [r["loss"] for r in fixed]  # same samples, same accumulation
    ck = str(tmp_path / "ck")
    resumable = [*ramp, "--save", ck, "--load", ck]
    first, _ = _run(tmp_path, "resumed", *resumable, "--exit-interval", "3")
    assert [r["iteration"] for r in first] == [1, 2, 3]
    second, out = _run(tmp_path, "resumed", *resumable)
    assert "resumed from" in out
    recs = tu.train_records(tmp_path / "resumed.jsonl")
    assert [r["iteration"] for r in recs] == [1, 2, 3, 4, 5, 6, 7]
    assert [r["loss"] for r in recs] == [r["loss"] for r in straight]  # bitwise, across the ramp
    assert [r["global_batch_size"] for r in recs] == [r["global_batch_size"] for r in straight]


RAMP_RUN = ["--data-path", "x", "--vocab-file", "v", "--micro-batch-size", "2", "--global-batch-size", "12"]
RAMP_RUN += ["--train-samples", "100", "--rampup-batch-size", "4", "4", "16", "--lr", "1e-3", "--min-lr", "1e-5"]


@pytest.mark.parametrize(
    "flags, megatron",
    [
        (["--lr-warmup-samples", "20", "--lr-decay-samples", "90"], (20, 90, "linear")),
        (["--lr-warmup-samples", "10", "--lr-decay-style", "cosine"], (10, 100, "cosine")),  # decay: --train-samples
        (["--lr-warmup-fraction", "0.25", "--lr-decay-samples", "80"], (20, 80, "linear")),  # 0.25 x 80 samples
        (
            ["--lr-warmup-samples", "8", "--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "30"]
            + ["--lr-wsd-decay-style", "minus_sqrt"],
            (8, 100, "WSD", 30, "minus_sqrt"),
        ),
    ],
)
def test_sample_counted_schedule_follows_megatron_during_a_ramp(flags, megatron):
    """The flags -> pretrain.args.lr_schedule -> the scheduler stepped as the trainer steps it (set_next_increment
    with the step's batch before it, DeepSpeed's step(increment=batch) after it) on a real optimizer: each step's LR
    is Megatron's get_lr at the samples consumed with that step, through the ramp's 4, 4, 8, 12, ... batches."""
    import torch

    from pretrain.args import lr_schedule, parse_args
    from pretrain.schedule import WarmupLinearDecay

    run = parse_args(RAMP_RUN + flags)
    ramp = BatchRamp(run.loop.rampup_batch_size, 12, micro=2, dp=2)
    iters = ramp.train_iters(100)
    settings = lr_schedule(run.optim, run.loop, iters)
    assert settings["unit"] == "samples" and (settings["warmup"], settings["decay_iters"]) == megatron[:2]
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=1e-3)
    sched = WarmupLinearDecay(opt, **settings)
    consumed, got, want = 0, [], []
    for _ in range(iters):
        batch = ramp.batch_at(consumed)
        sched.set_next_increment(batch)
        got.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(2)
        opt.step()
        sched.step(increment=batch)
        consumed += batch
        want.append(megatron_get_lr(consumed, 1e-3, 1e-5, *megatron))
    assert consumed == 28 + 6 * 12  # 4, 4, 8, 12 then whole batches
    assert got == pytest.approx(want, rel=1e-12, abs=0)
    assert sched.last_epoch == consumed  # the schedule's count is samples


def test_step_and_sample_schedules_agree_at_a_fixed_batch():
    """Without a ramp, --train-samples with the -samples flags (steps x batch) gives the LRs of --train-iters with
    the -iters flags: the two units are one schedule."""
    from pretrain.args import lr_schedule, parse_args
    from pretrain.schedule import lr_at

    base = ["--data-path", "x", "--vocab-file", "v", "--micro-batch-size", "2", "--global-batch-size", "12"]
    by_iters = parse_args(base + ["--train-iters", "10", "--lr-warmup-iters", "3", "--lr-decay-iters", "8"])
    by_samples = parse_args(base + ["--train-samples", "120", "--lr-warmup-samples", "36", "--lr-decay-samples", "96"])
    a, b = lr_schedule(by_iters.optim, by_iters.loop, 10), lr_schedule(by_samples.optim, by_samples.loop, 10)
    keys = ("peak", "min_lr", "warmup", "decay_iters", "style")
    steps = [lr_at(k, **{x: a[x] for x in keys}) for k in range(10)]
    samples = [lr_at(12 * k, **{x: b[x] for x in keys}, increment=12) for k in range(10)]
    assert samples == pytest.approx(steps, rel=1e-12, abs=0)
