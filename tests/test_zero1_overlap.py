"""``ds_configs/zero1_bf16.json`` (DeepSpeed ZeRO-1 without its per-parameter gradient hooks: ``overlap_comm`` and
``contiguous_gradients`` false) against ``zero1_bf16_overlap.json`` (with them): the same training, and the same
checkpoint layout. The host work the hooks cost is counted by ``python -m benchmarks.step --measure host``
(tests/test_bench_step.py)."""

from __future__ import annotations

import pytest

from tests import train_utils as tu


@pytest.mark.extended  # ~12 s of three trainer launches
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
