"""Two CPU ranks (gloo) under torchrun (on CUDA: one rank per GPU up to two, with --deterministic), ZeRO-2 fp32 with
gradient accumulation and dropout: a 6-iteration run that saves at iteration 3, and a second run that --loads that
checkpoint in a fresh process, must agree bitwise at iterations 4-6 (loss, LR, grad norm, validation). Two launches
(issue #46: a launch costs ~15-30 s on the 2-core box, training 6 tiny steps under a second): the resumed run starts
from the directory a run stopped at iteration 3 leaves (iter_0000003, `latest` naming it). The same runs feed the
TensorBoard read-back, keep-last-k and changed-architecture checks. The stop itself (--exit-interval) under the
deepspeed launcher, 6 straight == 3 + stop + --load + 3 with the first half repeated from scratch, is the extended
test at the end (the default tier's --exit-interval stop: tests/test_train_packed.py)."""

from __future__ import annotations

import shutil

import pytest

from tests import train_utils as tu

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]
K = 3


def _common(tmp, *extra: str) -> list[str]:
    return tu.train_args(
        tmp,
        "zero2_fp32.json",
        2 * K,
        "--eval-interval",
        str(K),
        "--eval-iters",
        "2",
        "--num-workers",
        "1",
        *tu.DETERMINISTIC,
        *extra,
        global_batch=8,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tu.prepare(tmp_path_factory.mktemp("resume"))
    ck = tmp / "ck"
    straight = tu.launch(
        "torchrun",
        _common(tmp, "--log-json", str(tmp / "a.jsonl"), "--tensorboard-dir", str(tmp / "tb"))
        + ["--save", str(ck), "--save-interval", str(K)],
    )
    # what a run stopped after saving at iteration K leaves: its tag, and `latest` naming it
    for tag in ck.glob("iter_*"):
        if tag.name != f"iter_{K:07d}":
            shutil.rmtree(tag)
    (ck / "latest").write_text(f"iter_{K:07d}")
    resumed = tu.launch(
        "torchrun",
        _common(tmp, "--log-json", str(tmp / "b.jsonl"), "--save", str(ck), "--load", str(ck), "--keep-last", "1"),
    )
    return tmp, straight, resumed


def test_runs_succeed(runs):
    _, *procs = runs
    for p in procs:
        assert p.returncode == 0, p.stdout[-4000:]


def _assert_bitwise(a: list[dict], b: list[dict]) -> None:
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b]
    for ra, rb in zip(a, b):
        assert ra["loss"] == rb["loss"], (ra, rb)  # exact float equality
        assert ra["lr"] == rb["lr"] and ra["grad_norm"] == rb["grad_norm"]
        assert ra["consumed_samples"] == rb["consumed_samples"] == 8 * ra["iteration"]


def test_resume_is_bitwise_equal_at_every_step(runs):
    tmp, *_ = runs
    a, b = tu.train_records(tmp / "a.jsonl"), tu.train_records(tmp / "b.jsonl")
    assert [r["iteration"] for r in a] == list(range(1, 2 * K + 1))
    assert [r["iteration"] for r in b] == list(range(K + 1, 2 * K + 1))  # the resumed run starts after the save
    _assert_bitwise(a[K:], b)
    va = [r["valid"] for r in tu.read_log(tmp / "a.jsonl") if "valid" in r]
    vb = [r["valid"] for r in tu.read_log(tmp / "b.jsonl") if "valid" in r]
    assert len(va) == 2 and va[1:] == vb
    for v in va:
        assert 1.0 < v["perplexity"] < 1e4 and 0.0 <= v["mlm_accuracy"] <= 1.0


def test_resume_message_and_keep_last(runs):
    tmp, _, resumed = runs
    assert "resumed from" in resumed.stdout and f"iteration {K}" in resumed.stdout
    assert (tmp / "ck" / "latest").read_text() == "iter_0000006"
    tags = sorted(p.name for p in (tmp / "ck").iterdir() if p.name.startswith("iter_"))
    assert tags == ["iter_0000006"]  # --keep-last 1 removed iter_0000003 after iter_0000006 was complete
    files = {p.name for p in (tmp / "ck" / "iter_0000006").iterdir()}
    assert {
        "commit.json",
        "rng_rank0.pt",
        "rng_rank1.pt",
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    } <= files


def test_tensorboard_event_file_reads_back(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp, *_ = runs
    acc = EventAccumulator(str(tmp / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for t in (
        "train/loss",
        "train/perplexity",
        "train/lr",
        "train/grad_norm",
        "train/skipped_steps",
        "train/tokens_per_s",
        "train/samples_per_s",
        "train/memory",
        "valid/loss",
        "valid/perplexity",
        "valid/mlm_accuracy",
    ):
        assert t in tags, (t, tags)
    logged = tu.train_records(tmp / "a.jsonl")
    events = acc.Scalars("train/loss")
    assert [e.step for e in events] == [r["iteration"] for r in logged]
    for e, r in zip(events, logged):
        assert e.value == pytest.approx(r["loss"], rel=1e-6)
    assert [e.step for e in acc.Scalars("valid/loss")] == [K, 2 * K]


def test_changed_architecture_is_refused_on_load(runs):
    tmp, *_ = runs
    args = tu.train_args(
        tmp, "zero2_fp32.json", 2 * K + 2, "--num-layers", "3", "--load", str(tmp / "ck"), global_batch=8
    )
    p = tu.launch("python", args)
    assert p.returncode == 2, p.stdout[-3000:]
    assert "num_layers: checkpoint 2 vs now 3" in p.stdout and "iter_0000006" in p.stdout


@pytest.mark.extended  # three 2-rank deepspeed launches, 90-100 s in CI; the default tier's resume canary is above
def test_stop_and_resume_under_the_deepspeed_launcher_is_bitwise_at_every_step(tmp_path):
    """6 iterations straight == 3 + stop (--exit-interval) + --load + 3, each half a fresh deepspeed launch: every
    step bit-equal, the first half repeated from scratch included."""
    tmp = tu.prepare(tmp_path)
    launched = [
        tu.launch("deepspeed", _common(tmp, "--log-json", str(tmp / "a.jsonl"))),
        tu.launch(
            "deepspeed",
            _common(tmp, "--log-json", str(tmp / "b.jsonl"), "--save", str(tmp / "ck"), "--exit-interval", str(K)),
        ),
        tu.launch(
            "deepspeed",
            _common(tmp, "--log-json", str(tmp / "b.jsonl"), "--save", str(tmp / "ck"), "--load", str(tmp / "ck")),
        ),
    ]
    for p in launched:
        assert p.returncode == 0, p.stdout[-4000:]
    assert "resumed from" in launched[2].stdout and f"iteration {K}" in launched[2].stdout
    a, b = tu.train_records(tmp / "a.jsonl"), tu.train_records(tmp / "b.jsonl")
    assert [r["iteration"] for r in a] == list(range(1, 2 * K + 1))
    _assert_bitwise(a, b)
    va = [r["valid"] for r in tu.read_log(tmp / "a.jsonl") if "valid" in r]
    vb = [r["valid"] for r in tu.read_log(tmp / "b.jsonl") if "valid" in r]
    assert len(va) == 2 and va == vb
