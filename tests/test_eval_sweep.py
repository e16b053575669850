"""tools/evaluate/sweep.py with a fake fine-tuning: the grid x seeds plan, the papers' selection (median over seeds
of the best grid point) against a hand computation, resume, refused setting changes, narrowed sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.evaluate import sweep as sw
from tools.evaluate.protocols import Protocol, TaskSetting
from tools.evaluate.tasks import TASKS

# MNLI accuracies (matched, mismatched) per grid point and seed, chosen so that the three plausible rules disagree:
# the median over seeds picks B (84), the mean over seeds would pick D (83.8 vs 79.3), the best single run C (90).
MNLI = {
    "lr1e-05_bs16_wd0.01_ep3": {1: (80, 80), 2: (82, 80), 3: (81, 80)},  # A: medians of (m+mm)/2: 80.5
    "lr1e-05_bs32_wd0.01_ep3": {1: (84, 84), 2: (70, 70), 3: (83, 85)},  # B: 84
    "lr2e-05_bs16_wd0.01_ep3": {1: (90, 90), 2: (60, 60), 3: (60, 60)},  # C: 60
    "lr2e-05_bs32_wd0.01_ep3": {1: (83, 83), 2: (83, 84), 3: (86, 84)},  # D: 83.5
}

SETTING = TaskSetting(lrs=(1e-5, 2e-5), batch_sizes=(16, 32), seeds=(1, 2, 3), source="test")
PROTO = Protocol(name="t", paper="test", suites={"glue": ("mnli", "mrpc")}, settings={"mnli": SETTING, "mrpc": SETTING})


class Fake:
    """A run_one that scores from the table above (MNLI) or from the learning rate and seed (other tasks), and
    records what it was asked to run."""

    def __init__(self, fail_at: int | None = None, mnli_table: bool = True) -> None:
        self.calls: list[tuple[str, str, str, int]] = []
        self.fail_at = fail_at
        self.mnli_table = mnli_table

    def __call__(self, run: sw.Run, work: Path) -> sw.RunResult:
        self.calls.append((run.model.tag, run.task, run.point.name, run.seed))
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            work.mkdir(parents=True)
            (work / "partial").write_text("x")
            raise KeyboardInterrupt("stopped")
        task = TASKS[run.task]
        scores = {}
        for i, split in enumerate(task.eval_splits):
            if run.task == "mnli" and self.mnli_table:
                v = float(MNLI[run.point.name][run.seed][i])
            else:
                v = 50.0 + 1e5 * run.point.lr + run.seed + (run.model.tag == "b")
            scores[split] = {m: v for m in task.metrics}
        return sw.RunResult(
            scores=scores,
            predictions={s: {"ex0": 1} for s in task.eval_splits},
            train_seconds=1.5,
            train_tokens=100,
            steps=3,
        )


def _sweep(tmp: Path, **kw) -> sw.Sweep:
    defaults = dict(protocol=PROTO, models=(sw.Model("a", str(tmp / "ckpt_a")),), tasks=("mnli",), data_dir="data")
    return sw.Sweep(**{**defaults, **kw})


def test_median_of_the_best_grid_point_matches_a_hand_computation(tmp_path):
    s = _sweep(tmp_path)
    fake = Fake()
    counts = sw.execute(s, tmp_path, fake, log=lambda _: None)
    assert counts == {"done_before": 0, "ran": 12, "left": 0} and len(fake.calls) == 12
    cell = sw.summarize(s, tmp_path)["tasks"][0]["cells"]["a"]
    assert cell["best_point"]["name"] == "lr1e-05_bs32_wd0.01_ep3"
    assert cell["grid"] == {
        "lr1e-05_bs16_wd0.01_ep3": 80.5,
        "lr1e-05_bs32_wd0.01_ep3": 84.0,
        "lr2e-05_bs16_wd0.01_ep3": 60.0,
        "lr2e-05_bs32_wd0.01_ep3": 83.5,
    }
    # at B: medians of (84, 70, 83) and (84, 70, 85), each split on its own, and their min-max
    assert cell["median"]["validation_matched"]["accuracy"] == 83.0
    assert cell["median"]["validation_mismatched"]["accuracy"] == 84.0
    assert cell["spread"] == {"validation_matched": [70.0, 84.0], "validation_mismatched": [70.0, 85.0]}
    assert cell["compute"]["train_seconds"] == 12 * 1.5 and cell["compute"]["train_tokens"] == 1200
    assert (cell["runs_done"], cell["runs_planned"]) == (12, 12)
    run = tmp_path / "a" / "mnli" / "lr1e-05_bs32_wd0.01_ep3" / "seed2"
    result = json.loads((run / "result.json").read_text())
    assert result["scores"]["validation_matched"]["accuracy"] == 70.0 and result["seed"] == 2
    assert json.loads((run / "predictions_validation_matched.json").read_text()) == {"ex0": 1}
    assert not (run / sw.WORK).exists()  # the fine-tuning's scratch files are gone


def test_ties_go_to_the_first_grid_point(tmp_path):
    s = _sweep(tmp_path, tasks=("mrpc",), lrs=(1e-5,))  # two batch sizes, same scores
    sw.execute(s, tmp_path, Fake(), log=lambda _: None)
    assert sw.summarize(s, tmp_path)["tasks"][0]["cells"]["a"]["best_point"]["batch_size"] == 16


def test_a_stopped_sweep_resumes_without_redoing_finished_runs(tmp_path):
    s = _sweep(tmp_path)
    first = Fake()
    assert sw.execute(s, tmp_path, first, max_runs=5, log=lambda _: None) == {"done_before": 0, "ran": 5, "left": 7}
    done = sorted(tmp_path.glob("a/mnli/*/seed*/result.json"))
    stamps = {p: p.stat().st_mtime_ns for p in done}
    assert len(done) == 5
    report = sw.summarize(s, tmp_path)
    assert report["incomplete"] == ["mnli x a: 5 of 12 runs"]
    # interrupted in the middle of its third run: that run leaves nothing behind, the two before it are kept
    broken = Fake(fail_at=3)
    with pytest.raises(KeyboardInterrupt):
        sw.execute(s, tmp_path, broken, log=lambda _: None)
    assert len(list(tmp_path.glob("a/mnli/*/seed*/result.json"))) == 7
    assert not [p for p in tmp_path.glob("a/mnli/*/.*") if p.is_dir()]  # no half-written run directory
    rest = Fake()
    assert sw.execute(s, tmp_path, rest, log=lambda _: None) == {"done_before": 7, "ran": 5, "left": 0}
    assert rest.calls[0] == broken.calls[-1]  # the interrupted run is run again
    assert set(first.calls) | set(broken.calls) | set(rest.calls) == {
        ("a", "mnli", p, k) for p in MNLI for k in (1, 2, 3)
    }
    assert len(first.calls) + len(broken.calls) - 1 + len(rest.calls) == 12
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # finished runs untouched
    again = Fake()
    assert sw.execute(s, tmp_path, again, log=lambda _: None)["done_before"] == 12 and not again.calls


def test_shards_split_the_plan_without_overlap(tmp_path):
    s = _sweep(tmp_path, tasks=("mnli", "mrpc"))
    fakes = [Fake() for _ in range(3)]
    for i, f in enumerate(fakes):
        sw.execute(s, tmp_path, f, shard=(i, 3), log=lambda _: None)
    calls = [c for f in fakes for c in f.calls]
    assert len(calls) == len(set(calls)) == 24
    assert sw.summarize(s, tmp_path)["incomplete"] == []


def test_a_resume_with_other_settings_is_refused(tmp_path):
    s = _sweep(tmp_path)
    sw.execute(s, tmp_path, Fake(), max_runs=1, log=lambda _: None)
    with pytest.raises(sw.SweepError, match=r"limit_train: None -> 10.*--allow-changed-settings"):
        sw.execute(_sweep(tmp_path, limit_train=10), tmp_path, Fake(), log=lambda _: None)
    other_ckpt = _sweep(tmp_path, models=(sw.Model("a", str(tmp_path / "elsewhere")),))
    with pytest.raises(sw.SweepError, match="model: "):
        sw.execute(other_ckpt, tmp_path, Fake(), log=lambda _: None)
    other_grid = Protocol(
        name="t",
        paper="test",
        suites={"glue": ("mnli",)},
        settings={"mnli": TaskSetting(lrs=(1e-5, 2e-5), batch_sizes=(16, 32), warmup_fraction=0.06)},
    )
    with pytest.raises(sw.SweepError, match="setting"):
        sw.execute(_sweep(tmp_path, protocol=other_grid), tmp_path, Fake(), log=lambda _: None)
    # narrowing is no change of settings: fewer runs of the same sweep
    sw.execute(_sweep(tmp_path, lrs=(2e-5,), seeds=(1,)), tmp_path, Fake(), log=lambda _: None)
    # the override keeps the runs done and records the history
    f = Fake()
    sw.execute(other_ckpt, tmp_path, f, allow_changed_settings=True, max_runs=1, log=lambda _: None)
    recorded = json.loads((tmp_path / "a" / "mnli" / "settings.json").read_text())
    assert recorded["model"] == str(tmp_path / "elsewhere")
    assert recorded["history"][0]["model"] == str(tmp_path / "ckpt_a")
    assert len(list(tmp_path.glob("a/mnli/*/seed*/result.json"))) == 1 + 2 + 1


def test_a_narrowed_sweep_says_so(tmp_path):
    assert _sweep(tmp_path, tasks=("mnli", "mrpc")).narrowed() == []
    s = _sweep(tmp_path, lrs=(2e-5,), seeds=(1, 3), limit_train=8, limit_eval=4)
    assert [(r.point.lr, r.seed) for r in s.runs()] == [(2e-5, 1), (2e-5, 3), (2e-5, 1), (2e-5, 3)]
    assert s.narrowed() == [
        "glue: only mnli of mnli, mrpc",
        "mnli: 2 of 4 grid points",
        "mnli: seeds 1 3 of 1 2 3",
        "training sets cut to their first 8 examples",
        "dev sets cut to their first 4 examples",
    ]
    run = s.runs()[0]
    assert (run.limit_train, run.limit_eval) == (8, 4)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(lrs=(3e-5,)), r"--lr 3e-05: not in protocol t's grid"),
        (dict(seeds=(1, 7)), r"--seeds 7: not in"),
        (dict(tasks=("rte",)), r"task 'rte' is not part of protocol t"),
        (dict(limit_eval=0), r"--limit-eval must be >= 1"),
        (dict(models=(sw.Model("a", "x"), sw.Model("a", "y"))), r"model tags must differ"),
    ],
)
def test_bad_sweeps_are_refused(tmp_path, kw, match):
    with pytest.raises(sw.SweepError, match=match):
        _sweep(tmp_path, **kw)


# ------------------------------------------------------------------------------------------------ end to end
WORDS = ["the", "cat", "dog", "sat", "ran", "on", "mat", "not", "a", "big", "small", "is", "was", "."]


def _tiny_glue(root: Path) -> Path:
    """An RTE directory in GLUE's TSV layout: the hypothesis negates the premise ("not") -> not_entailment."""
    import random

    rng = random.Random(0)
    rte = root / "RTE"
    rte.mkdir(parents=True)
    for name, n in (("train.tsv", 24), ("dev.tsv", 8)):
        lines = ["index\tsentence1\tsentence2\tlabel"]
        for i in range(n):
            a, b = rng.choice(["cat", "dog"]), rng.choice(["mat", "dog", "cat"])
            neg = rng.random() < 0.5
            premise = f"the {a} sat on the {b} ."
            hypothesis = f"the {a} was {'not ' if neg else ''}on a {b} ."
            lines.append(f"{i}\t{premise}\t{hypothesis}\t{'not_entailment' if neg else 'entailment'}")
        (rte / name).write_text("\n".join(lines) + "\n")
    return root


