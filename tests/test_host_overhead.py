"""The host's per-parameter work in the shipped bf16 ZeRO-1 step, counted on CPU (benchmarks/host_overhead.py): the
H200 profile (docs/performance.md) found the bert-base step host-bound, ~28 ms of every step in DeepSpeed ZeRO's
per-parameter gradient hooks. ``ds_configs/zero1_bf16.json`` turns them off (``overlap_comm`` and
``contiguous_gradients`` false: ZeRO-1 then reduces the gradients once, at the accumulation boundary);
``zero1_bf16_overlap.json`` keeps them for jobs whose gradient reduction is worth overlapping with the backward."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import train_utils as tu

#: DeepSpeed's ZeRO-1 reduction at the boundary without hooks (stage_1_and_2.py allreduce_bucket / allreduce_and_copy,
#: DeepSpeed 0.19.8): per parameter tensor a slice, two views and a copy_ back from the reduced flat bucket (4); per
#: bucket a cat, the all-reduce and its averaging (5 here, 8 allowed). The hooks' path costs 12 per parameter (a Python
#: hook per tensor: narrow and copy into the contiguous bucket, views, detach, counting the tensors in the graph).
PER_PARAM, PER_STEP = 4, 8
#: ZeRO-0 autocast's step outside torch's optimizer: the trainer's clip_grad_norm_ (_foreach_norm, stack, norm, add,
#: reciprocal, mul, clamp, _foreach_mul_) and DeepSpeed's step bookkeeping, whatever the number of tensors
AUTOCAST_STEP = 16


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_shipped_bf16_steps_do_no_per_parameter_work_in_deepspeed(tmp_path):
    out = tmp_path / "h.json"
    configs = ["zero1_bf16.json", "zero1_bf16_overlap.json", "zero0_bf16_autocast.json"]
    cmd = [sys.executable, "-m", "benchmarks.host_overhead", "--configs", *configs]
    cmd += ["--hidden", "32", "--warmup", "1", "--steps", "1", "--json", str(out)]
    p = subprocess.run(cmd, cwd=tu.REPO, env=tu.env(), capture_output=True, text=True, timeout=220)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    shipped, overlap, autocast = json.loads(out.read_text())["rows"]
    n = shipped["param_tensors"]
    assert n == overlap["param_tensors"] > 150  # bert-base's parameter tensors (12 layers), at a tiny width
    bound = PER_PARAM * n + PER_STEP
    assert shipped["ops"]["engine_backward"] <= bound, shipped["top_ops"]
    assert overlap["ops"]["engine_backward"] > bound  # the counter sees the hooks: this test can fail
    # the model's own operators are the same in both: only DeepSpeed's work differs
    for phase in ("forward", "autograd", "step"):
        assert shipped["ops"][phase] == overlap["ops"][phase], phase
    # ZeRO-0 under torch_autocast, one rank: DeepSpeed adds nothing to the backward (the all-reduce over one rank is
    # off: 1 operator left, the loss's scaling by the accumulation steps) and nothing to the step but the optimizer;
    # the trainer's clipping is torch's multi-tensor clip_grad_norm_ (8 operators, whatever the tensor count)
    assert autocast["ops"]["engine_backward"] <= 1, autocast["top_ops"]
    assert autocast["ops"]["step"] - autocast["ops_in_torch_optimizer"] + autocast["ops"]["other"] <= AUTOCAST_STEP


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_zero1_bf16_trains_as_with_the_hooks_and_resumes_from_their_checkpoint(tmp_path):
    """Without the hooks the same step, bit for bit (one rank), and the checkpoint layout is the same: a run saved
    with zero1_bf16_overlap.json goes on with zero1_bf16.json exactly as a straight run."""
    tu.prepare(tmp_path)
    ck = str(tmp_path / "ck")

    def run(cfg: str, log: str, *extra: str) -> None:
        args = tu.train_args(tmp_path, cfg, 4, "--log-json", str(tmp_path / log), *extra, global_batch=4)
        p = tu.launch("python", args)
        assert p.returncode == 0, p.stdout[-4000:]

    run("zero1_bf16.json", "a.jsonl")
    run("zero1_bf16_overlap.json", "b.jsonl", "--save", ck, "--exit-interval", "2")
    run("zero1_bf16.json", "b.jsonl", "--save", ck, "--load", ck)
    a, b = tu.train_records(tmp_path / "a.jsonl"), tu.train_records(tmp_path / "b.jsonl")
    assert [r["iteration"] for r in b] == [1, 2, 3, 4]
    assert [(r["loss"], r["grad_norm"]) for r in a] == [(r["loss"], r["grad_norm"]) for r in b]
