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


@pytest.mark.parametrize("ffn_type", ["standard", "glu"])
def test_formula_equals_torch_flop_counter_of_a_training_step(ffn_type):
    cfg = ModelConfig.preset("tiny", attention={"kernel": "dense"}, ffn_type=ffn_type, head_size=8)
    torch.manual_seed(0)
    model = BertForPreTraining(cfg)
    B, N, cap = 3, 64, 10
    ids = torch.randint(5, cfg.vocab_size, (B, N))
    labels = torch.full((B, N), -100)
    labels[:, 3:9] = ids[:, 3:9]
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=labels, max_predictions=cap).loss.backward()
    # the static MLM gather runs the head on cap of the N positions of every row
    assert counter.get_total_flops() == model_flops_per_token(cfg, N, predicted=cap / N) * B * N


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
