"""A run as one TOML file (pretrain/run_file.py, issue 55): tables and keys checked, flags win, the resolved run is
written by every run and starts the same run bit for bit."""

from __future__ import annotations

import tomllib

import pytest

import tests.train_utils as tu
from pretrain import run_file
from pretrain.args import GROUPS, parse_args

BASE = ["--data-path", "shard", "--train-iters", "5"]


def _write(tmp_path, text: str):
    p = tmp_path / "run.toml"
    p.write_text(text)
    return str(p)


def test_tables_are_the_help_groups_and_cover_every_flag_field():
    from common.cli import cli_fields

    assert list(run_file.tables()) == [title for title, _ in GROUPS]
    for title, (attr, cls) in run_file.tables().items():
        keys = set(run_file.table_keys(cls))
        assert {f.name for f in cli_fields(cls)} - keys <= run_file.NOT_IN_FILE, title


def test_dumps_round_trips_to_the_same_config(tmp_path):
    cfg = parse_args(
        [*BASE, "--num-layers", "2", "--lr", "3e-4", "--min-lr", "1e-5", "--no-tf32", "--split", "98,2,0"]
        + ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "2", "--micro-batch-size", "auto"]
    )
    text = run_file.dumps(cfg)
    assert text == run_file.dumps(cfg)  # pure
    data = tomllib.loads(text)
    assert data["optimization"]["lr"] == 3e-4 and data["model"]["num_layers"] == 2 and data["system"]["tf32"] is False
    again = parse_args(["--config", _write(tmp_path, text)])
    a, b = cfg.to_dict(), again.to_dict()
    for key in ("explicit", "config_file"):
        a.pop(key), b.pop(key)
    assert a == b
    assert again.sources["lr"] == "file" and again.sources["num_workers"] == "file"


def test_flags_win_over_the_file_and_sources_say_where(tmp_path):
    path = _write(tmp_path, "[optimization]\nlr = 0.002\nmin_lr = 0.0001\n[loop]\nseed = 9\n")
    cfg = parse_args(["--config", path, *BASE, "--lr", "0.001"])
    assert cfg.optim.lr == 0.001 and cfg.optim.min_lr == 0.0001 and cfg.loop.seed == 9
    assert cfg.sources["lr"] == "flag" and cfg.sources["min_lr"] == "file" and cfg.sources["adam_eps"] == "default"
    lines = run_file.describe_sources(cfg.sources, path, cfg.explicit)
    assert lines[0] == f"settings from {path}: min_lr, seed"
    assert "lr" in lines[1] and "train_iters" in lines[1]
    assert cfg.data.seed == 9  # the data seed is --seed, from the file too


def test_a_file_value_equal_to_the_default_is_not_given_against_a_ds_config_block(tmp_path):
    cfg = parse_args(["--config", _write(tmp_path, '[optimization]\noptimizer = "adamw"\nlr = 0.5\n'), *BASE])
    assert "lr" in cfg.explicit and "optimizer" not in cfg.explicit


@pytest.mark.parametrize(
    "text, words",
    [
        ("[optimisation]\nlr = 1.0\n", ["[optimisation]", "did you mean [optimization]?"]),
        ("[optimization]\nlr_decay_stlye = 'cosine'\n", ["[optimization]", "'lr_decay_stlye'", "'lr_decay_style'"]),
        ("[loop]\nlr = 0.1\n", ["[loop]", "'lr' belongs in [optimization]"]),
        ("[model]\nnum_layer = 2\n", ["[model]", "did you mean 'num_layers'?"]),
        ("[system]\nlocal_rank = 0\n", ["[system]", "'local_rank'"]),
        ("lr = 0.1\n", ["top-level key 'lr'"]),
        ("[loop]\ntrain_iters = '5'\n", ["[loop] train_iters", "'5' is not an integer"]),
        ("[loop]\ntrain_iters = 2.5\n", ["[loop] train_iters", "2.5"]),
        ("[optimization]\nlr_decay_style = 'cosin'\n", ["lr_decay_style must be one of", "cosine"]),
        ("[system]\ntf32 = 1\n", ["[system] tf32 must be true or false"]),
        ("[data]\ndata_path = 'x'\n", ["[data] data_path must be a list"]),
        ("[loop\n", ["not valid TOML"]),
    ],
)
def test_bad_files_are_refused_naming_the_file_table_and_nearest_key(tmp_path, text, words):
    path = _write(tmp_path, text)
    with pytest.raises(run_file.RunFileError) as e:
        parse_args(["--config", path, *BASE])
    assert path in str(e.value) or "not valid TOML" in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_a_missing_file_is_refused():
    with pytest.raises(run_file.RunFileError, match="no such file"):
        parse_args(["--config", "/nonexistent/run.toml", *BASE])


