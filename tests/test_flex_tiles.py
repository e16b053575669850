"""FlexAttention's per-forward costs that CPU counts can pin down exactly (issue 41, items 1 and 5): every layout
family builds at most one BlockMask per forward in a multi-layer model (the layers share it), and the sequence
FlexAttention sees is a multiple of its tile (else inductor compiles with ``IS_DIVISIBLE=False``: bounds checks on
every load). Both are counted at the flex call, on CPU, for every registered block layout family."""

from __future__ import annotations

import pytest
import torch

from model import attention as A
from model.attention.kernels import flex
from model.attention.kernels.flex import FlexPlan
from model.attention.layouts import accepted_keys
from model.bert import BertModel
from model.config import ModelConfig
from tests.registry_cases import LAYOUT_EXAMPLES

H = 4
FAMILIES = {"full": lambda: None, **{name: (lambda make=make: make(H)) for name, make in LAYOUT_EXAMPLES.items()}}
"""Every registered layout family (tests/registry_cases.py fails when one lacks an example), plus full attention."""


def _model(sparsity: dict | None, layers: int = 4, n: int = 256) -> BertModel:
    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        "tiny",
        vocab_size=50,
        num_layers=layers,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        max_position_embeddings=n,
        attention={"kernel": "flex", "sparsity": sparsity},
    )
    return BertModel(cfg).eval()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_block_mask_per_forward_in_a_four_layer_model(monkeypatch, family):
    """Padded rows, 4 layers, one layout: one BlockMask per forward (BlockBERT n=3, whose 48-token unit pads every
    call, built 4, one per layer: the padding made a new key-padding tensor in each layer and the cache, keyed on
    tensor identity, missed)."""
    cfg = FAMILIES[family]()
    # (to_dict() of the sliding-window modes names different_layout_per_head, which their constructors refuse)
    model = _model(None if cfg is None else {k: v for k, v in cfg.to_dict().items() if k in accepted_keys(type(cfg))})
    builds = []
    real = FlexPlan.build_block_mask
    monkeypatch.setattr(FlexPlan, "build_block_mask", lambda self, *a, **k: builds.append(1) or real(self, *a, **k))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (2, 256), generator=g)
    mask = torch.ones(2, 256, dtype=torch.long)
    mask[1, 150:] = 0  # a padded row
    with torch.no_grad():
        model(ids, mask)  # the plans (one per layer, each with its layout-only mask) are made here
        for batch_mask in (mask.clone(), mask.clone()):  # new batches: each builds its padding mask once
            builds.clear()
            model(torch.randint(5, 50, (2, 256), generator=g), batch_mask)
            assert len(builds) <= 1, f"{family}: {len(builds)} BlockMask builds in one 4-layer forward"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [512, 528, 1000, 4096])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_flex_sees_a_multiple_of_its_tile(monkeypatch, family, n):
    """The q/k/v length at the FlexAttention call and the BlockMask's sequence lengths are multiples of the
    BlockMask's tiles, for every family and N (the flex call is recorded, not run: N=4096 costs only the mask)."""
    seen = []

    def record(device_type, bucket):
        def call(q, k, v, score_mod, block_mask, scale, opts=None):
            seen.append((q.shape[2], k.shape[2], block_mask.BLOCK_SIZE, block_mask.seq_lengths))
            return torch.zeros_like(q)

        return call

    monkeypatch.setattr(flex, "_flex_fn", record)
    cfg = FAMILIES[family]()
    mod = A.BlockSparseAttention(cfg, kernel="flex", max_seq_length=4096)
    q = torch.zeros(1, H, n, 8)
    kpm = torch.ones(1, n, dtype=torch.bool)
    kpm[0, n - 5 :] = False
    with torch.no_grad():
        out = mod(q, q, q, kpm)
    assert out.shape == q.shape
    (nq, nk, (tq, tk), (sq, sk)) = seen[0]
    assert nq % tq == 0 and nk % tk == 0 and nq % 128 == 0, (family, n, nq, (tq, tk))
    assert (sq, sk) == (nq, nk)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_closed_form_mask_mod_equals_the_layout_table(family):
    """Where the plan computes membership from positions (BlockBERT's cyclic chunks, sliding-window bands), the
    mask_mod equals the layout table's on every real row of the tile-padded sequence (N=300, padded keys
    included); the table families keep the table."""
    cfg = FAMILIES[family]()
    mod = A.BlockSparseAttention(cfg, kernel="flex", max_seq_length=512)
    n_pad = 300 if cfg is None else cfg.padded_length(300)
    plan = mod._plan(n_pad, torch.device("cpu"))
    expected = {"blockbert_n2": "cyclic", "blockbert_n3": "cyclic", "local_uni": "band", "local_bi": "band"}
    assert (None if plan.form is None else plan.form.kind) == expected.get(family)
    if plan.form is None:
        return
    R = plan.run_len
    i = torch.arange(R)
    h = torch.arange(H)[:, None, None]
    closed = flex.mask_mod_for(plan.layout_HMM, plan.block, form=plan.form)(0, h, i[None, :, None], i[None, None, :])
    table = flex.mask_mod_for(plan.layout_HMM, plan.block)(0, h, i[None, :, None], i[None, None, :])
    real = i < n_pad  # padded rows are cut from the output: only the real rows must agree (every key included)
    closed = closed.expand_as(table)  # (a band is the same for every head)
    assert torch.equal(closed[:, real], table[:, real])
    assert not closed[:, real][..., ~real].any()  # no real row reaches a padded key


def test_64_key_tiles_where_64_token_columns_half_fill_128_key_tiles(monkeypatch):
    """Fixed at block 64 (64-token global columns) gets 128 x 64 tiles and no partial tile is left; BlockBERT n=2
    (256-token chunks) keeps 128 x 128; and on a GPU whose compiled backward has no 64-key tile config (torch's
    H100/H200 default for head dim 64: 128-key tiles) a training call keeps 128 x 128."""
    from types import SimpleNamespace

    from model.attention.kernels.flex_mask import partial_tiles

    fixed = A.FixedSparsityConfig(H, block=64)
    plan = A.BlockSparseAttention(fixed, kernel="flex", max_seq_length=1024)._plan(1024, torch.device("cpu"))
    assert plan.kv_tile == 64 and plan.layout_mask(64).BLOCK_SIZE == (128, 64)
    assert partial_tiles(plan.block_mask)[0] > 0 and partial_tiles(plan.layout_mask(64))[0] == 0
    bb = A.BlockBERTSparsityConfig(H, num_blocks=2, head_assignment="3:1", block=16)
    assert A.BlockSparseAttention(bb, kernel="flex", max_seq_length=512)._plan(512, torch.device("cpu")).kv_tile is None
    import torch._inductor.choices as choices

    sm90 = [SimpleNamespace(block_m1=64, block_n1=128, block_m2=128, block_n2=64)]
    monkeypatch.setattr(choices.InductorChoices, "get_flex_attention_bwd_configs", lambda self, *a: sm90)
    assert not flex.kv_tile_trains(64, 64, torch.bfloat16, torch.device("cuda", 0))
    sm8x = [SimpleNamespace(block_m1=64, block_n1=64, block_m2=64, block_n2=64)]
    monkeypatch.setattr(choices.InductorChoices, "get_flex_attention_bwd_configs", lambda self, *a: sm8x)
    assert flex.kv_tile_trains(64, 64, torch.bfloat16, torch.device("cuda", 0))
