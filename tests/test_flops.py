"""model/flops.py's model FLOPs per token against torch's own FLOP counter over a real training step (forward +
backward) of our encoder, and the TFLOP/s / MFU arithmetic of pretrain/throughput.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.flops import layout_density, model_flops_per_token
from model.presets import blockbert
from pretrain.throughput import Throughput, device_peak_tflops, peak_tflops


def _counted(model: BertForPreTraining, B: int, N: int, cap: int, device: str = "cpu") -> float:
    """torch's FLOP count of one training step (forward + backward) with the static MLM gather of ``cap`` slots."""
    cfg = model.config
    ids = torch.randint(5, cfg.vocab_size, (B, N), device=device)
    labels = torch.full((B, N), -100, device=device)
    labels[:, 3:9] = ids[:, 3:9]
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=labels, max_predictions=cap).loss.backward()
    return counter.get_total_flops()


def _spent_by_the_head(cfg: ModelConfig, B: int, cap: int) -> float:
    """What our MLM head runs beyond the formula's head: the transform and the decoder on every slot (not only
    the labelled tokens), over the padded vocabulary, plus the chunked loss's recompute of both in the backward
    (2 (h^2 + V_pad h) per slot)."""
    h, vp = cfg.hidden_size, cfg.padded_vocab_size
    return 8 * (h * h + vp * h) * B * cap


@pytest.mark.parametrize("ffn_type", ["standard", "glu"])
def test_formula_equals_torch_flop_counter_of_a_training_step(ffn_type):
    """The measured count as a check, exactly: torch's counter = the formula without the head (encoder matmuls,
    attention at density 1; no softmax, LayerNorm or GELU FLOPs in either) + what the head spends on its slots."""
    cfg = ModelConfig.preset("tiny", attention={"kernel": "dense"}, ffn_type=ffn_type, head_size=8)
    torch.manual_seed(0)
    model = BertForPreTraining(cfg)
    B, N, cap = 3, 64, 10
    counted = _counted(model, B, N, cap)
    no_head = model_flops_per_token(cfg, N, predicted=0.0) * B * N
    assert counted == no_head + _spent_by_the_head(cfg, B, cap)


def test_formula_against_the_counter_at_bert_base():
    """bert-base, N=512, the trainer's 120 slots per row, counted on the meta device (shapes only): the formula
    (the head on the 15% labelled tokens, the real vocabulary) is 3.8% below what runs. The whole difference is the
    head's: slots (120 of 512 tokens, not 77), the 6 padded vocabulary rows, and the chunked loss's recompute."""
    cfg = ModelConfig.preset("bert-base", attention={"kernel": "dense"})
    with torch.device("meta"):
        model = BertForPreTraining(cfg)
    B, N, cap = 2, 512, 120
    counted = _counted(model, B, N, cap, device="meta")
    formula = model_flops_per_token(cfg, N, predicted=0.15) * B * N
    head = 6 * (cfg.hidden_size**2 + cfg.vocab_size * cfg.hidden_size) * 0.15 * B * N
    assert counted == formula - head + _spent_by_the_head(cfg, B, cap)
    assert 0.95 < formula / counted < 0.97  # the formula's MFU is 4% below an MFU of the FLOPs that run


def test_density_of_blockbert_layouts():
    cfg = ModelConfig.preset("tiny", attention={"kernel": "block_gather", "sparsity": blockbert(2, 4, block=16)})
    assert layout_density(cfg, 64) == 0.5
    assert layout_density(ModelConfig.preset("tiny"), 64) == 1.0


def test_peaks_and_mfu_arithmetic():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and peak_tflops("Tesla V100-PCIE-16GB") == 112.0
    assert peak_tflops("NVIDIA L40") == 181.0 and peak_tflops("NVIDIA L4") == 121.0 and peak_tflops("AMD") is None
    cpu = torch.device("cpu")
    assert device_peak_tflops(cpu, "bf16", None)[0] is None and device_peak_tflops(cpu, "fp32", 2.0) == (
        2.0,
        "--peak-tflops",
    )
    t = Throughput(flops_per_token=3e9, world_size=4, peak_tflops=100.0)
    assert t.tflops_per_gpu(8e4) == 3e9 * 8e4 / 4 / 1e12 and t.mfu(8e4) == t.tflops_per_gpu(8e4) / 100.0
    assert Throughput(3e9, 1, None).mfu(1.0) is None
