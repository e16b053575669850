"""What the training log says: the gradient norm in every ZeRO stage (ZeRO-0 fp32 included, where DeepSpeed does not
report the norm it clips with), and a stdout line that prints only what exists, formatted."""

from __future__ import annotations

import math

import pytest

from pretrain.metrics import log_line
from tests import train_utils as tu


@pytest.mark.timeout(300)
def test_zero0_fp32_logs_the_same_grad_norm_and_clips_as_zero1(tmp_path):
    """ZeRO-0 fp32: the trainer clips (pretrain/parallelize.py clip_gradients); ZeRO-1: DeepSpeed's optimizer does.
    With a bound every step exceeds, the clipped updates, hence the later norms and losses, agree."""
    tu.prepare(tmp_path)
    norms, losses = {}, {}
    for cfg in ("zero0_fp32.json", "zero1_fp32.json"):
        log = tmp_path / f"{cfg}.jsonl"
        args = tu.train_args(tmp_path, cfg, 3, "--log-json", str(log), "--clip-grad", str(CLIP), global_batch=4)
        p = tu.launch("python", args)
        assert p.returncode == 0, p.stdout[-3000:]
        norms[cfg] = [r["grad_norm"] for r in tu.train_records(log)]
        losses[cfg] = [r["loss"] for r in tu.train_records(log)]
        assert "grad norm None" not in p.stdout and "loss scale" not in p.stdout
    assert all(n is not None and math.isfinite(n) and n > CLIP for n in norms["zero0_fp32.json"])  # every step clips
    # same seed, data and model: the pre-clipping norms agree (DeepSpeed's ZeRO-1 optimizer vs ours)
    assert norms["zero0_fp32.json"] == pytest.approx(norms["zero1_fp32.json"], rel=1e-4)
    assert losses["zero0_fp32.json"] == pytest.approx(losses["zero1_fp32.json"], rel=1e-5)


def test_clipping_moves_to_the_trainer_only_where_deepspeed_loops_over_the_tensors(tmp_path):
    """ZeRO-0 without DeepSpeed's bf16/fp16 optimizer: the bound leaves the DeepSpeed config for the trainer."""
    from pretrain.ds_config import apply_clip_grad, read_ds_config

    for name, trainer in (("zero0_fp32.json", True), ("zero0_bf16_autocast.json", True), ("zero0_bf16.json", False)):
        ds = read_ds_config(tu.REPO / "ds_configs" / name)
        apply_clip_grad(ds, 0.5)
        assert ds.trainer_clips == trainer, name
        assert (ds.clip_grad, ds.config["gradient_clipping"]) == ((0.5, 0.0) if trainer else (0.0, 0.5)), name
        ds = read_ds_config(tu.REPO / "ds_configs" / name)
        apply_clip_grad(ds, None)  # no --clip-grad: DeepSpeed's default bound (1.0) is kept, applied by the trainer
        assert (ds.clip_grad, ds.config.get("gradient_clipping")) == ((1.0, 0.0) if trainer else (0.0, None)), name
    ds = read_ds_config(tu.REPO / "ds_configs" / "zero1_fp32.json")
    apply_clip_grad(ds, 0.5)
    assert not ds.trainer_clips and ds.config["gradient_clipping"] == 0.5


#: far below the tiny model's gradient norms, so every step is clipped
CLIP = 0.01


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


@pytest.mark.timeout(300)
def test_log_reports_tflops_per_gpu_and_mfu_from_the_model_flops(tmp_path):
    import json

    from model.config import ModelConfig
    from model.flops import model_flops_per_token

    tu.prepare(tmp_path)
    log, tb = tmp_path / "log.jsonl", tmp_path / "tb"
    extra = ("--log-json", str(log), "--peak-tflops", "0.25", "--tensorboard-dir", str(tb))
    p = tu.launch("python", tu.train_args(tmp_path, "zero1_fp32.json", 3, *extra, global_batch=2))
    assert p.returncode == 0, p.stdout[-3000:]
    records = tu.train_records(log)
    cfg = ModelConfig.from_dict(json.loads((tmp_path / "model.json").read_text()))
    per_token = model_flops_per_token(cfg, 64, 0.15)  # train_args' --seq-length, the default --mask-prob
    assert len(records) == 3
    for r in records:  # real tokens/s (all ranks) x FLOPs per token / ranks; MFU against --peak-tflops
        assert r["tflops_per_gpu"] == pytest.approx(per_token * r["tokens_per_s"] / 1e12, rel=1e-12)
        assert r["mfu"] == pytest.approx(r["tflops_per_gpu"] / 0.25, rel=1e-12)
    assert f"model FLOPs per real token {per_token:.4g}" in p.stdout and "MFU against 0.25 TFLOP/s" in p.stdout
    assert f"TFLOP/s/GPU {records[-1]['tflops_per_gpu']:.3g} | MFU" in p.stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(tb)).Reload().Tags()["scalars"]
    assert "train/tflops_per_gpu" in scalars and "train/mfu" in scalars


def test_log_line_prints_tflops_and_mfu_when_known():
    rec = {"iteration": 1, "loss": 1.0, "lr": 1e-4, "skipped_steps": 0, "memory": 1.0, "tflops_per_gpu": 123.456}
    assert "| TFLOP/s/GPU 123 | mem" in log_line(rec, 2) and "MFU" not in log_line(rec, 2)
    assert "| TFLOP/s/GPU 123 | MFU 12.5% | mem" in log_line(dict(rec, mfu=0.1249), 2)
