"""Every setting is honoured or refused naming it: DeepSpeed's precision spellings, a ds_config optimizer block
against the flags, DAM with another kernel, flex with attention dropout (issue 23, item 3)."""

from __future__ import annotations

import json

import pytest
import torch

from model.config import ModelConfig
from pretrain.args import ArgsError, parse_args
from pretrain.ds_config import DSConfigError, check_precision_supported, read_ds_config
from pretrain.parallelize import optimizer_from_block, param_groups
from pretrain.schedule import lr_at
from tests import train_utils as tu

BASE = ["--data-path", "x", "--vocab-file", "v", "--train-iters", "4"]


def _ds(tmp_path, **blocks):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, **blocks}))
    return path


@pytest.mark.parametrize(
    "blocks, precision, summary",
    [
        ({"bf16": {"enabled": True}}, "bf16", "bf16"),
        ({"bfloat16": {"enabled": True}}, "bf16", "bf16"),  # DeepSpeed's older spelling
        ({"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}, "bf16", "bf16 (torch_autocast)"),
        ({"torch_autocast": {"enabled": False, "dtype": "bfloat16"}}, "fp32", "fp32"),
        ({"fp16": {"enabled": True}}, "fp16", "fp16"),
        ({}, "fp32", "fp32"),
    ],
)
def test_every_precision_spelling_deepspeed_accepts_is_read_as_deepspeed_reads_it(tmp_path, blocks, precision, summary):
    ds = read_ds_config(_ds(tmp_path, **blocks))
    assert (ds.precision, ds.precision_summary) == (precision, summary)


def test_the_precision_check_sees_the_bfloat16_spelling(tmp_path, monkeypatch):
    """The hardware check used to be skipped for 'bfloat16' (read as fp32): it now refuses, naming the file."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_bf16_supported", lambda self: False)
    for blocks in ({"bfloat16": {"enabled": True}}, {"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}):
        with pytest.raises(DSConfigError, match="enables bf16"):
            check_precision_supported(read_ds_config(_ds(tmp_path, **blocks)))


@pytest.mark.parametrize(
    "blocks, match",
    [
        ({"fp16": {"enabled": "auto"}}, r"'fp16.enabled' is 'auto'.*write true or false"),
        ({"bf16": {"enabled": True}, "bfloat16": {"enabled": True}}, "old name 'bfloat16'"),
        ({"fp16": {"enabled": True}, "torch_autocast": {"enabled": True, "dtype": "bfloat16"}}, "both enabled"),
        ({"torch_autocast": {"enabled": True}}, "has no 'dtype'"),
        ({"torch_autocast": {"enabled": True, "dtype": "fp16"}}, "not supported by this trainer"),
    ],
)
def test_contradictory_or_ambiguous_precision_blocks_are_refused(tmp_path, blocks, match):
    with pytest.raises(DSConfigError, match=match):
        read_ds_config(_ds(tmp_path, **blocks))


def _optim(tmp_path, block, *flags):
    run = parse_args(["--deepspeed_config", str(_ds(tmp_path, optimizer=block))] + BASE + list(flags))
    return optimizer_from_block(read_ds_config(run.system.deepspeed_config), run.optim, run.explicit)


def test_optimizer_block_values_replace_the_flag_defaults(tmp_path):
    block = {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1, "betas": [0.9, 0.98], "eps": 1e-8}}
    optim = _optim(tmp_path, block)
    assert (optim.lr, optim.weight_decay, optim.adam_beta1, optim.adam_beta2, optim.adam_eps) == (
        3e-4,
        0.1,
        0.9,
        0.98,
        1e-8,
    )
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    groups = param_groups(model, optim.weight_decay)  # what deepspeed.initialize receives
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]  # was --weight-decay's default 0.01
    # a flag given with the same value is no conflict; a block without weight_decay keeps the flag's
    assert _optim(tmp_path, block, "--lr", "3e-4").lr == 3e-4
    assert _optim(tmp_path, {"type": "AdamW", "params": {"lr": 1e-3}}, "--weight-decay", "0.05").weight_decay == 0.05


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--weight-decay", "0.01"], r"--weight-decay 0.01 conflicts with .*optimizer.params.weight_decay = 0.1"),
        (["--lr", "1e-3"], r"--lr 0.001 conflicts with .*optimizer.params.lr = 0.0003"),
        (["--adam-beta2", "0.999"], r"--adam-beta2 0.999 conflicts with .*optimizer.params.betas"),
        (["--optimizer", "adamw"], r"--optimizer adamw conflicts with .*optimizer block"),
    ],
)
def test_a_flag_given_against_the_optimizer_block_is_refused_naming_both(tmp_path, flags, match):
    block = {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1, "betas": [0.9, 0.98]}}
    with pytest.raises(DSConfigError, match=match):
        _optim(tmp_path, block, *flags)


@pytest.mark.timeout(300)
def test_training_follows_the_optimizer_blocks_lr(tmp_path):
    data = tu.prepare(tmp_path)
    ds = json.loads((tu.REPO / "ds_configs" / "zero2_fp32.json").read_text())
    ds["optimizer"] = {"type": "AdamW", "params": {"lr": 5e-4, "weight_decay": 0.1, "torch_adam": True}}  # no op build
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    args = tu.train_args(data, "zero2_fp32.json", 4, "--log-json", str(tmp_path / "log.jsonl"))
    args = [str(tmp_path / "ds.json") if a.endswith("zero2_fp32.json") else a for a in args]
    args.remove("--lr")
    args.remove("1e-3")
    p = tu.launch("python", args)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "optimizer block's lr, weight_decay values are used" in p.stdout
    lrs = [r["lr"] for r in tu.train_records(tmp_path / "log.jsonl")]
    assert lrs == pytest.approx([lr_at(s, 5e-4, 0.0, 0, 4) for s in range(4)])  # warmup 0.2 x 4 = 0 steps


def test_dam_refuses_a_kernel_it_would_not_use():
    dam = {"pattern": "dam", "seq_len": 32}
    for kernel in ("auto", "dense"):
        ModelConfig.preset("tiny", attention={"kernel": kernel, "token_mask": dam})
    with pytest.raises(ValueError, match=r"attention.kernel 'block_gather' \(--attention-kernel\) would not be used"):
        ModelConfig.preset("tiny", attention={"kernel": "block_gather", "token_mask": dam})


def test_flex_with_attention_dropout_is_refused_when_the_config_is_parsed():
    with pytest.raises(
        ValueError, match=r"'flex' \(--attention-kernel\) has no attention dropout.*--attention-dropout"
    ):
        ModelConfig.preset("tiny", attention={"kernel": "flex"})  # the preset's attention_dropout is 0.1
    ModelConfig.preset("tiny", attention={"kernel": "flex"}, attention_dropout=0.0)
    with pytest.raises(ValueError, match=r"attention.per_layer\[1\].kernel 'flex'"):
        ModelConfig.preset("tiny", attention={"per_layer": [{}, {"kernel": "flex"}]})
    with pytest.raises(ValueError, match=r"attention.local.kernel 'flex'"):
        ModelConfig.preset("tiny", attention={"global_every": 2, "local": {"kernel": "flex"}})


@pytest.mark.timeout(300)
def test_flex_with_dropout_stops_the_trainer_before_any_step_with_one_line(tmp_path):
    data = tu.prepare(tmp_path)
    p = tu.launch("python", tu.train_args(data, "zero2_fp32.json", 2, "--attention-kernel", "flex"))
    assert p.returncode == 2, p.stdout[-3000:]
    assert "'flex' (--attention-kernel) has no attention dropout" in p.stdout and "Traceback" not in p.stdout


def test_parse_args_records_which_flags_were_given():
    run = parse_args(["--deepspeed_config", "x.json", "--lr=2e-4", "--weight-decay", "0.1"] + BASE)
    assert {"lr", "weight_decay"} <= run.explicit and "adam_eps" not in run.explicit
    with pytest.raises(ArgsError):
        parse_args(["--deepspeed_config", "x.json", "--lr-wsd-decay-iters", "3"] + BASE)