def _tiny_bert(out: Path) -> Path:
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    out.mkdir(parents=True)
    (out / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tok = BertTokenizerFast(vocab=str(out / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    BertForMaskedLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_real_fine_tunings_through_the_command_stop_and_resume(tmp_path, monkeypatch, capsys):
    """A 2 x 2 grid (lr x batch) of real fine-tunings (tools/finetune.py on a tiny BERT, the RTE TSV reader, the
    metrics): the command stops after two runs, the same command does the other two, the scores in result.json are
    the accuracy of the kept predictions (scikit-learn), and the table is written."""
    from sklearn.metrics import accuracy_score

    from tools.evaluate import __main__ as entry
    from tools.evaluate import cli
    from tools.evaluate.data import load_split
    from tools.evaluate.protocols import PROTOCOLS

    tiny = Protocol(
        name="tiny",
        paper="test",
        suites={"glue": ("rte",)},
        settings={"rte": TaskSetting(lrs=(1e-3, 3e-3), batch_sizes=(8, 16), epochs=(1.0,), seeds=(1,))},
    )
    monkeypatch.setattr(cli, "PROTOCOLS", {**PROTOCOLS, "tiny": tiny})
    data, model = _tiny_glue(tmp_path / "glue"), _tiny_bert(tmp_path / "bert")
    out = tmp_path / "out"
    args = ["--protocol", "tiny", "--model", f"tiny={model}", "--data-dir", str(data), "--output-dir", str(out),
            "--device", "cpu", "--precision", "fp32"]  # fmt: skip
    assert entry.main([*args, "--max-runs", "2"]) == 0
    assert "2 runs now, 0 done before, 2 left" in capsys.readouterr().out
    first = sorted(out.glob("tiny/rte/*/seed1/result.json"))
    stamps = [p.stat().st_mtime_ns for p in first]
    assert entry.main(args) == 0
    assert "2 runs now, 2 done before, 0 left" in capsys.readouterr().out
    assert [p.stat().st_mtime_ns for p in first] == stamps
    dev = load_split("rte", data, "validation")
    gold = [ex.label for ex in dev]
    for res in sorted(out.glob("tiny/rte/*/seed1/result.json")):
        r = json.loads(res.read_text())
        preds = json.loads((res.parent / "predictions_validation.json").read_text())
        assert list(preds) == [ex.id for ex in dev]
        assert r["scores"]["validation"]["accuracy"] == pytest.approx(100 * accuracy_score(gold, list(preds.values())))
        assert r["train_seconds"] > 0 and r["train_tokens"] > 0 and r["steps"] > 0
        assert not (res.parent / sw.WORK).exists()
    report = json.loads((out / "table.json").read_text())
    cell = report["tasks"][0]["cells"]["tiny"]
    assert (cell["runs_done"], cell["runs_planned"]) == (4, 4)
    assert report["narrowed"] == [] and report["incomplete"] == []
    assert "| RTE | accuracy |" in (out / "table.md").read_text()


def test_every_protocol_names_registered_tasks_of_their_suites():
    from tools.evaluate.protocols import PROTOCOLS
    from tools.evaluate.tasks import SUITES

    for p in PROTOCOLS.values():
        for suite, tasks in p.suites.items():
            assert set(tasks) <= set(SUITES[suite]), (p.name, suite)
            assert all(TASKS[t].suite == suite for t in tasks)
            for t in tasks:
                assert p.settings[t].source, (p.name, t)  # every setting says where it comes from
