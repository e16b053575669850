"""model/presets.py, the one home of the model recipes: every preset builds a model, the builders give exactly the
settings that were written out by hand before (the old dicts are kept here, once, as the reference), the head-split
scaling equals both of its old copies, the run scripts resolve to the same model configs with --model-preset and plain
flags, and a new recipe is one preset entry."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from model import presets
from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.presets import PRESETS, PresetError, blockbert, diet, modernbert, scale_head_split, sparsebert
from tests.test_cuda_contracts import _tiny as shrunk_preset

REPO = Path(__file__).resolve().parents[1]

# -- the hand-written settings of the old homes (the reference; nowhere else any more) ---------------------------------
OLD_BLOCKBERT_N2 = {"mode": "blockbert", "num_blocks": 2, "head_assignment": "10:2", "block": 16}  # model/config.py,
OLD_BLOCKBERT_N3 = {"mode": "blockbert", "num_blocks": 3, "head_assignment": "8:2:2", "block": 16}  # modernbert.sh
OLD_PROFILE_MEMORY = {"mode": "blockbert", "num_blocks": 3, "head_assignment": "8:2:2", "block": 64}
OLD_TRAIN_STEP_DS = {"mode": "blockbert", "num_blocks": 2, "head_assignment": "10:2"}  # and the --blockbert-blocks dict
OLD_QUICKSTART = {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16}  # gpu_check, 4 heads
OLD_ATTENTION_MEMORY_N3 = {"mode": "blockbert", "num_blocks": 3, "head_assignment": "2:1:1", "block": 16}
OLD_MODERNBERT = {
    "kernel": "auto",
    "global_every": 3,
    "local": {"token_mask": {"pattern": "sliding_window", "window": 128}},
}
OLD_DIET_ABS = {"type": "diet_abs", "rank": 128, "sharing": "none"}  # pretrain_diet.sh, pretrain_compare
OLD_DIET_REL = {"type": "diet_rel", "max_distance": 64, "sharing": "layer"}
OLD_STRIDED = {"pattern": "strided", "stride": 16, "seq_len": 128}  # pretrain_compare's sparsebert_strided


def old_compare_split(num_heads: int, blocks: int) -> str:
    """benchmarks/pretrain_compare/presets.py's old head_assignment."""
    shifted = max(1, round(num_heads / 6))
    first = num_heads - shifted * (blocks - 1)
    if first < 1:
        raise ValueError("does not fit")
    return ":".join([str(first)] + [str(shifted)] * (blocks - 1))


def old_train_step_split(spec: str, heads: int) -> str:
    """benchmarks/train_step_ds.py's old _head_assignment."""
    parts = [int(x) for x in spec.split(":")]
    scaled = [max(1, round(p * heads / sum(parts))) for p in parts]
    scaled[0] += heads - sum(scaled)
    if scaled[0] < 1:  # the old code built an invalid split here, which the layout then refused
        raise ValueError("does not fit")
    return ":".join(map(str, scaled))


def test_the_builders_equal_the_old_hand_written_settings():
    assert blockbert(2) == OLD_BLOCKBERT_N2 and blockbert(3, 12) == OLD_BLOCKBERT_N3
    assert PRESETS["blockbert-base-n2"]["attention"]["sparsity"] == OLD_BLOCKBERT_N2
    assert blockbert(3, 12, block=64) == OLD_PROFILE_MEMORY
    assert blockbert(2, 12, block=None) == blockbert(2, "10:2", block=None) == OLD_TRAIN_STEP_DS
    assert blockbert(2, 4) == blockbert(2, "3:1") == OLD_QUICKSTART
    assert blockbert(3, 4) == OLD_ATTENTION_MEMORY_N3
    assert modernbert() == PRESETS["modernbert-base"]["attention"] == OLD_MODERNBERT
    assert PRESETS["modernbert-tiny"]["attention"]["local"]["token_mask"]["window"] == 32
    assert modernbert(64, 2, blockbert(2)) == {
        "kernel": "auto",
        "global_every": 2,
        "sparsity": OLD_BLOCKBERT_N2,
        "local": {"sparsity": None, "token_mask": {"pattern": "sliding_window", "window": 64}},
    }
    assert diet("abs") == OLD_DIET_ABS and diet("rel", 64, "layer") == OLD_DIET_REL
    assert sparsebert("strided", 128, stride=16) == OLD_STRIDED
    assert sparsebert("no_diagonal") == {"pattern": "no_diagonal"}
    with pytest.raises(PresetError, match="DIET kind 'mid'"):
        diet("mid")
    with pytest.raises(PresetError, match="n=4 has no paper head split"):
        blockbert(4)


