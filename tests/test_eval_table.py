"""tools/evaluate/table.py: one column per checkpoint, MNLI as m/mm, QA as EM/F1, the GLUE average as the papers
compute it (nine columns), spread and compute, narrowed and incomplete sweeps marked; JSON round trip."""

from __future__ import annotations

import json
import statistics

from tests.test_eval_sweep import Fake
from tools.evaluate import sweep as sw
from tools.evaluate import table
from tools.evaluate.protocols import PROTOCOLS
from tools.evaluate.tasks import TASKS, columns


def _row(md: str, title: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(f"| {title} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_glue_table_side_by_side_with_the_papers_average(tmp_path):
    proto = PROTOCOLS["sparsebert"]
    models = (sw.Model("dense", "d"), sw.Model("b", "b"))
    s = sw.Sweep(proto, models, tasks=proto.suites["glue"], data_dir="x", lrs=(1e-5, 2e-5), weight_decays=(0.01,))
    sw.execute(s, tmp_path, Fake(mnli_table=False), log=lambda _: None)
    report = sw.summarize(s, tmp_path)
    md, js = table.write(report, tmp_path)
    text = md.read_text()
    assert json.loads(js.read_text()) == json.loads(json.dumps(report))
    # the fake scores 50 + 1e5 lr + seed (+1 for model b): best lr 2e-5, median seed 2 -> 54 / 55, spread 53-55
    assert _row(text, "MNLI (m/mm)") == ["MNLI (m/mm)", "accuracy", "54.0/54.0 [53.0-55.0, 53.0-55.0]",
                                         "55.0/55.0 [54.0-56.0, 54.0-56.0]"]  # fmt: skip
    assert _row(text, "CoLA")[1:3] == ["matthews", "54.0 [53.0-55.0]"]
    assert _row(text, "STS-B")[1] == "spearman"
    # the average over the nine columns (m and mm apart), through tasks.suite_average
    cols = columns("glue")
    assert len(cols) == 9
    avg = report["averages"]["glue"]
    assert avg == {"dense": statistics.fmean([54.0] * 9), "b": 55.0}
    assert _row(text, "GLUE average")[2:] == ["54.0", "55.0"]
    assert "| task | metric | dense | b |" in text
    assert "**Narrowed sweep, not the protocol's:** mnli: 2 of 12 grid points" in text
    # compute per fine-tuning and the best point
    assert "lr 2e-05, bs 32, wd 0.01, 3 ep; 1.5 s, 100 tok per run; 6 runs, 9 s total" in _row(text, "MNLI")[1]


def test_qa_shows_em_and_f1_and_an_incomplete_sweep_has_no_average(tmp_path):
    proto = PROTOCOLS["blockbert"]
    s = sw.Sweep(proto, (sw.Model("bb", "p"),), tasks=("squad2",), data_dir="x", lrs=(5e-6,), batch_sizes=(16,))
    sw.execute(s, tmp_path, Fake(), max_runs=2, log=lambda _: None)
    report = sw.summarize(s, tmp_path)
    text = table.markdown(report)
    assert TASKS["squad2"].table_metric == "best_f1"
    assert _row(text, "SQuAD v2.0")[1:] == ["best_exact/best_f1", "52.0/52.0 [51.5-52.5] (2/3 runs)"]
    assert "**Incomplete:** squad2 x bb: 2 of 3 runs." in text
    assert "Not reproduced: BlockBERT splits each MRQA development set" in text
    empty = sw.Sweep(proto, (sw.Model("bb", "p"),), tasks=("mrqa_newsqa",), data_dir="x")
    text = table.markdown(sw.summarize(empty, tmp_path))
    assert _row(text, "NewsQA")[1:] == ["exact/f1", "-"]
    assert "0/30 runs" in text
    assert "MRQA average" not in text  # one task, no runs: no average row


def test_a_glue_sweep_without_every_task_has_no_average(tmp_path):
    proto = PROTOCOLS["sparsebert"]
    s = sw.Sweep(proto, (sw.Model("d", "p"),), tasks=("rte", "swag"), data_dir="x", lrs=(1e-5,), seeds=(1,))
    sw.execute(s, tmp_path, Fake(), log=lambda _: None)
    text = table.markdown(sw.summarize(s, tmp_path))
    assert _row(text, "GLUE average")[2:] == ["-"]  # the papers' average needs all nine columns
    assert "SWAG average" not in text  # one task: no average row
    assert "glue: only rte of mnli, qqp, qnli, sst2, cola, stsb, mrpc, rte" in text


def test_a_negative_spread_reads_as_a_range():
    """STS-B's Spearman or CoLA's Matthews can be below 0: ``-19.0 to 4.0``, not ``-19.0-4.0``."""
    row = {"eval_splits": ["validation"]}
    cell = {"median": {"validation": {"spearman": -5.0}}, "spread": {"validation": [-19.0, 4.0]}, "runs_done": 3,
            "runs_planned": 3}  # fmt: skip
    assert table.cell_text(row, cell, ("spearman",)) == "-5.0 [-19.0 to 4.0]"
    cell["spread"]["validation"] = [1.0, 4.0]
    assert table.cell_text(row, cell, ("spearman",)) == "-5.0 [1.0-4.0]"
