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


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_shipped_bf16_zero1_step_does_no_per_parameter_hook_work(tmp_path):
    out = tmp_path / "h.json"
    cmd = [sys.executable, "-m", "benchmarks.host_overhead", "--configs", "zero1_bf16.json", "zero1_bf16_overlap.json"]
    cmd += ["--hidden", "32", "--warmup", "1", "--steps", "1", "--json", str(out)]
    p = subprocess.run(cmd, cwd=tu.REPO, env=tu.env(), capture_output=True, text=True, timeout=220)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    shipped, overlap = json.loads(out.read_text())["rows"]
    n = shipped["param_tensors"]
    assert n == overlap["param_tensors"] > 150  # bert-base's parameter tensors (12 layers), at a tiny width
    bound = PER_PARAM * n + PER_STEP
    assert shipped["ops"]["engine_backward"] <= bound, shipped["top_ops"]
    assert overlap["ops"]["engine_backward"] > bound  # the counter sees the hooks: this test can fail
    # the model's own operators are the same in both: only DeepSpeed's work differs
    for phase in ("forward", "autograd", "step"):
        assert shipped["ops"][phase] == overlap["ops"][phase], phase
