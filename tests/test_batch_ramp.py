"""--rampup-batch-size (Megatron's semantics, megatron-core's calculator): the batch of each step, the run's length,
refusals, and through the real trainer on 2 ranks: the logged batches follow the ramp, the first steps equal a run
with that fixed batch, and a run stopped mid-ramp resumes to the straight run's losses bitwise."""

from __future__ import annotations

import pytest

from pretrain.args import ArgsError, parse_args
from pretrain.batch_ramp import BatchRamp
from tests import train_utils as tu


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


@pytest.mark.slow
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
