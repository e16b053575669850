"""Free head size (low-rank-bottleneck paper): Q/K/V project to heads x head_size, the output projection back to
hidden, independent of hidden / heads, with every kernel (parity with dense on loss and every parameter's grad)."""

from __future__ import annotations

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import ModelConfig
from tests.registry_cases import CPU_TRAINING_KERNELS, OTHER_KERNELS, REFERENCE

LAYOUTS = {
    "full": None,
    "blockbert": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 8},
    "bigbird": {"mode": "bigbird", "block": 8, "num_random_blocks": 1},
}


def _model(kernel: str, head_size: int | None, sparsity, hidden: int = 64) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(
        ModelConfig.preset(
            "tiny",
            hidden_size=hidden,
            head_size=head_size,
            max_position_embeddings=64,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            attention={"kernel": kernel, "sparsity": sparsity},
        )
    )


def test_shapes_and_default():
    m = _model("dense", 40, None, hidden=62)  # 62 is not divisible by 4 heads: a free head size makes it valid
    att = m.bert.encoder.layers[0].attention
    assert att.qkv.weight.shape == (3 * 4 * 40, 62) and att.out_proj.weight.shape == (62, 4 * 40)
    with pytest.raises(ValueError, match="head_size"):
        ModelConfig.preset("tiny", hidden_size=62)
    a, b = _model("dense", None, None), _model("dense", 16, None)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("head_size", [8, 40])
def test_every_kernel_matches_dense(head_size, layout):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (2, 48), generator=g)
    am = torch.ones_like(ids)
    am[1, 37:] = 0
    labels = ids.masked_fill(torch.rand(ids.shape, generator=g) > 0.3, -100)
    res = {}
    for kernel in [REFERENCE, *CPU_TRAINING_KERNELS]:
        m = _model(kernel, head_size, LAYOUTS[layout])
        out = m(ids, am, labels=labels)
        out.loss.backward()
        res[kernel] = (out.loss, {n: p.grad for n, p in m.named_parameters()})
    for kernel in CPU_TRAINING_KERNELS:
        torch.testing.assert_close(res[kernel][0], res[REFERENCE][0], atol=1e-5, rtol=1e-5)
        for n, gd in res[REFERENCE][1].items():
            torch.testing.assert_close(res[kernel][1][n], gd, atol=1e-5, rtol=1e-5, msg=f"{kernel} {n}")
    dense = _model(REFERENCE, head_size, LAYOUTS[layout]).eval()
    for kernel in OTHER_KERNELS:  # inference parity for every kernel, including those without a CPU backward
        other = _model(kernel, head_size, LAYOUTS[layout]).eval()
        with torch.no_grad():
            torch.testing.assert_close(other(ids, am).logits, dense(ids, am).logits, atol=1e-5, rtol=1e-5, msg=kernel)
