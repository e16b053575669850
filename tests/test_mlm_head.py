"""The MLM head of issue #47 item 5: the decoder GEMMs on a vocabulary padded to a multiple of 64 whose padded logits
never reach a loss, argmax or output; the chunked, recomputed cross-entropy against the plain one (loss, gradients,
counts; fp32 and bf16); what a training forward keeps for the backward; the slots per row sized to the mask rate."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.attention.steps import cpu_allocations
from data_pipeline.masking import binomial_above, derived_max_predictions, six_sigma_slots
from model.bert import BertForPreTraining
from model.config import ModelConfig
from pretrain.checkpoint import architecture_differences
from tests import train_utils as tu

V = 101  # padded to 128 by default


def _model(**kw) -> BertForPreTraining:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=V, hidden_dropout=0.0, attention_dropout=0.0, **kw)
    return BertForPreTraining(cfg)


def _batch(B: int = 3, N: int = 24, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, N), generator=g)
    labels = torch.where(torch.rand(B, N, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    labels[0, :2] = ids[0, :2]  # every row has labels, and row 0 has the most
    return ids, labels


class _MatmulShapes(TorchDispatchMode):
    """Records the output shape of every matmul (mm / addmm / bmm) that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.shapes.append(tuple(out.shape))
        return out


def test_config_field_is_validated_and_padding_rounds_up():
    assert ModelConfig(vocab_size=30522).padded_vocab_size == 30528  # default multiple 64
    assert ModelConfig(vocab_size=30522, pad_vocab_multiple=128).padded_vocab_size == 30592  # Megatron's
    assert ModelConfig(vocab_size=30522, pad_vocab_multiple=1).padded_vocab_size == 30522
    assert ModelConfig(vocab_size=128).padded_vocab_size == 128
    for bad in (0, -64, True, 2.5):
        with pytest.raises(ValueError, match="--make-vocab-size-divisible-by"):
            ModelConfig(pad_vocab_multiple=bad)
    # it pads inside the forward only: a checkpoint of another padding (or from before the field) loads and resumes
    assert architecture_differences({"vocab_size": V}, {"vocab_size": V, "pad_vocab_multiple": 64}) == []


def test_decoder_gemms_run_on_the_padded_vocabulary():
    """Every decoder matmul (forward and backward) is 128 wide or deep, none 101 (the contract main fails), and
    parameters and the logits keep the real vocabulary."""
    model = _model()
    ids, labels = _batch()
    with _MatmulShapes() as mode:
        model(ids, labels=labels, max_predictions=16).loss.backward()
    shapes = mode.shapes
    assert any(128 in s for s in shapes) and not any(V in s for s in shapes), shapes
    assert model.bert.embeddings.word_embeddings.weight.shape[0] == V and model.cls.bias.shape == (V,)
    assert model(ids).logits.shape == (3, 24, V)
    with _MatmulShapes() as mode:
        _model(pad_vocab_multiple=1)(ids, labels=labels).loss.backward()
    assert any(V in s for s in mode.shapes)  # unpadded: the 101-wide GEMMs of main


def test_padded_logits_never_win():
    """With every real logit far below zero, a padded logit (0) would win every argmax and dominate the loss if it
    were not cut off: outputs, counts and loss equal the unpadded model's."""
    padded, plain = _model(), _model(pad_vocab_multiple=1)
    plain.load_state_dict(padded.state_dict())  # the same parameters: padding is no state
    with torch.no_grad():
        for m in (padded, plain):
            m.cls.bias.fill_(-1e4)
            m.cls.bias[7] = -5e3  # one real winner
    ids, labels = _batch()
    for kwargs in ({}, {"max_predictions": 16}):
        for return_logits in (False, True):
            a = padded(ids, labels=labels, return_logits=return_logits, **kwargs)
            b = plain(ids, labels=labels, return_logits=return_logits, **kwargs)
            torch.testing.assert_close(a.loss, b.loss)
            assert int(a.mlm_correct) == int(b.mlm_correct) == int((labels == 7).sum())
            if return_logits:
                assert a.logits.shape[-1] == V and int(a.logits.argmax(-1).max()) < V
    assert int(padded(ids).logits.argmax(-1).max()) == 7


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _step(model, ids, labels, return_logits: bool, dtype: torch.dtype, **kwargs):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        out = model(ids, labels=labels, return_logits=return_logits, **kwargs)
    out.loss.backward()
    return out, _grads(model)


