"""End to end with --sample-mode packed-docs: one CPU process trains a ModernBERT-style tiny model (rotary
positions, sliding-window layers) on packed samples whose attention stays inside each document, evaluates, and
resumes bitwise (6 iterations straight == 3 + stop + --load + 3)."""

from __future__ import annotations

import math

import pytest

from tests import train_utils as tu

pytestmark = [pytest.mark.timeout(600)]
K = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from model.presets import PRESETS

    tmp = tu.prepare(
        tmp_path_factory.mktemp("packed"),
        **{k: v for k, v in PRESETS["modernbert-tiny"].items() if k not in ("vocab_size",)},
    )
    common = tu.train_args(
        tmp,
        "zero2_fp32.json",
        2 * K,
        "--sample-mode",
        "packed-docs",
        "--attention-kernel",
        "block_gather",
        "--eval-interval",
        str(K),
        "--eval-iters",
        "1",
        global_batch=4,
    )
    straight = tu.launch("python", common + ["--log-json", str(tmp / "a.jsonl")], nprocs=1)
    first = tu.launch(
        "python",
        common + ["--log-json", str(tmp / "b.jsonl"), "--save", str(tmp / "ck"), "--exit-interval", str(K)],
        nprocs=1,
    )
    second = tu.launch(
        "python",
        common + ["--log-json", str(tmp / "b.jsonl"), "--save", str(tmp / "ck"), "--load", str(tmp / "ck")],
        nprocs=1,
    )
    return tmp, straight, first, second


def test_packed_training_runs_and_resumes_bitwise(runs):
    tmp, *procs = runs
    for p in procs:
        assert p.returncode == 0, p.stdout[-4000:]
    a, b = tu.train_records(tmp / "a.jsonl"), tu.train_records(tmp / "b.jsonl")
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b] == list(range(1, 2 * K + 1))
    for ra, rb in zip(a, b):
        assert math.isfinite(ra["loss"]) and ra["loss"] == rb["loss"], (ra, rb)
