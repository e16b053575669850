"""Layouts: equality with DeepSpeed 0.19.5 goldens, BlockBERT's Eq. 2, random-block rules, ds_config parsing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from model import attention as A

GOLDEN = Path(__file__).parent / "data" / "ds0195_layouts.npz"


def _goldens():
    data = np.load(GOLDEN)
    meta = json.loads(bytes(data["__meta__"]).decode())
    return [(name, m, data[name]) for name, m in meta.items()]


@pytest.mark.parametrize("name,meta,expected", _goldens(), ids=lambda x: x if isinstance(x, str) else "")
def test_layout_equals_deepspeed_0195(name, meta, expected):
    cfg = getattr(A, meta["class"])(**meta["kwargs"])
    got = cfg.make_layout(meta["seq_len"])
    assert got.dtype == torch.int64
    assert got.shape == expected.shape
    assert torch.equal(got, torch.from_numpy(expected.astype(np.int64))), name


def test_deepspeed_defaults_and_validation():
    f = A.FixedSparsityConfig(num_heads=4)
    assert (f.block, f.num_local_blocks, f.num_global_blocks, f.attention) == (16, 4, 1, "bidirectional")
    assert A.LocalSlidingWindowSparsityConfig(4).attention == "unidirectional"
    assert A.BigBirdSparsityConfig(4).num_random_blocks == 1
    with pytest.raises(ValueError, match="dividable by Block size"):
        A.DenseSparsityConfig(2).make_layout(100)
    with pytest.raises(ValueError, match="different_layout_per_head"):
        A.FixedSparsityConfig(2, num_different_global_patterns=2)
    with pytest.raises(ValueError, match="dividable by number of global"):
        A.FixedSparsityConfig(2, num_local_blocks=4, num_global_blocks=3)
    with pytest.raises(ValueError, match="horizontal"):
        A.FixedSparsityConfig(2, attention="unidirectional", horizontal_global_attention=True)
    with pytest.raises(ValueError, match="end index"):
        A.BSLongformerSparsityConfig(2, global_block_indices=[3], global_block_end_indices=[3])


@pytest.mark.parametrize("cls", [A.BigBirdSparsityConfig, A.VariableSparsityConfig])
def test_random_blocks_seeded_and_follow_rules(cls):
    kw = dict(num_heads=3, block=16, different_layout_per_head=True, num_random_blocks=2)
    if cls is A.VariableSparsityConfig:
        kw.update(local_window_blocks=[1], global_block_indices=[])
    else:
        kw.update(num_sliding_window_blocks=1, num_global_blocks=0)
    a = cls(**kw, seed=7).make_layout(512)
    assert torch.equal(a, cls(**kw, seed=7).make_layout(512)), "same seed must give the same layout on every rank"
    assert not torch.equal(a, cls(**kw, seed=8).make_layout(512))
    # with a 1-block window (diagonal only), every row has the diagonal plus 1..2 random blocks, distinct
    eye = torch.eye(32, dtype=torch.int64)
    extra = (a - eye).clamp(min=0).sum(-1)
    assert extra.min() >= 1 and extra.max() <= 2
    assert not torch.equal(a[0], a[1]), "different_layout_per_head draws per head"
    # the random blocks are spread: every column gets picked somewhere over 3 heads x 32 rows x 2 draws
    assert (a.sum((0, 1)) > 0).float().mean() > 0.8


def test_bigbird_unidirectional_random_stays_causal():
    lay = A.BigBirdSparsityConfig(2, num_random_blocks=1, attention="unidirectional", seed=3).make_layout(256)
    assert torch.equal(lay, torch.tril(lay))


@pytest.mark.parametrize("n,spec,counts", [(2, "10:2", [10, 2]), (3, "8:2:2", [8, 2, 2])])
def test_blockbert_matches_paper_eq2(n, spec, counts):
    cfg = A.BlockBERTSparsityConfig(num_heads=12, num_blocks=n, head_assignment=spec, block=16)
    N = 16 * n * 4
    lay = cfg.make_layout(N)
    chunk = N // n
    tok = torch.arange(N) // chunk
    h = 0
    for k, c in enumerate(counts):
        for _ in range(c):
            # token-level mask: M_ij = 1 iff key chunk == (query chunk + k) mod n  (pi = sigma^k)
            want = tok[None, :] == (tok[:, None] + k) % n
            got = lay[h].repeat_interleave(16, 0).repeat_interleave(16, 1).bool()
            assert torch.equal(got, want), (h, k)
            h += 1
    assert A.layout_density(lay) == pytest.approx(1 / n)


def test_blockbert_pads_never_truncates():
    cfg = A.BlockBERTSparsityConfig(num_heads=4, num_blocks=3, head_assignment="2:1:1", block=16)
    assert cfg.padded_length(100) == 144 and cfg.padded_length(144) == 144
    with pytest.raises(ValueError, match="padded_length"):
        cfg.make_layout(100)
    with pytest.raises(ValueError, match="summing to num_heads"):
        A.BlockBERTSparsityConfig(num_heads=12, num_blocks=2, head_assignment="10:1")
    with pytest.raises(ValueError, match="num_blocks=2"):
        A.BlockBERTSparsityConfig(num_heads=12, num_blocks=2, head_assignment="8:2:2")


def test_from_ds_config_roundtrip_and_errors():
    ds = {
        "mode": "fixed",
        "block": 16,
        "different_layout_per_head": True,
        "num_local_blocks": 4,
        "num_global_blocks": 1,
        "attention": "bidirectional",
        "horizontal_global_attention": False,
        "num_different_global_patterns": 4,
    }
    cfg = A.from_ds_config(ds, num_heads=4)
    assert isinstance(cfg, A.FixedSparsityConfig) and cfg.num_different_global_patterns == 4
    assert A.from_ds_config(cfg.to_dict(), num_heads=4) == cfg
    # DeepSpeed's full default block for another mode carries keys this mode ignores: accepted
    assert isinstance(A.from_ds_config({"mode": "dense", "block": 16, "num_local_blocks": 4}, 2), A.DenseSparsityConfig)
    bb = A.from_ds_config({"mode": "blockbert", "num_blocks": 3, "head_assignment": "8:2:2", "block": 32}, 12)
    assert A.from_ds_config(bb.to_dict(), 12) == bb
    with pytest.raises(ValueError, match="num_lcoal_blocks"):
        A.from_ds_config({"mode": "fixed", "num_lcoal_blocks": 4}, 2)
    with pytest.raises(ValueError, match="num_local_blocks"):
        A.from_ds_config({"mode": "blockbert", "num_blocks": 2, "head_assignment": "1:1", "num_local_blocks": 4}, 2)
    with pytest.raises(NotImplementedError, match="sparse_attention mode"):
        A.from_ds_config({"mode": "triangle"}, 2)


@pytest.mark.parametrize("mode", sorted(set(A.layouts.BLOCK_LAYOUTS) - A.layouts.DEEPSPEED_MODES))
def test_modes_deepspeed_never_had_refuse_keys_they_do_not_take(mode):
    """Only DeepSpeed's own modes tolerate (and ignore) DeepSpeed's other keys; a new mode takes its parameters."""
    unused = sorted(A.layouts._OLD_DS_KEYS - A.layouts.accepted_keys(A.layouts.BLOCK_LAYOUTS[mode]))
    with pytest.raises(ValueError, match=unused[0]):
        A.from_ds_config({"mode": mode, unused[0]: 1}, 4)


def test_dilated_sliding_window_layout():
    """Block i attends i + k * dilation (|k| <= w // 2, or the past w blocks when unidirectional), cut at the edges;
    its ds_config keys come from its constructor."""
    from model.attention.layouts import DilatedSlidingWindowSparsityConfig, accepted_keys

    lay = DilatedSlidingWindowSparsityConfig(2, block=16, num_sliding_window_blocks=3, dilation=2).make_layout(128)
    want = torch.zeros(8, 8, dtype=torch.int64)
    for i in range(8):
        for j in (i - 2, i, i + 2):
            if 0 <= j < 8:
                want[i, j] = 1
    assert torch.equal(lay[0], want) and torch.equal(lay[1], want)
    uni = DilatedSlidingWindowSparsityConfig(
        1, block=16, num_sliding_window_blocks=3, dilation=3, attention="unidirectional"
    ).make_layout(128)[0]
    assert uni[7].nonzero().flatten().tolist() == [1, 4, 7] and uni[0].nonzero().flatten().tolist() == [0]
    assert A.from_ds_config({"mode": "dilated_local", "dilation": 3}, 4).dilation == 3
    assert accepted_keys(DilatedSlidingWindowSparsityConfig) == {
        "mode",
        "block",
        "num_sliding_window_blocks",
        "dilation",
        "attention",
        "seed",
    }
    with pytest.raises(ValueError, match="dilation"):
        DilatedSlidingWindowSparsityConfig(4, dilation=0)
