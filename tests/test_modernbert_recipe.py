"""run_scripts/pretrain_modernbert.sh end to end at smoke scale: ModernBERT's recipe as the script runs it, i.e.
StableAdamW (torch-optimi) under bf16 autocast, the batch-size warm-up with Megatron's semantics, WSD with a 1-sqrt
anneal, 30% masking and packed documents, on a tiny model, read back from its log."""

from __future__ import annotations

import json
import subprocess

import pytest

from pretrain.schedule import lr_at
from tests import train_utils as tu


@pytest.mark.slow
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
    model = json.loads((out / "model.json").read_text())
    assert model["attention"]["local"]["token_mask"] == {"pattern": "sliding_window", "window": 128}

    recs = tu.train_records(out / "log.jsonl")
    # Megatron's ramp from 8 // 6 rounded down to micro x ranks = 2 (at least one unit), +2 every 29 / 3 samples
    consumed, batches = 0, []
    while consumed <= 29:
        batches.append(min(8, 2 + 2 * int(consumed / (29 / 3))))
        consumed += batches[-1]
    batches += [8] * ((96 - consumed) // 8)
    assert [r["global_batch_size"] for r in recs] == batches == [2] * 5 + [4] * 3 + [6] * 2 + [8] * 7
    assert [r["consumed_samples"] for r in recs][-1] == sum(batches)
    # the LR counts steps: 1 warmup step, the peak held, 1 - sqrt over the last 3 of the 17 steps down to 0
    expected = [lr_at(s, 8e-4, 0.0, 1, len(batches), "WSD", 3, "minus_sqrt") for s in range(len(batches))]
    assert [r["lr"] for r in recs] == pytest.approx(expected)
    assert recs[-4]["lr"] == pytest.approx(8e-4) and recs[-1]["lr"] == 0.0
