"""Single-rank runs of the two-phase schedule (--finetune with a longer position table) and a DAM search run
(auxiliary L1 loss and mask sparsity logged, learned masks exported)."""

from __future__ import annotations

import json

import pytest
import torch

from tests import train_utils as tu

pytestmark = [pytest.mark.timeout(300)]


def test_two_phase_finetune_extends_positions_and_restarts(tmp_path):
    tu.prepare(tmp_path, max_position_embeddings=32)
    p1 = tu.launch("python", tu.train_args(tmp_path, "zero1_fp32.json", 2, "--save", str(tmp_path / "p1"), seq=32))
    assert p1.returncode == 0, p1.stdout[-3000:]
    args = tu.train_args(
        tmp_path,
        "zero1_fp32.json",
        2,
        "--max-position-embeddings",
        "64",
        "--finetune",
        "--load",
        str(tmp_path / "p1"),
        "--save",
        str(tmp_path / "p2"),
        "--log-json",
        str(tmp_path / "p2.jsonl"),
        seq=64,
    )
    p2 = tu.launch("python", args)
    assert p2.returncode == 0, p2.stdout[-3000:]
    assert "position_embeddings.weight: 32 -> 64" in p2.stdout
    assert [r["iteration"] for r in tu.train_records(tmp_path / "p2.jsonl")] == [1, 2]  # restarted
    saved = torch.load(tmp_path / "p2" / "iter_0000002" / "mp_rank_00_model_states.pt", weights_only=False)
    assert saved["model_config"]["max_position_embeddings"] == 64


def test_dam_search_logs_sparsity_and_exports_masks(tmp_path):
    tu.prepare(tmp_path, max_position_embeddings=64)
    cfg = json.loads((tmp_path / "model.json").read_text())
    cfg["attention"]["token_mask"] = {"pattern": "dam", "seq_len": 64}
    (tmp_path / "model.json").write_text(json.dumps(cfg))
    p = tu.launch(
        "python",
        tu.train_args(
            tmp_path, "zero2_fp32.json", 2, "--save", str(tmp_path / "ck"), "--log-json", str(tmp_path / "log.jsonl")
        ),
    )
    assert p.returncode == 0, p.stdout[-3000:]
    recs = tu.train_records(tmp_path / "log.jsonl")
    assert all(r["aux_loss"] > 0 and 0.0 <= r["dam/sparsity"] <= 1.0 for r in recs)
    saved = torch.load(tmp_path / "ck" / "learned_masks.pt", weights_only=False)
    masks = saved["masks"]
    assert set(masks) == {"layer0", "layer1"}
    assert masks["layer0"].dtype == torch.bool and masks["layer0"].shape[-2:] == (64, 64)
