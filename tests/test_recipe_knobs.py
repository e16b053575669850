"""run_scripts/common.sh's recipe knobs (issue #47 items 1 and 4): the micro batch `auto` on GPUs and 8 without,
RECIPE=paper (attention dropout 0.1) and RECIPE=fast (attention dropout 0, hidden dropout kept), the flags the
trainer receives parsed by the trainer itself; attention and hidden dropout stay separate settings, and the step
benchmark's `dropout0` variant removes attention dropout only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.step.case import Case, case_model_config
from benchmarks.step.profiling import STEP_VARIANTS, variant_case
from model.config import ModelConfig
from pretrain.args import parse_args

REPO = Path(__file__).resolve().parents[1]


def _paper_args(tmp_path: Path, gpus: int, n: int = 512, **env: str) -> subprocess.CompletedProcess:
    """``source common.sh; paper_hparams N`` with a python that reports ``gpus`` CUDA devices; PAPER_ARGS one a line,
    then NPROC."""
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/usr/bin/env bash\nif [[ "$*" == *device_count* ]]; then echo {gpus}; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    show = 'printf "%s\\n" "${PAPER_ARGS[@]}"; echo "NPROC=$NPROC"'
    script = f"source run_scripts/common.sh; paper_hparams {n}; {show}"
    e = {k: v for k, v in os.environ.items() if k not in ("MICRO_BATCH", "NPROC", "RECIPE")}
    e.update(PY=str(fake), **env)
    return subprocess.run(["bash", "-c", script], cwd=REPO, env=e, capture_output=True, text=True, timeout=60)


def _flag(lines: list[str], flag: str) -> str:
    return lines[lines.index(flag) + 1]


def test_gpu_default_is_auto_cpu_default_is_8(tmp_path):
    gpu = _paper_args(tmp_path, 1)
    assert gpu.returncode == 0, gpu.stderr
    lines = gpu.stdout.split("\n")
    assert _flag(lines, "--micro-batch-size") == "auto" and "NPROC=1" in lines
    assert _flag(lines, "--global-batch-size") == "256"  # Table 7's B x N = 131,072 at N=512: unchanged
    cpu = _paper_args(tmp_path, 0).stdout.split("\n")
    assert _flag(cpu, "--micro-batch-size") == "8" and "NPROC=2" in cpu
    mine = _paper_args(tmp_path, 1, MICRO_BATCH="16").stdout.split("\n")
    assert _flag(mine, "--micro-batch-size") == "16"


def _run(tmp_path: Path, **env: str):
    lines = _paper_args(tmp_path, 1, **env).stdout.split("\n")
    return parse_args([a for a in lines if a and not a.startswith("NPROC=")])


def test_recipe_paper_and_fast(tmp_path):
    """RECIPE picks the run file (recipes/); the trainer reads it under the knobs' flags."""
    paper, fast = _run(tmp_path), _run(tmp_path, RECIPE="fast")
    assert paper.config_file == "recipes/paper.toml" and fast.config_file == "recipes/fast.toml"
    assert paper.model.overrides["attention_dropout"] == 0.1 and paper.model.overrides["hidden_dropout"] == 0.1
    assert fast.model.overrides["attention_dropout"] == 0.0 and fast.model.overrides["hidden_dropout"] == 0.1
    assert paper.optim.lr == 2.5e-4 and paper.optim.adam_eps == 1e-8 and paper.checkpoint.keep_last == 3
    assert paper.sources["lr"] == "file" and paper.sources["train_iters"] == "flag"

    # everything else is the paper's
    a, b = (tomllib.loads((REPO / "recipes" / f"{r}.toml").read_text()) for r in ("paper", "fast"))
    del a["model"]["attention_dropout"], b["model"]["attention_dropout"]
    assert a == b
    d1, d2 = paper.to_dict(), fast.to_dict()
    for d in (d1, d2):
        d["model"]["overrides"].pop("attention_dropout"), d.pop("config_file")
    assert d1 == d2
    bad = _paper_args(tmp_path, 1, RECIPE="quick")
    assert bad.returncode == 2 and "RECIPE must be paper or fast" in bad.stderr
    own = tmp_path / "mine.toml"
    own.write_text("[optimization]\nlr = 1e-3\n")
    assert _run(tmp_path, RECIPE=str(own)).optim.lr == 1e-3
    missing = _paper_args(tmp_path, 1, RECIPE=str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "no such run file" in missing.stderr


def test_knob_flags_win_over_the_recipe_file(tmp_path):
    """SCALE and BATCH_SCALE are flags after --config: they replace nothing the file sets and win where they meet."""
    run = _run(tmp_path, SCALE="0.001", BATCH_SCALE="0.5")
    assert run.loop.train_iters == 2400 and run.optim.lr_warmup_iters == 10 and run.loop.global_batch_size == 128


def test_the_trainer_parses_the_recipe_flags(tmp_path):
    fast = [a for a in _paper_args(tmp_path, 1, RECIPE="fast").stdout.split("\n") if a and not a.startswith("NPROC=")]
    run = parse_args(fast)
    assert run.loop.micro_batch_size == "auto" and run.loop.global_batch_size == 256
    cfg = ModelConfig.preset("bert-base", **run.model.overrides)
    assert cfg.attention_dropout == 0.0 and cfg.hidden_dropout == 0.1


@pytest.mark.parametrize("attn, hidden", [(0.0, 0.1), (0.1, 0.0), (0.2, 0.3)])
def test_attention_and_hidden_dropout_are_separate_flags(attn, hidden):
    base = ["--data-path", "d", "--train-iters", "1", "--micro-batch-size", "2"]
    run = parse_args(base + ["--attention-dropout", str(attn), "--hidden-dropout", str(hidden)])
    cfg = ModelConfig.preset("bert-base", **run.model.overrides)
    assert (cfg.attention_dropout, cfg.hidden_dropout) == (attn, hidden)


def test_step_benchmark_dropout0_removes_attention_dropout_only():
    assert STEP_VARIANTS["dropout0"] == {"attention_dropout": 0.0}
    args = SimpleNamespace(vocab_size=30522, hidden=768, layers=12, heads=12, kernel="auto")
    base = case_model_config(Case(batch=32), args)
    dropped = case_model_config(variant_case("dropout0", Case(batch=32)), args)
    assert (base.attention_dropout, base.hidden_dropout) == (0.1, 0.1)
    assert (dropped.attention_dropout, dropped.hidden_dropout) == (0.0, 0.1)
