"""The tools that run a model outside DeepSpeed (fine-tuning, fill-mask) on every available device and precision:
the model and its outputs live on the requested device, and the results agree with the fp32 CPU run. Device
agnostic: CPU always, CUDA where there is a GPU (skipped with the reason otherwise)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.test_finetune import DATA, _export, _tokenizer
from tools import fill_mask as fm
from tools import finetune as ft
from tools.device import DeviceError, resolve_device, resolve_precision

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("device")
    tok = _tokenizer(tmp / "tok")
    return _export(tmp / "model", tok)


def _finetune(model, out, device, precision):
    assert (
        ft.main(
            [
                "--model",
                str(model),
                "--task",
                "classification",
                "--train",
                str(DATA / "cls_train.jsonl"),
                "--dev",
                str(DATA / "cls_dev.jsonl"),
                "--output-dir",
                str(out),
                "--max-steps",
                "3",
                "--batch-size",
                "8",
                "--lr",
                "1e-3",
                "--device",
                device,
                "--precision",
                precision,
            ]
        )
        == 0
    )
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("device", DEVICES)
def test_finetune_runs_on_the_device_and_agrees_with_fp32_cpu(export, tmp_path, device, precision):
    ref = _finetune(export, tmp_path / "ref", "cpu", "fp32")
    got = _finetune(export, tmp_path / "got", device, precision)
    assert got["device"].startswith(device) and got["precision"] == precision
    tol = 1e-5 if precision == "fp32" else 3e-2
    assert got["train_loss_first"] == pytest.approx(ref["train_loss_first"], rel=tol, abs=tol)
    assert got["steps"] == 3 and 0.0 <= got["accuracy"] <= 100.0  # percent


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_fill_mask_on_the_device_matches_fp32_cpu(export, device, precision):
    sentences = ["the river [MASK] through the town .", "a [MASK] of bread ."]
    ref = fm.fill_mask(str(export), sentences, top_k=3, device="cpu", precision="fp32")
    got = fm.fill_mask(str(export), sentences, top_k=3, device=device, precision=precision)
    for r, g in zip(ref, got):
        if precision == "fp32":
            assert [t for t, _ in g] == [t for t, _ in r]
        assert [p for _, p in g] == pytest.approx([p for _, p in r], abs=2e-2 if precision != "fp32" else 1e-5)


def test_model_lands_on_the_requested_device(export):
    from transformers import pipeline

    dev = resolve_device(None)
    assert dev.type == ("cuda" if torch.cuda.is_available() else "cpu")
    fill = pipeline("fill-mask", model=str(export), trust_remote_code=True, device=dev)
    assert next(fill.model.parameters()).device.type == dev.type


def test_impossible_choices_are_refused_naming_the_flag(monkeypatch):
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="--device cuda: no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(DeviceError, match="--device tpu"):
        resolve_device("tpu")
    with pytest.raises(DeviceError, match="--precision must be one of"):
        resolve_precision("fp8", torch.device("cpu"))
    assert resolve_precision("auto", torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    assert resolve_precision("auto", torch.device("cuda")) == torch.float16
    with pytest.raises(DeviceError, match="--precision bf16: Tesla V100 .*7.0.* no bf16"):
        resolve_precision("bf16", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert resolve_precision("auto", torch.device("cuda")) == torch.bfloat16