@pytest.mark.parametrize("blocks", [2, 3])
def test_the_head_split_scaling_equals_both_old_copies(blocks):
    for heads in range(1, 65):
        try:
            old = old_compare_split(heads, blocks)
        except ValueError:
            old = None
        try:
            other = old_train_step_split(presets.PAPER_HEAD_SPLITS[blocks], heads)
        except ValueError:
            other = None
        try:
            new = scale_head_split(presets.PAPER_HEAD_SPLITS[blocks], heads)
        except PresetError:
            new = None
        assert new == old == other, heads
    assert scale_head_split("9:3", 4) == "3:1" and scale_head_split("9:3", 12) == "9:3"
    with pytest.raises(PresetError, match="must look like"):
        scale_head_split("ten:two", 12)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_builds_a_model(name):
    cfg = shrunk_preset(name)  # the preset at test size, its head count (the BlockBERT splits) and cadence kept
    model = BertForPreTraining(cfg)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # the JSON round trip holds


def test_a_new_recipe_is_one_preset_entry(monkeypatch):
    from pretrain.args import parse_args
    from pretrain.builders import build_model_config

    monkeypatch.setitem(PRESETS, "blockbert-tiny-n3", dict(PRESETS["tiny"], attention={"sparsity": blockbert(3, 4)}))
    run = parse_args(["--data-path", "x", "--train-iters", "1", "--model-preset", "blockbert-tiny-n3"])
    cfg = build_model_config(run.model, run.data, 100, None, "ds.json")
    assert cfg.attention.sparsity == OLD_ATTENTION_MEMORY_N3 and cfg.num_attention_heads == 4
    assert "blockbert-tiny-n3" in presets.preset_names()


# -- the run scripts: --model-preset plus plain flags, the same model configs as their old inline JSON ---------------
def _old_write_model_config(n: int, attention: dict, position: dict | None) -> dict:
    """run_scripts/common.sh's old write_model_config (pretrain_diet.sh, pretrain_sparsebert.sh)."""
    d = ModelConfig.preset("bert-base").to_dict()
    d["max_position_embeddings"] = n
    d["attention"].update(attention)
    if position:
        d["position"] = position
    return ModelConfig.from_dict(d).to_dict()


def _old_modernbert(n: int, window: int, every: int, sparsity: dict | None) -> dict:
    """pretrain_modernbert.sh's old inline model.json."""
    d = ModelConfig.preset("modernbert-base").to_dict()
    d["max_position_embeddings"] = n
    local = {"sparsity": None, "token_mask": {"pattern": "sliding_window", "window": window}}
    d["attention"].update(sparsity=sparsity, global_every=every, local=local)
    return ModelConfig.from_dict(d).to_dict()


def _old_preset_flags(n: int, sparsity: dict | None = None, kernel: str | None = None) -> dict:
    """pretrain_blockbert.sh / roberta_1seq.sh: bert-base with N positions and the flags' attention."""
    d = ModelConfig.preset("bert-base").to_dict()
    d["max_position_embeddings"] = n
    if sparsity:
        d["attention"]["sparsity"] = sparsity
    if kernel:
        d["attention"]["kernel"] = kernel
    return ModelConfig.from_dict(d).to_dict()