@pytest.mark.parametrize("static", [False, True])
def test_chunked_loss_equals_the_plain_loss(static):
    """The chunked loss (2 rows per chunk: many chunks, a ragged last one) against the plain loss over whole logits:
    loss, every gradient, correct and count. fp32: equal to rounding. bf16 autocast (the static gather, the
    trainer's path): each chunk's weight gradient is rounded to bf16 before the chunks are summed, so the chunked
    gradients are compared with the fp32 reference and may be off by no more than 1.5x the plain bf16 path's own
    error (plus 1e-3 of the gradient's scale)."""
    model = _model()
    model.mlm_chunk_rows = 2
    ids, labels = _batch()
    kwargs = {"max_predictions": 16} if static else {}
    plain, g_plain = _step(model, ids, labels, True, torch.float32, **kwargs)
    chunked, g_chunked = _step(model, ids, labels, False, torch.float32, **kwargs)
    assert chunked.logits is None and plain.logits is not None
    assert int(chunked.mlm_count) == int(plain.mlm_count) == int((labels != -100).sum())
    assert int(chunked.mlm_correct) == int(plain.mlm_correct)
    torch.testing.assert_close(chunked.loss, plain.loss, rtol=1e-5, atol=1e-6)
    assert g_plain.keys() == g_chunked.keys()
    for name in g_plain:
        torch.testing.assert_close(g_chunked[name], g_plain[name], rtol=1e-5, atol=1e-6, msg=name)
    if not static:
        return  # bf16 on the trainer's path only (CPU bf16 is slow)
    plain16, g_plain16 = _step(model, ids, labels, True, torch.bfloat16, **kwargs)
    chunked16, g_chunked16 = _step(model, ids, labels, False, torch.bfloat16, **kwargs)
    assert int(chunked16.mlm_correct) == int(plain16.mlm_correct)
    torch.testing.assert_close(chunked16.loss, plain16.loss, rtol=1e-2, atol=1e-3)
    for name, ref in g_plain.items():
        err_plain = (g_plain16[name] - ref).abs().max()
        err_chunked = (g_chunked16[name] - ref).abs().max()
        assert err_chunked <= 1.5 * err_plain + 1e-3 * ref.abs().max(), (name, err_chunked, err_plain)


