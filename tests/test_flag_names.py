"""Flag names follow one convention (Megatron-LM's where one exists): the renamed flags' old spellings still parse, to
the same value, with one deprecation line naming the new flag (common.cli.add_deprecated_alias); inspect_dataset's
data flags are generated from DataConfig."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from common import cli
from common.cli import add_deprecated_alias, add_flags, cli_fields


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(cli, "_warned", set())  # each test sees the once-per-process line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_deprecated_alias(p, p.add_argument("--seq-length", type=int, default=512), "--seq-len")
    add_deprecated_alias(p, p.add_argument("--whole-word-masking", action="store_true"), "--wwm")
    add_deprecated_alias(p, p.add_argument("--seq-lengths", type=int, nargs="+", choices=[1, 2]), "--lens")
    return p


def test_the_old_spelling_parses_to_the_same_value_and_warns_once(capsys):
    p = _parser()
    assert p.parse_args(["--seq-len", "128"]) == p.parse_args(["--seq-length", "128"])
    assert p.parse_args(["--wwm"]).whole_word_masking is True
    assert p.parse_args(["--lens", "1", "2"]).seq_lengths == [1, 2]
    err = capsys.readouterr().err
    assert err.count("--seq-len is deprecated") == 1  # once, though given twice
    assert "warning: --seq-len is deprecated and will be removed in the next release; use --seq-length" in err
    assert "--wwm is deprecated" in err and "use --whole-word-masking" in err
    with pytest.raises(SystemExit):  # the new flag's type and choices hold for the old spelling
        p.parse_args(["--lens", "3"])
    assert p.parse_args([]).seq_length == 512 and "--seq-len " not in p.format_help()  # help shows the new name only
    capsys.readouterr()
    p.parse_args(["--seq-length", "64"])
    assert "deprecated" not in capsys.readouterr().err  # the new spelling is silent


def test_a_generated_flag_declares_its_old_spellings_in_the_field(capsys):
    @dataclasses.dataclass
    class Config:
        seq_length: int = dataclasses.field(default=512, metadata=cli.cli(deprecated=["--seq-len"]))
        """Sequence length."""

    p = argparse.ArgumentParser()
    add_flags(p, Config)
    assert p.parse_args(["--seq-len", "7"]).seq_length == 7
    assert "use --seq-length" in capsys.readouterr().err


@pytest.mark.parametrize(
    "module, new, old, value",
    [
        ("tools.plot_layouts", "--seq-length", "--seq-len", "64"),
        ("tools.plot_layouts", "--model-preset", "--preset", "blockbert-base-n2"),
        ("tools.model_stats", "--model-preset", "--preset", "tiny"),
    ],
)
def test_renamed_tool_flags_keep_their_old_spelling(module, new, old, value, capsys, monkeypatch):
    import importlib

    mod = importlib.import_module(module)
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", _recording(seen, argparse.ArgumentParser.parse_args))
    for flag in (new, old):
        with pytest.raises(_Stop):
            mod._main([flag, value, "--stats"] if module == "tools.plot_layouts" else [flag, value])
    assert vars(seen[0]) == vars(seen[1])
    assert f"{old} is deprecated and will be removed in the next release; use {new}" in capsys.readouterr().err


class _Stop(Exception):
    """Raised once the arguments are parsed (the tool's work is not what is tested)."""


def _recording(seen: list, parse):
    def parse_args(self, args=None, namespace=None):
        seen.append(parse(self, args, namespace))
        raise _Stop

    return parse_args


def test_inspect_dataset_generates_the_data_config_flags(capsys):
    from data_pipeline.data_config import DataConfig
    from tools.inspect_dataset import SAMPLES_OWN_FLAGS, samples_parser

    p = samples_parser()
    dests = {a.dest for a in p._actions if a.dest != "help"}
    assert dests - set(SAMPLES_OWN_FLAGS) == {f.name for f in cli_fields(DataConfig)}
    flags = {a.dest: a.option_strings[0] for a in p._actions if a.option_strings and a.help != argparse.SUPPRESS}
    trainer = {f.name: cli.flag_name(f) for f in cli_fields(DataConfig)}
    assert {k: flags[k] for k in trainer} == trainer  # the trainer's names
    base = ["--data-path", "shard", "--tokenizer-type", "BertWordPieceLowerCase"]
    ns = p.parse_args([*base, "--sample-mode", "nsp", "--mask-prob", "0.3"])
    assert cli.build(DataConfig, ns) == DataConfig(data_path=["shard"], sample_mode="nsp", mask_prob=0.3)
    old = p.parse_args([*base, "--mode", "nsp", "--mlm-probability", "0.3"])
    assert vars(old) == vars(ns)
    err = capsys.readouterr().err
    assert "--mode is deprecated" in err and "use --sample-mode" in err and "use --mask-prob" in err