SCRIPTS = [
    (["pretrain_blockbert.sh", "512", "2"], {}, [_old_preset_flags(512, OLD_TRAIN_STEP_DS)]),
    (["pretrain_diet.sh", "512", "abs"], {}, [_old_write_model_config(512, {"kernel": "auto"}, OLD_DIET_ABS)]),
    (
        ["pretrain_diet.sh", "128", "rel", "64"],
        {"SHARING": "layer"},
        [_old_write_model_config(128, {"kernel": "auto"}, OLD_DIET_REL)],
    ),
    (
        ["pretrain_sparsebert.sh", "128", "no-diag"],
        {},
        [
            _old_write_model_config(
                128, {"kernel": "auto", "token_mask": {"pattern": "no_diagonal", "seq_len": 128}}, {}
            )
        ],
    ),
    (
        ["pretrain_sparsebert.sh", "128", "fixed", "strided"],
        {},
        [_old_write_model_config(128, {"kernel": "auto", "token_mask": {"pattern": "strided", "seq_len": 128}}, {})],
    ),
    (
        ["pretrain_sparsebert.sh", "128", "dam"],
        {},
        [
            _old_write_model_config(128, {"kernel": "dense", "token_mask": {"pattern": "dam", "seq_len": 128}}, {}),
            _old_write_model_config(
                128,
                {
                    "kernel": "auto",
                    "token_mask": {"pattern": "file", "path": "OUT/search/ckpt/learned_masks.pt", "seq_len": 128},
                },
                {},
            ),
        ],
    ),
    (["pretrain_modernbert.sh", "512"], {}, [_old_modernbert(512, 128, 3, None)]),
    (
        ["pretrain_modernbert.sh", "256"],
        {"GLOBAL": "blockbert", "WINDOW": "64", "GLOBAL_EVERY": "2"},
        [_old_modernbert(256, 64, 2, OLD_BLOCKBERT_N2)],
    ),
    (["pretrain_roberta_1seq.sh", "512"], {}, [_old_preset_flags(512, kernel="dense")]),
]


@pytest.fixture
def fake_launcher(tmp_path):
    """A PY whose directory's `deepspeed` records the trainer's argv instead of starting ranks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "deepspeed").write_text(
        f'#!/bin/sh\n"{sys.executable}" -c "import json, sys; print(json.dumps(sys.argv[1:]))" "$@" >> "$FAKE_LOG"\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return bin_dir / "python"


@pytest.mark.parametrize(
    "argv, knobs, expected", SCRIPTS, ids=["_".join(a + [f"{k}={v}" for k, v in e.items()]) for a, e, _ in SCRIPTS]
)
def test_the_run_scripts_train_the_configs_they_trained_before(tmp_path, fake_launcher, argv, knobs, expected):
    from pretrain.args import parse_args
    from pretrain.builders import build_model_config

    out, log = tmp_path / "out", tmp_path / "argv.jsonl"
    env = dict(os.environ, PY=str(fake_launcher), NPROC="2", SCALE="0.001", MASTER_PORT="1", OUT=str(out))
    env.update(FAKE_LOG=str(log), **knobs)
    p = subprocess.run(["bash", str(REPO / "run_scripts" / argv[0]), *argv[1:]], cwd=REPO, env=env, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout
    launches = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(launches) == len(expected)
    for launch, want in zip(launches, expected):
        train_argv = launch[launch.index("pretrain/train.py") + 1 :]
        assert "--model-config" not in train_argv and "--model-preset" in train_argv
        run = parse_args(train_argv)
        got = build_model_config(run.model, run.data, 30522, None, "ds.json").to_dict()
        assert got == json.loads(json.dumps(want).replace("OUT", str(out)))


def test_no_inline_json_in_the_run_scripts():
    for path in sorted((REPO / "run_scripts").rglob("*.sh")):
        text = path.read_text()
        assert not re.search(r"""['"]\{\s*\\?["']""", text), f"{path.name}: inline JSON; use --model-preset and flags"
        assert "write_model_config" not in text and "--sparsity-config" not in text, path.name


# -- the trainer's recipe shorthands -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, match",
    [
        (["--diet-size", "64"], "use a DIET preset"),
        (["--sliding-window", "64"], "use a modernbert-\\* preset"),
        (["--token-mask-path", "m.pt"], "--token-mask-path needs --token-mask file"),
        (["--token-mask", "file"], "needs --token-mask-path"),
    ],
)
def test_recipe_flags_that_do_not_fit_the_preset_are_refused(flags, match):
    from pretrain.args import ArgsError, parse_args
    from pretrain.builders import build_model_config

    with pytest.raises(ArgsError, match=match):
        run = parse_args(["--data-path", "x", "--train-iters", "1", "--model-preset", "bert-base", *flags])
        build_model_config(run.model, run.data, 100, None, "ds.json")


def test_a_layout_flag_on_a_modernbert_preset_goes_on_the_global_layers():
    from pretrain.args import parse_args
    from pretrain.builders import build_model_config

    argv = ["--data-path", "x", "--train-iters", "1", "--model-preset", "modernbert-tiny", "--seq-length", "128"]
    run = parse_args([*argv, "--blockbert-blocks", "2", "--head-assignment", "3:1"])
    cfg = build_model_config(run.model, run.data, 100, None, "ds.json")
    assert cfg.attention.for_layer(0, 4)[1] is not None and cfg.attention.for_layer(1, 4)[1] is None
