"""What the training log says: the gradient norm in every ZeRO stage (ZeRO-0 fp32 included, where DeepSpeed does not
report the norm it clips with), and a stdout line that prints only what exists, formatted."""

from __future__ import annotations

import math

import pytest

from pretrain.trainer import log_line
from tests import train_utils as tu


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_zero0_fp32_logs_the_same_grad_norm_as_zero1(tmp_path):
    tu.prepare(tmp_path)
    norms = {}
    for cfg in ("zero0_fp32.json", "zero1_fp32.json"):
        log = tmp_path / f"{cfg}.jsonl"
        p = tu.launch("python", tu.train_args(tmp_path, cfg, 3, "--log-json", str(log), global_batch=4))
        assert p.returncode == 0, p.stdout[-3000:]
        norms[cfg] = [r["grad_norm"] for r in tu.train_records(log)]
        assert "grad norm None" not in p.stdout and "loss scale" not in p.stdout
    assert all(n is not None and math.isfinite(n) and n > 0 for n in norms["zero0_fp32.json"])
    # same seed, data and model: the pre-clipping norms agree (DeepSpeed's ZeRO-1 optimizer vs ours)
    assert norms["zero0_fp32.json"] == pytest.approx(norms["zero1_fp32.json"], rel=1e-4)


def test_log_line_prints_what_exists_formatted():
    rec = {
        "iteration": 7,
        "loss": 2.123456789,
        "lr": 1e-4,
        "grad_norm": 0.123456789123,
        "loss_scale": None,
        "skipped_steps": 0,
        "tokens_per_s": 1234.56,
        "memory": 512.4,
    }
    line = log_line(rec, 10)
    assert line == (
        "iteration 7/10 | loss 2.123457 | lr 1.000e-04 | grad norm 0.1235 | skipped 0 | tokens/s 1235 | mem 512 MB"
    )
    fp16 = dict(rec, loss_scale=65536.0, grad_norm=None, aux_loss=0.5)
    assert "loss scale 65536 | aux loss 0.5 |" in log_line(fp16, 10) and "grad norm" not in log_line(fp16, 10)