def test_chunked_loss_keeps_no_logits_for_the_backward():
    """What a training forward leaves allocated (the backward's activations): the plain loss keeps the fp32
    log-softmax of the logits ([T, V], 2 GB at bert-base N=512 batch 128), the chunked one nothing of that size (the
    contract main fails)."""
    big_v = 2048
    cfg = ModelConfig.preset("tiny", vocab_size=big_v, hidden_dropout=0.0, attention_dropout=0.0)
    model = BertForPreTraining(cfg)
    model.mlm_chunk_rows = 16
    ids = torch.randint(5, big_v, (2, 64), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()  # T = 128 predicted rows
    T = labels.numel()
    kept = {}
    for return_logits in (True, False):
        model(ids, labels=labels, max_predictions=64, return_logits=return_logits).loss.backward()  # warm up
        model.zero_grad(set_to_none=True)
        kept[return_logits], _, loss = cpu_allocations(
            lambda: model(ids, labels=labels, max_predictions=64, return_logits=return_logits).loss
        )
        loss.backward()
    logits_fp32 = T * big_v * 4
    assert kept[True] - kept[False] >= logits_fp32, kept
    assert kept[False] < logits_fp32, kept


def test_slots_are_sized_to_the_mask_rate():
    """120 slots per row at N=512 with p=0.15 (128 before), the smallest multiple of 8 that the binomial count of
    chosen tokens exceeds with probability at most 1e-6; whole-word masking keeps the wider bound."""
    assert derived_max_predictions(512, 0.15) == 120 and derived_max_predictions(128, 0.15) == 48
    assert derived_max_predictions(512, 0.15, whole_word=True) == six_sigma_slots(512, 0.15) == 128
    assert six_sigma_slots(128, 0.15) == 48 and six_sigma_slots(16, 0.15) == 16  # at most N
    for n, p in ((512, 0.15), (4096, 0.15), (512, 0.3)):
        k = derived_max_predictions(n, p)
        assert binomial_above(n, p, k) <= 1e-6 < binomial_above(n, p, k - 8)


def test_masker_keeps_rows_within_the_derived_slots_and_the_model_refuses_more():
    """The masker (uncapped) against the derived slots over 4,000 rows of N=512: rows above the cap are as rare as
    the bound says (expected 0.004 rows; at most 1 allowed), and a row with more labels than slots is an error in the
    model, never a silent loss of labels."""
    import numpy as np

    from data_pipeline.masking import MaskingConfig, MLMMasker

    masker = MLMMasker(MaskingConfig(mask_prob=0.15), 205, 4, np.arange(5))
    rows = np.random.default_rng(0).integers(5, 205, (4000, 512))
    _, labels = masker(rows, np.arange(4000, dtype=np.uint64))
    counts = (labels != -100).sum(1)
    k = derived_max_predictions(512, 0.15)
    assert (counts > k).sum() <= 1 and 70 < counts.mean() < 84
    model = _model()
    ids, labels_t = _batch()
    over = int((labels_t != -100).sum(1).max())
    with pytest.raises(RuntimeError, match="more labelled positions than max_predictions"):
        model(ids, labels=labels_t, max_predictions=over - 1)


def test_flop_counter_sees_the_padding_and_the_recompute():
    """A chunked training step runs the decoder GEMM three times per slot row (forward, recompute, and the two
    backward GEMMs: 4 x 2 V_pad h FLOPs) where the plain one runs it three times (3 x 2 V_pad h): the padded
    rows and the recompute are what an implementation spends, not model FLOPs (model/flops.py)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _model()
    ids, labels = _batch()
    total = {}
    for return_logits in (True, False):
        with FlopCounterMode(display=False) as counter:
            model(ids, labels=labels, max_predictions=16, return_logits=return_logits).loss.backward()
        total[return_logits] = counter.get_total_flops()
    slots, h, vp = 3 * 16, model.config.hidden_size, model.config.padded_vocab_size
    transform = 2 * slots * h * h  # the MLM transform's dense layer is recomputed too
    assert total[False] - total[True] == 2 * slots * vp * h + transform


def test_state_dict_and_config_round_trip_unchanged():
    """Padding is no state: the state dict is the unpadded model's, and the config round-trips with the field."""
    a, b = _model(), _model(pad_vocab_multiple=1)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    cfg = a.config
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg and dataclasses.asdict(cfg)["pad_vocab_multiple"] == 64


def test_zero3_runs_the_plain_loss_and_says_so():
    """Under ZeRO-3 the chunked loss would recompute the tied decoder in the backward after ZeRO-3 released its
    weight (a 1-D shard: "mat2 must be a matrix"; tests/test_resize_resume.py's ZeRO-3 cases): pretrain/parallelize.py
    switches the model to the plain loss there, with a start-up line, and leaves the chunks below stage 3. The plain
    path without ``return_logits`` gives the chunked path's loss, counts and no logits."""
    from pretrain.parallelize import apply_mlm_loss_for_zero

    model = _model()
    rows = model.mlm_chunk_rows
    assert rows > 0
    for stage in (0, 1, 2):
        assert apply_mlm_loss_for_zero(model, stage) is None and model.mlm_chunk_rows == rows
    ids, labels = _batch()
    chunked = model(ids, labels=labels, max_predictions=16)
    note = apply_mlm_loss_for_zero(model, 3)
    assert model.mlm_chunk_rows == 0 and "ZeRO-3" in note and "plain loss" in note
    assert apply_mlm_loss_for_zero(model, 3) is None  # applied already: nothing to say again
    plain = model(ids, labels=labels, max_predictions=16)
    assert plain.logits is None and chunked.logits is None
    assert int(plain.mlm_count) == int(chunked.mlm_count) and int(plain.mlm_correct) == int(chunked.mlm_correct)
    torch.testing.assert_close(plain.loss, chunked.loss, rtol=1e-5, atol=1e-6)


def test_initialize_engine_applies_the_zero3_loss_once_and_says_it(monkeypatch):
    """The plain loss's one home is initialize_engine (the trainer, benchmarks.step and comm_volume all build their
    engine there): it switches the model before DeepSpeed wraps it and hands each start-up line, the ZeRO-3 loss's and
    deepspeed_patch's, to ``say`` once (the trainer's printer); below stage 3 it says nothing of the loss.
    deepspeed.initialize is stubbed: what it does with the model is not this test's."""
    import deepspeed

    from pretrain.args import OptimConfig
    from pretrain.ds_config import read_ds_config, resolve_batch_sizes
    from pretrain.parallelize import initialize_engine
    from pretrain.schedule import schedule_settings

    class Engine:
        dp_world_size = 2  # keeps initialize_engine's one-rank ZeRO-0 shortcut out of the stub

    seen = []

    def initialize(model, **kw):
        seen.append(model.mlm_chunk_rows)
        return Engine(), None, None, None

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    for stage, chunked in ((3, False), (1, True)):
        model = _model()
        rows = model.mlm_chunk_rows
        ds = read_ds_config(tu.REPO / "ds_configs" / f"zero{stage}_fp32.json")
        resolve_batch_sizes(ds, 1, None, 1)
        lines: list[str] = []
        initialize_engine(model, ds, OptimConfig(lr=1e-4), schedule_settings(1e-4, 0.0, 1, 10, "linear"), lines.append)
        assert seen[-1] == (rows if chunked else 0)  # switched before DeepSpeed saw the model
        loss_lines = [line for line in lines if line.startswith("MLM loss:")]
        assert len(loss_lines) == (0 if chunked else 1) and all("ZeRO-3" in line for line in loss_lines)
        assert sum("DeepSpeed" in line and "ZeRO-1/2" in line for line in lines) == 1
