"""run_scripts/pretrain_modernbert.sh end to end at smoke scale: ModernBERT's recipe as the script runs it, i.e.
StableAdamW (torch-optimi) under bf16 autocast, the batch-size warm-up with Megatron's semantics, WSD with a 1-sqrt
anneal counted in samples through the ramp, fully decoupled weight decay, 30% masking and packed documents, on a
tiny model, read back from its log."""

from __future__ import annotations

import subprocess

import pytest

from tests import train_utils as tu
from tests.megatron_lr import megatron_get_lr


@pytest.mark.extended  # ~25 s: the recipe script end to end
@pytest.mark.timeout(600)
def test_the_recipe_script_ramps_the_batch_and_anneals(tmp_path):
    tu.prepare(tmp_path)
    out = tmp_path / "out"
    knobs = {
        "PRESET": "modernbert-tiny",
        "SCALE": "0.000005",  # Table 7's 2.4M steps -> 12 full-batch steps, 1 warmup step
        "BATCH_SCALE": "0.00390625",  # 131072 / 64 tokens -> a global batch of 8
        "MICRO_BATCH": "2",
        "NPROC": "1",
        "RAMP_FRACTION": "0.3",  # of 12 x 8 = 96 samples: 29
        "WSD_DECAY_FRACTION": "0.25",  # 3 anneal steps
        "DATA_PATH": str(tmp_path / "shard"),
        "VOCAB": str(tmp_path / "vocab.txt"),
        "OUT": str(out),
    }
    p = subprocess.run(
        ["bash", str(tu.REPO / "run_scripts" / "pretrain_modernbert.sh"), "64", "--log-interval", "1"],
        cwd=tu.REPO,
        env=tu.env(**knobs),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=540,
    )
    assert p.returncode == 0, p.stdout[-4000:]
    assert "optimizer StableAdamW (torch-optimi, a client optimizer)" in p.stdout
    from pretrain.checkpoint import find_resume_tag, read_client_state

    model = read_client_state(out / "ckpt", find_resume_tag(out / "ckpt"))["model_config"]  # what the run trained
    assert model["attention"]["local"] == {"sparsity": None, "token_mask": {"pattern": "sliding_window", "window": 128}}

    recs = tu.train_records(out / "log.jsonl")
    # Megatron's ramp from 8 // 6 rounded down to micro x ranks = 2 (at least one unit), +2 every 29 / 3 samples
    consumed, batches = 0, []
    while consumed <= 29:
        batches.append(min(8, 2 + 2 * int(consumed / (29 / 3))))
        consumed += batches[-1]
    batches += [8] * ((96 - consumed) // 8)
    assert [r["global_batch_size"] for r in recs] == batches == [2] * 5 + [4] * 3 + [6] * 2 + [8] * 7
    assert [r["consumed_samples"] for r in recs][-1] == sum(batches)
    # the LR counts samples through the ramp (Megatron's --lr-*-samples): a warmup over 8 samples (1 full-batch
    # step), the peak held, 1 - sqrt over the last 24 of the 96 decay samples (--train-samples); the run ends at 90
    # consumed samples (the partial last batch is dropped, as Megatron), before the anneal's end
    consumed = [sum(batches[: k + 1]) for k in range(len(batches))]
    expected = [megatron_get_lr(c, 8e-4, 0.0, 8, 96, "WSD", 24, "minus_sqrt") for c in consumed]
    assert [r["lr"] for r in recs] == pytest.approx(expected, rel=1e-9)
    assert [r["lr"] for r in recs[:4]] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4])  # 2, 4, 6, 8 samples of 8
    assert recs[-4]["lr"] == pytest.approx(8e-4) and recs[-3]["lr"] < 8e-4  # the anneal starts after 72 samples
