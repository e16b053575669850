"""benchmarks/pretrain_compare/ at a tiny scale: the table, the same held-out batches for every config and seed,
reproducible evaluation of a checkpoint, resume of an interrupted comparison, plots.

The end-to-end test launches the real trainer under `deepspeed --num_gpus 2` (2 CPU ranks on gloo) three times
(~20 s each on the 2-core dev box)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.pretrain_compare.cli import main, parse
from benchmarks.pretrain_compare.evaluate import evaluate_checkpoint, valid_fingerprint
from benchmarks.pretrain_compare.launch import check_spec
from benchmarks.pretrain_compare.presets import CONFIG_NAMES, PRESETS, CompareError, head_assignment, model_config_dict
from benchmarks.pretrain_compare.specs import RunSpec, run_specs
from benchmarks.pretrain_compare.stats import summarize_run

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"
TRAIN = [
    SAMPLE / "books" / "book01_the_lantern_of_harrowgate.txt",
    SAMPLE / "books" / "book02_a_winter_on_the_aldwyn.txt",
    SAMPLE / "books" / "book03_the_clockmakers_ledger.txt",
    SAMPLE / "wikiextractor" / "AA" / "wiki_00",
]
HELD_OUT = [SAMPLE / "books" / "book04_letters_from_stonehaven.txt", SAMPLE / "wikiextractor" / "AA" / "wiki_01"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "data_pipeline.train_tokenizer",
            "--input",
            str(SAMPLE / "books"),
            str(SAMPLE / "wikiextractor"),
            "--output-dir",
            str(out),
            "--vocab-size",
            "2000",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return out / "vocab.txt"


def _argv(out: Path, vocab: Path, *extra: str) -> list[str]:
    return [
        "--out",
        str(out),
        "--preset",
        "tiny",
        "--configs",
        "dense",
        "blockbert_n2",
        "--seeds",
        "1",
        "--train-inputs",
        *map(str, TRAIN),
        "--valid-inputs",
        *map(str, HELD_OUT),
        "--vocab-file",
        str(vocab),
        "--keep-checkpoints",
        *extra,
    ]


def test_head_assignment_scales_the_paper_split() -> None:
    assert head_assignment(12, 2) == "10:2" and head_assignment(12, 3) == "8:2:2"
    assert head_assignment(4, 2) == "3:1" and head_assignment(4, 3) == "2:1:1"
    with pytest.raises(CompareError):
        head_assignment(2, 3)


@pytest.mark.parametrize("config", CONFIG_NAMES)
def test_every_config_is_a_valid_model(config: str) -> None:
    d = model_config_dict(config, PRESETS["cpu-small"])
    assert (d["num_layers"], d["hidden_size"], d["num_attention_heads"]) == (4, 128, 4)
    assert d["max_position_embeddings"] == 512


def test_log_reading_keeps_the_resumed_records(tmp_path: Path) -> None:
    """A resumed run repeats the iterations after its checkpoint: each counts once, the later record wins."""
    recs = [
        {
            "iteration": 2,
            "loss": 5.0,
            "samples_per_s": 2.0,
            "tokens_per_s": 20.0,
            "consumed_samples": 4,
            "memory": 10.0,
        },
        {
            "iteration": 4,
            "loss": 4.0,
            "samples_per_s": 2.0,
            "tokens_per_s": 20.0,
            "consumed_samples": 8,
            "memory": 11.0,
        },
        {"iteration": 4, "valid": {"loss": 3.5, "perplexity": 33.1, "mlm_accuracy": 0.1}},
        {
            "iteration": 4,
            "loss": 4.0,
            "samples_per_s": 4.0,
            "tokens_per_s": 40.0,
            "consumed_samples": 8,
            "memory": 12.0,
        },  # resumed from the checkpoint at 2
        {"iteration": 4, "valid": {"loss": 3.5, "perplexity": 33.1, "mlm_accuracy": 0.1}},
    ]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    spec = RunSpec("dense_s1", "dense", 1, [], {})
    s = summarize_run(spec, tmp_path, 8)
    assert [e["iteration"] for e in s["evals"]] == [4]
    assert s["train_time_s"] == pytest.approx(2 * 2 / 2.0 + 2 * 2 / 4.0)  # 2 s + 1 s
    assert s["tokens"] == pytest.approx(20.0 * 2 + 40.0 * 1)
    assert s["peak_memory_mb"] == 12.0 and s["stalls"] == []


def test_a_stalled_window_is_counted_at_the_median_step(tmp_path: Path) -> None:
    recs = [
        {
            "iteration": i,
            "loss": 5.0,
            "samples_per_s": 2.0 if i != 8 else 0.01,
            "tokens_per_s": 20.0,
            "consumed_samples": 2 * i,
            "memory": 10.0,
        }
        for i in (2, 4, 6, 8, 10)
    ]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = summarize_run(RunSpec("dense_s1", "dense", 1, [], {}), tmp_path, 8)
    assert s["step_time_s"] == pytest.approx(1.0)
    assert s["stalls"] == [{"iteration": 8, "steps": 2, "seconds": 400.0}]
    assert s["train_time_s"] == pytest.approx(10.0)  # 5 windows of 2 steps at 1 s, the stall included


def test_bad_invocations_are_refused(tmp_path: Path, vocab: Path) -> None:
    assert main(["--out", str(tmp_path), "--data-path", "x", "--vocab-file", str(tmp_path / "none")]) == 2
    assert main(["--out", str(tmp_path), "--vocab-file", str(vocab)]) == 2  # no data
    assert main(["--out", str(tmp_path), "--train-inputs", "a", "--vocab-file", str(vocab)]) == 2  # no held-out


@pytest.mark.extended  # ~40 s of launches
@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_compare_resumes_and_reports(tmp_path: Path, vocab: Path, monkeypatch) -> None:
    out = tmp_path / "cmp"
    # sitting 1: rank 1 dies at iteration 5 of the first run (after the checkpoint of iteration 3)
    monkeypatch.setenv("SPARSEBERT_FAULT_KILL_RANK", "1:5")
    assert main(_argv(out, vocab)) == 2
    dense, block = out / "runs" / "dense_s1", out / "runs" / "blockbert_n2_s1"
    assert not (dense / "done.json").exists() and not block.exists()
    monkeypatch.delenv("SPARSEBERT_FAULT_KILL_RANK")

    # sitting 2: the first run continues from its checkpoint (not from scratch), then the second trains
    assert main(_argv(out, vocab, "--recheck")) == 0
    stdout = (dense / "stdout.log").read_text()
    assert "resumed from" in stdout and "iteration 3" in stdout.split("resumed from", 1)[1].splitlines()[0]
    assert len((dense / "launches.jsonl").read_text().splitlines()) == 2
    log_before = (dense / "log.jsonl").read_text(), (block / "log.jsonl").read_text()

    # sitting 3: everything is done: nothing is retrained
    assert main(_argv(out, vocab)) == 0
    assert ((dense / "log.jsonl").read_text(), (block / "log.jsonl").read_text()) == log_before
    assert len((block / "launches.jsonl").read_text().splitlines()) == 1

    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == {"dense_s1", "blockbert_n2_s1"}
    for r in results["runs"].values():
        assert [e["iteration"] for e in r["evals"]] == [3, 6]
        assert all(e["perplexity"] > 1 and e["tokens"] > 0 and e["train_time_s"] > 0 for e in r["evals"])
        assert r["step_time_s"] > 0 and r["peak_memory_mb"] > 0
        # the trainer's logged validation at the end == the checkpoint re-evaluated in-process
        assert r["recheck"]["iteration"] == 6
        assert r["recheck"]["loss"] == pytest.approx(r["final"]["loss"], rel=1e-5)
    assert results["same_validation_batches"]
    assert len({r["valid_fingerprint"] for r in results["runs"].values()}) == 1
    assert set(results["summary"]) == {"dense", "blockbert_n2"}
    assert "| dense | 1 | 6 |" in (out / "table.md").read_text()
    for name in ("ppl_vs_step.png", "ppl_vs_time.png", "ppl_vs_tokens.png", "cost.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the unigram baseline: training-token frequencies scored on the masked held-out tokens; its accuracy is that of
    # always predicting the most frequent token, its perplexity is that of a model that ignores the context
    u = results["unigram_baseline"]
    assert u["tokens"] > 0 and 0 < u["mlm_accuracy"] < 0.5 and 1 < u["perplexity"] < 1e6
    assert u["loss"] == pytest.approx(math.log(u["perplexity"]))
    assert "| *unigram baseline* |" in (out / "table.md").read_text()
    # --report-only with --figures-dir: the copies the docs show, named with the prefix
    figs = tmp_path / "figs"
    assert main(_argv(out, vocab, "--report-only", "--figures-dir", str(figs))) == 0
    assert sorted(p.name for p in figs.iterdir()) == [
        "compare_cost.png",
        "compare_ppl_vs_step.png",
        "compare_ppl_vs_time.png",
        "compare_ppl_vs_tokens.png",
        "compare_results.json",
    ]

    # evaluating the same checkpoint twice gives the same numbers; another training seed sees the same batches
    ns = parse(_argv(out, vocab, "--seeds", "1", "2"))
    ns.data_path, ns.valid_data_path = (
        [str(out / "data" / "train_text_sentence")],
        [str(out / "data" / "valid_text_sentence")],
    )
    specs = {s.name: s for s in run_specs(ns, PRESETS["tiny"])}
    assert set(specs) == {"dense_s1", "blockbert_n2_s1", "dense_s2", "blockbert_n2_s2"}
    assert evaluate_checkpoint(specs["dense_s1"], dense, 2) == evaluate_checkpoint(specs["dense_s1"], dense, 2)
    (tmp_path / "s2").mkdir()
    fingerprint = valid_fingerprint(specs["dense_s2"], tmp_path / "s2", 2)
    assert fingerprint == results["runs"]["dense_s1"]["valid_fingerprint"]


def test_a_run_directory_refuses_other_settings(tmp_path: Path) -> None:
    spec = RunSpec("dense_s1", "dense", 1, ["--lr", "1e-3"], {"a": 1})
    check_spec(tmp_path / "r", spec)
    check_spec(tmp_path / "r", spec)  # same settings: fine
    with pytest.raises(CompareError, match="train_args"):
        check_spec(tmp_path / "r", RunSpec("dense_s1", "dense", 1, ["--lr", "2e-3"], {"a": 1}))


def test_modernbert_configs_are_modernbert_at_the_preset_size() -> None:
    from model.config import ModelConfig

    d = model_config_dict("modernbert", PRESETS["cpu-small"])
    cfg = ModelConfig.from_dict(d)
    assert cfg.pre_layer_norm and cfg.ffn_type == "glu" and not cfg.linear_bias and cfg.position.type == "rotary"
    assert d["attention"]["global_every"] == 3 and d["attention"].get("sparsity") is None
    assert d["attention"]["local"]["token_mask"] == {"pattern": "sliding_window", "window": 128}
    b = model_config_dict("modernbert_blockbert", PRESETS["cpu-small"])
    assert b["attention"]["sparsity"]["mode"] == "blockbert" and b["attention"]["global_every"] == 3
    assert {k: v for k, v in b.items() if k != "attention"} == {k: v for k, v in d.items() if k != "attention"}
