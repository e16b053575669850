"""Checkpoint bookkeeping without a distributed job: commit markers, `latest`, keep-last-k, architecture checks,
position-embedding extension. (Save/resume through DeepSpeed is in test_train_resume.py and test_faults.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from pretrain import checkpoint as ck


def fake_tag(root, it: int, committed: bool = True):
    d = root / ck.tag_for(it)
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"x")
    if committed:
        (d / ck.COMMIT_MARKER).write_text(json.dumps({"iteration": it}))
    return d


def test_resume_ignores_uncommitted_latest(tmp_path):
    fake_tag(tmp_path, 100)
    fake_tag(tmp_path, 200, committed=False)
    (tmp_path / "latest").write_text(ck.tag_for(200))  # e.g. DeepSpeed's own save_latest before a crash
    assert ck.find_resume_tag(tmp_path) == ck.tag_for(100)
    (tmp_path / "latest").write_text(ck.tag_for(100))
    assert ck.find_resume_tag(tmp_path) == ck.tag_for(100)
    assert ck.find_resume_tag(tmp_path / "empty") is None


def test_keep_last_prunes_old_and_incomplete(tmp_path):
    for it in (1, 2, 3, 4):
        fake_tag(tmp_path, it)
    fake_tag(tmp_path, 5, committed=False)  # a leftover of a killed save, older than the newest complete one
    fake_tag(tmp_path, 6)
    removed = ck.prune(tmp_path, keep_last=2)
    assert sorted(removed) == [ck.tag_for(i) for i in (1, 2, 3, 5)]
    assert [t for _, t in ck.committed_tags(tmp_path)] == [ck.tag_for(4), ck.tag_for(6)]


def test_architecture_differences_name_the_settings():
    from model.config import ModelConfig

    a = ModelConfig.preset("tiny").to_dict()
    b = ModelConfig.preset(
        "tiny", num_layers=3, hidden_dropout=0.0, attention={"kernel": "dense", "sparsity": None}
    ).to_dict()
    diffs = ck.architecture_differences(a, b)
    assert any(d.startswith("num_layers: checkpoint 2 vs now 3") for d in diffs)
    assert any(d.startswith("attention.kernel") for d in diffs)
    assert not any("hidden_dropout" in d for d in diffs)
    assert ck.architecture_differences(a, dict(a)) == []


def test_position_embeddings_extended_by_repetition():
    from model.bert import BertForPreTraining
    from model.config import ModelConfig

    short = BertForPreTraining(ModelConfig.preset("tiny", vocab_size=50, max_position_embeddings=32))
    long = BertForPreTraining(ModelConfig.preset("tiny", vocab_size=50, max_position_embeddings=80))
    weights = {k: v.clone() for k, v in short.state_dict().items()}
    done = ck.extend_position_embeddings(weights, long)
    assert len(done) == 1 and "32 -> 80" in done[0]
    name = next(k for k in weights if k.endswith("position_embeddings.weight"))
    old = short.state_dict()[name]
    assert weights[name].shape[0] == 80
    assert torch.equal(weights[name][:32], old) and torch.equal(weights[name][32:64], old)
    long.load_state_dict(weights)  # every other shape already matches
    with pytest.raises(ck.CheckpointError, match="shrinking"):
        ck.extend_position_embeddings({k: v.clone() for k, v in long.state_dict().items()}, short)
