"""The trainer's metrics part alone (pretrain/metrics.py) on a real one-rank process group: one log interval's
record (mean loss, throughput from the window, TFLOP/s and MFU from model.flops, memory), the console line, the
JSON-lines record and the TensorBoard scalars (read back with TensorBoard's own reader), validation records, and the
fp16 loss scale and a trainer-kept gradient norm. The engine is a stand-in for the four numbers it is asked for."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from model.config import ModelConfig
from model.flops import model_flops_per_token
from pretrain.args import parse_args
from pretrain.metrics import LogWindow, MetricsLogger, log_line, throughput_for
from pretrain.stragglers import RankTimer
from tests.one_rank import one_rank_group


class Engine:
    """The numbers a log interval reads of DeepSpeed's engine."""

    skipped_steps = 3
    module = torch.nn.Linear(2, 2)  # no mask statistics

    def get_global_grad_norm(self):
        return torch.tensor(0.75)

    def _get_optimizer_loss_scale(self):
        return 1024.0


def logger(tmp_path, info, *flags: str, precision: str = "fp32", own_grad_norm: bool = False):
    run = parse_args(
        ["--data-path", "wiki", "--train-iters", "8", "--micro-batch-size", "2", "--seq-length", "64",
         "--log-json", str(tmp_path / "log.jsonl"), "--tensorboard-dir", str(tmp_path / "tb"), *flags]
    )  # fmt: skip
    said: list[str] = []
    config = ModelConfig.preset("tiny", vocab_size=64)
    throughput = throughput_for(config, run.data, info.device, precision, run.logging.peak_tflops, 1, said.append)
    ds = SimpleNamespace(precision=precision, zero_stage=1)
    timer = RankTimer(info.device)
    return MetricsLogger(run, ds, info, Engine(), throughput, timer, ["here"], 8, own_grad_norm), config, said


def test_a_log_interval_writes_one_record_to_the_console_json_and_tensorboard(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with one_rank_group(tmp_path) as info:
        metrics, config, said = logger(tmp_path, info, "--peak-tflops", "10")
        fpt = model_flops_per_token(config, 64, 0.15)
        assert said == [
            f"model FLOPs per real token {fpt:.4g} (padding excluded); TFLOP/s per GPU logged; "
            "MFU against 10 TFLOP/s per GPU (--peak-tflops)"
        ]
        window = LogWindow()
        for _ in range(4):
            window.add({"tokens": 500, "samples": 4})
        step = {"loss_sum": torch.tensor(2.5, dtype=torch.float64), "lr": 1e-4, "samples": 4, "aux_loss": None}
        rec = metrics.log(step, window, 4, 16)
        metrics.log_eval({"loss": 2.0, "perplexity": math.exp(2.0)}, 4)
        metrics.close()
        metrics.close()  # safe twice
    tokens_per_s = rec["tokens_per_s"]
    assert rec["loss"] == 2.5 and rec["grad_norm"] == 0.75 and rec["skipped_steps"] == 3 and rec["loss_scale"] is None
    assert rec["consumed_samples"] == 16 and rec["samples_per_s"] == pytest.approx(tokens_per_s * 16 / 2000)
    assert rec["tflops_per_gpu"] == pytest.approx(tokens_per_s * fpt / 1e12)
    assert rec["mfu"] == pytest.approx(rec["tflops_per_gpu"] / 10.0)
    assert "global_batch_size" not in rec and "straggler_rank" not in rec
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "[pretrain] " + log_line(rec, 8),
        "[pretrain] validation at iteration 4: loss 2.000000 | perplexity " + f"{math.exp(2.0):.6f}",
    ]
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert lines == [rec, {"iteration": 4, "valid": {"loss": 2.0, "perplexity": math.exp(2.0)}}]
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {f"train/{k}" for k, v in rec.items() if k != "iteration" and v is not None} | {"train/perplexity"}
    assert tags == expected | {"valid/loss", "valid/perplexity"}
    (loss,) = events.Scalars("train/loss")
    assert (loss.step, loss.value) == (4, 2.5)
    (ppl,) = events.Scalars("train/perplexity")
    assert ppl.value == pytest.approx(math.exp(2.5), rel=1e-6)


def test_fp16_logs_the_loss_scale_and_a_trainer_clipped_run_its_own_norm(tmp_path, capsys):
    with one_rank_group(tmp_path) as info:
        metrics, _, _ = logger(tmp_path, info, precision="fp16", own_grad_norm=True)
        window = LogWindow()
        window.add({"tokens": 100, "samples": 4})
        step = {"loss_sum": torch.tensor(1.0, dtype=torch.float64), "lr": 1e-4, "samples": 4,
                "aux_loss": torch.tensor(0.25, dtype=torch.float64)}  # fmt: skip
        rec = metrics.log(step, window, 1, 4, grad_norm=torch.tensor(2.0))
        metrics.close()
    assert (rec["loss_scale"], rec["grad_norm"], rec["aux_loss"], rec["mfu"]) == (1024.0, 2.0, 0.25, None)
    assert "loss scale 1024 | aux loss 0.25" in capsys.readouterr().out
