"""benchmarks/train_step_ds.py times the trainer's inputs and the paper set-ups' kernels (issue 25 item 3): no
all-ones attention mask reaches the engine (dense runs unmasked SDPA), the MLM head gets the derived static cap, and
with the papers' attention dropout 0.1 ``auto`` trains BlockBERT with block_gather (flex has no dropout)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from data_pipeline.masking import derived_max_predictions
from tests import train_utils as tu


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rows_record_the_inputs_and_kernels_the_trainer_uses(tmp_path):
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "benchmarks.train_step_ds", "--model-preset", "tiny", "--device", "cpu"]
    cmd += ["--precisions", "bf16", "--steps", "1", "--warmup", "1", "--seq-lens", "128", "--json", str(out)]
    p = subprocess.run(cmd, cwd=tu.REPO, env=tu.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, p.stdout[-3000:]
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"dense", "blockbert-n2", "blockbert-n3"}
    for r in rows.values():
        assert r["attention_mask_passed"] is False
        assert r["max_predictions"] == derived_max_predictions(128, 0.15)
    assert rows["dense"]["kernel_used"] == "dense"
    assert rows["blockbert-n2"]["kernel_used"] == rows["blockbert-n3"]["kernel_used"] == "block_gather"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_it_times_the_data_pipelines_batches(tmp_path):
    """--data-path: each step a batch of the trainer's loader (doc-sentences rows, their padding, the cap the trainer
    derives); tokens/s counts the real tokens."""
    data = tu.prepare(tmp_path)
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "benchmarks.train_step_ds", "--model-preset", "tiny", "--device", "cpu", "--variants"]
    cmd += ["dense", "--precisions", "bf16", "--steps", "2", "--warmup", "1", "--seq-lens", "64", "--json", str(out)]
    cmd += ["--data-path", str(data / "shard"), "--vocab-file", str(data / "vocab.txt"), "--vocab", str(tu.VOCAB_SIZE)]
    p = subprocess.run(cmd, cwd=tu.REPO, env=tu.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, p.stdout[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["batches"] == "data pipeline" and row["max_predictions"] == derived_max_predictions(64, 0.15)
    assert 0 < row["tokens_per_s"] * row["step_s"] <= row["batch"] * 64


def test_a_whole_preset_variant_trains_that_preset_with_the_kernel_asked_for():
    from argparse import Namespace

    from benchmarks.train_step_ds import Case, case_model_config
    from model.config import ModelConfig

    args = Namespace(hidden=64, layers=2, heads=4, vocab_size=30522, kernel="block_gather")
    got = case_model_config(Case("modernbert-blockbert", seq_len=8192), args)
    want = ModelConfig.preset("modernbert-blockbert-base")
    assert (got.num_layers, got.hidden_size, got.intermediate_size) == (
        want.num_layers,
        want.hidden_size,
        want.intermediate_size,
    )
    assert got.max_position_embeddings == 8192 and got.vocab_size == 30522
    assert got.attention.kernel == "block_gather" and got.attention.global_every == want.attention.global_every
    small = case_model_config(Case("blockbert-n2", seq_len=512), args)
    assert (small.num_layers, small.hidden_size, small.attention.kernel) == (2, 64, "block_gather")
