"""Flag names follow one convention (Megatron-LM's where one exists): the tools take the trainer's spellings, and
inspect_dataset's data flags are generated from DataConfig."""

from __future__ import annotations

import argparse

import pytest

from common import cli
from common.cli import cli_fields


@pytest.mark.parametrize(
    "module, args, expected",
    [
        ("tools.plot_layouts", ["--seq-length", "64", "--stats"], {"seq_len": 64}),
        ("tools.plot_layouts", ["--model-preset", "blockbert-base-n2", "--stats"], {"preset": "blockbert-base-n2"}),
        ("tools.model_stats", ["--model-preset", "tiny"], {"preset": "tiny"}),
        (
            "benchmarks.profile_memory",
            ["--hidden-size", "64", "--num-layers", "3", "--num-attention-heads", "4"],
            {"hidden": 64, "layers": 3, "heads": 4},
        ),
    ],
)
def test_tools_take_the_trainers_flag_names(module, args, expected, monkeypatch):
    import importlib

    mod = importlib.import_module(module)
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", _recording(seen, argparse.ArgumentParser.parse_args))
    with pytest.raises(_Stop):
        mod._main(args)
    assert {k: getattr(seen[0], k) for k in expected} == expected


class _Stop(Exception):
    """Raised once the arguments are parsed (the tool's work is not what is tested)."""


def _recording(seen: list, parse):
    def parse_args(self, args=None, namespace=None):
        seen.append(parse(self, args, namespace))
        raise _Stop

    return parse_args


def test_inspect_dataset_generates_the_data_config_flags():
    from data_pipeline.data_config import DataConfig
    from tools.inspect_dataset import SAMPLES_OWN_FLAGS, samples_parser

    p = samples_parser()
    dests = {a.dest for a in p._actions if a.dest != "help"}
    assert dests - set(SAMPLES_OWN_FLAGS) == {f.name for f in cli_fields(DataConfig)}
    flags = {a.dest: a.option_strings[0] for a in p._actions if a.option_strings}
    trainer = {f.name: cli.flag_name(f) for f in cli_fields(DataConfig)}
    assert {k: flags[k] for k in trainer} == trainer  # the trainer's names
    base = ["--data-path", "shard", "--tokenizer-type", "BertWordPieceLowerCase"]
    ns = p.parse_args([*base, "--sample-mode", "nsp", "--mask-prob", "0.3"])
    assert cli.build(DataConfig, ns) == DataConfig(data_path=["shard"], sample_mode="nsp", mask_prob=0.3)