def test_run_dir_is_save_then_tensorboard_then_the_log_json_directory(tmp_path):
    assert run_file.run_dir(parse_args(BASE)) is None
    log = tmp_path / "logs" / "log.jsonl"
    assert run_file.run_dir(parse_args([*BASE, "--log-json", str(log)])) == log.parent
    assert str(run_file.run_dir(parse_args([*BASE, "--log-json", str(log), "--tensorboard-dir", "tb"]))) == "tb"
    assert str(run_file.run_dir(parse_args([*BASE, "--tensorboard-dir", "tb", "--save", "ck"]))) == "ck"


def test_write_is_atomic_and_leaves_no_temporary(tmp_path):
    path = run_file.write("a = 1\n", tmp_path / "d" / "config.toml")
    assert path.read_text() == "a = 1\n" and [p.name for p in path.parent.iterdir()] == ["config.toml"]


@pytest.mark.extended  # two launches: 31-59 s on the shared 2-core box (the default tier's budget is 30 s)
def test_the_written_run_file_starts_the_same_run_bit_for_bit(tmp_path):
    """A 1-rank CPU run of 2 steps writes config.toml next to its log; --config of it (log elsewhere) gives the same
    losses."""
    tu.prepare(tmp_path)
    first = tmp_path / "a" / "log.jsonl"
    args = tu.train_args(tmp_path, "zero1_fp32.json", 2, "--log-json", str(first), "--micro-batch-size", "auto")
    args += ["--global-batch-size", "4"]
    p = tu.launch("python", args, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
    written = first.parent / "config.toml"
    assert f"run file: {written}" in p.stdout
    assert "settings from flags: data_path, deepspeed_config" in p.stdout
    text = written.read_text()
    assert isinstance(tomllib.loads(text)["loop"]["micro_batch_size"], int)  # the resolved micro batch, not 'auto'
    second = tmp_path / "b" / "log.jsonl"
    p2 = tu.launch("python", ["--config", str(written), "--log-json", str(second)], timeout=120)
    assert p2.returncode == 0, p2.stdout[-3000:]
    assert f"settings from {written}: " in p2.stdout and "settings from flags: log_json" in p2.stdout
    losses = [(r["iteration"], r["loss"]) for r in tu.train_records(first)]
    assert len(losses) == 2
    assert [(r["iteration"], r["loss"]) for r in tu.train_records(second)] == losses
    assert (second.parent / "config.toml").read_text() == text.replace(str(first), str(second))


@pytest.mark.extended  # two launches (see above)
def test_each_checkpoint_holds_the_run_file_and_it_starts_the_same_run(tmp_path):
    """The checkpoint's config.toml (written before its commit marker) is the run directory's resolved file;
    --config of the checkpoint's copy, saving elsewhere, gives the same losses bit for bit."""
    tu.prepare(tmp_path)
    first, ckpt = tmp_path / "a" / "log.jsonl", tmp_path / "ckpt_a"
    args = tu.train_args(tmp_path, "zero1_fp32.json", 2, "--log-json", str(first), "--micro-batch-size", "auto")
    args += ["--global-batch-size", "4", "--save", str(ckpt), "--save-interval", "2"]
    p = tu.launch("python", args, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
    run_dir_file = ckpt / "config.toml"  # --save is the run directory
    saved = [f for f in ckpt.rglob("config.toml") if f != run_dir_file]
    assert len(saved) == 1, sorted(map(str, ckpt.rglob("*")))
    assert saved[0].read_text() == run_dir_file.read_text()
    second, ckpt_b = tmp_path / "b" / "log.jsonl", tmp_path / "ckpt_b"
    p2 = tu.launch("python", ["--config", str(saved[0]), "--log-json", str(second), "--save", str(ckpt_b)], timeout=120)
    assert p2.returncode == 0, p2.stdout[-3000:]
    losses = [(r["iteration"], r["loss"]) for r in tu.train_records(first)]
    assert len(losses) == 2
    assert [(r["iteration"], r["loss"]) for r in tu.train_records(second)] == losses
