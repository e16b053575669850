"""benchmarks/profile_memory.py: the plain (no DeepSpeed) training step's memory and time, dense against BlockBERT and
Hugging Face's BertForMaskedLM (the blockwise paper's Figure 1(b) and Table 2 analogue; docs/training.md)."""

from __future__ import annotations

import json

import pytest

from benchmarks import profile_memory as pm


def test_one_run_measures_every_model_and_fits_the_quadratic_part(tmp_path, capsys):
    argv = ["--hidden-size", "48", "--num-layers", "1", "--num-attention-heads", "12", "--vocab-size", "1100"]
    argv += [
        "--tokens",
        "512",
        "--seq-lens",
        "128",
        "256",
        "--variants",
        "dense",
        "blockbert-n2",
        "--hf",
        "--device",
        "cpu",
    ]
    assert pm.main(argv + ["--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "profile_memory.json").read_text())
    rows = {(r["variant"], r["seq_len"]): r for r in result["rows"]}
    assert set(rows) == {(m, n) for m in ["dense", "blockbert-n2", pm.HF] for n in (128, 256)}  # one row each
    assert rows[("dense", 128)]["batch"] == 4 and rows[("dense", 256)]["batch"] == 2  # b x N fixed
    for n in (128, 256):  # the same weights and Adam state; BlockBERT keeps less for backward than dense
        assert rows[("blockbert-n2", n)]["model_mb"] == rows[("dense", n)]["model_mb"]
        assert rows[("blockbert-n2", n)]["optimizer_mb"] == pytest.approx(3 * rows[("dense", n)]["model_mb"])
        assert rows[("blockbert-n2", n)]["activation_mb"] < rows[("dense", n)]["activation_mb"]
    # at fixed b x N the attention scores grow with N: dense's slope is the largest, n=2 about half of it
    slope = {m: s for m, (s, _) in result["fits"].items()}
    assert slope["dense"] > slope["blockbert-n2"] > 0 and slope["blockbert-n2"] / slope["dense"] < 0.75
    assert (tmp_path / "profile_memory.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "N=128, b=4" in out and "| hf-sdpa |" in out and "| dense | " in out and "| 1.00 |" in out


def test_rounds_interleave_the_models_and_keep_each_ones_fastest_step():
    calls = []

    def run(m: str, n: int) -> pm.MemoryProfile:
        calls.append((m, n))
        step = {1: 3.0, 2: 1.0, 3: 2.0}[sum(c == (m, n) for c in calls)]  # each model's second round is its fastest
        return pm.MemoryProfile(m, 1, n, 1.0, 3.0, 10.0 * n, step + (m == "b"), cpu_s=step)

    rows = pm.best_of_rounds(["a", "b"], [64, 128], 3, run)
    assert calls == [("a", 64), ("b", 64)] * 3 + [("a", 128), ("b", 128)] * 3  # round by round over all models
    assert [(r.variant, r.seq_len, r.step_s) for r in rows] == [
        ("a", 64, 1.0),
        ("b", 64, 2.0),
        ("a", 128, 1.0),
        ("b", 128, 2.0),
    ]


def test_model_preset_offers_only_presets_it_profiles_as_they_are(tmp_path, capsys):
    """The tool always builds BERT (post-LN, 4h FFN, absolute positions) at a preset's three sizes, so a preset of
    another shape (ModernBERT: pre-LN, GLU, rotary; DIET; a BlockBERT layout) is refused by name, not profiled as a
    BERT of its sizes."""
    assert pm.BERT_SIZED == ["bert-base", "bert-large"]
    with pytest.raises(SystemExit) as e:
        pm.main(["--model-preset", "modernbert-base", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--model-preset" in capsys.readouterr().err
