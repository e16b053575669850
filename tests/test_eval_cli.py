"""``python -m tools.evaluate``: bad input is one line naming the nearest choice; the command runs, stops, resumes
and writes the table (with a fake fine-tuning: the real one is tests/test_eval_e2e.py's)."""

from __future__ import annotations

import json

import pytest

from tests.test_eval_sweep import Fake
from tools.evaluate import __main__ as entry
from tools.evaluate import sweep as sw
from tools.evaluate.protocols import PROTOCOLS


@pytest.fixture
def dirs(tmp_path):
    for d in ("data", "m1", "m2"):
        (tmp_path / d).mkdir()
    return tmp_path


def _args(d, *extra):
    return ["--data-dir", str(d / "data"), "--output-dir", str(d / "out"), "--model", str(d / "m1"), *extra]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--protocol", "sparsbert"], "--protocol 'sparsbert' is not a protocol (did you mean 'sparsebert'?)"),
        (
            ["--protocol", "diet", "--suite", "glu"],
            "--suite 'glu' is not a suite of protocol diet (did you mean 'glue'?)",
        ),
        (["--protocol", "sparsebert", "--tasks", "mrcp"], "(did you mean 'mrpc'?)"),
        (["--protocol", "sparsebert", "--tasks", "mrqa_newsqa"], "protocol sparsebert does not evaluate it (blockbert"),
        (["--protocol", "sparsebert", "--suite", "swag", "--tasks", "rte"], "--tasks rte is not in --suite swag"),
        (["--protocol", "sparsebert", "--lr", "7e-05"], "--lr 7e-05: not in protocol sparsebert's grid"),
        (["--protocol", "sparsebert", "--shard", "3/3"], "--shard 3/3: give I/N with 0 <= I < N"),
        (["--protocol", "sparsebert", "--limit-train", "0"], "--limit-train must be >= 1"),
        (["--protocol", "sparsebert", "--model", "a b=x"], "tag 'a b' must be letters"),
        (["--protocol", "sparsebert", "--model", "t=nowhere"], "--model t=nowhere: nowhere is not a directory"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(dirs, capsys, extra, message):
    assert entry.main(_args(dirs, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tools.evaluate: error: ") and len(err.splitlines()) == 1
    assert message in err


def test_choices_come_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        entry.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Choices: " + ", ".join(PROTOCOLS) + "." in out
    assert "mrqa_hotpotqa" in out and "probe_single" in out


def test_the_command_stops_resumes_and_writes_the_table(dirs, capsys, monkeypatch):
    fake = Fake(mnli_table=False)
    monkeypatch.setattr(sw, "default_run_one", lambda: fake)
    args = _args(dirs, "--model", f"b={dirs / 'm2'}", "--protocol", "headsize", "--tasks", "mnli", "--seeds", "1", "2")
    assert entry.main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[evaluate] 16 runs" in out and "m1/mnli/lr5e-05_bs32_wd0.01_ep3/seed2" in out
    assert entry.main([*args, "--max-runs", "3"]) == 0
    assert "3 runs now, 0 done before, 13 left (run the same command to go on)" in capsys.readouterr().out
    assert entry.main([*args, "--report-only"]) == 0
    out = capsys.readouterr().out
    assert "**Incomplete:** mnli x m1: 3 of 8 runs; mnli x b: 0 of 8 runs." in out
    assert "mnli: seeds 1 2 of 1 2 3" in out  # narrowed
    assert entry.main(args) == 0
    assert "13 runs now, 3 done before, 0 left" in capsys.readouterr().out
    assert len(fake.calls) == len(set(fake.calls)) == 16
    report = json.loads((dirs / "out" / "table.json").read_text())
    assert [m["tag"] for m in report["models"]] == ["m1", "b"] and report["incomplete"] == []
    assert (dirs / "out" / "table.md").read_text().startswith("# Protocol `headsize`")
    # the same sweep with another checkpoint under the same tag is refused
    assert entry.main(_args(dirs, "--model", f"b={dirs / 'm1'}", "--protocol", "headsize", "--tasks", "mnli")) == 2
    assert "--allow-changed-settings" in capsys.readouterr().err


def test_pretrain_compare_hands_its_exports_to_the_command(dirs, capsys):
    """benchmarks/pretrain_compare --to-hf prints a command this CLI runs as it is (the data directory filled in)."""
    import shlex

    from benchmarks.pretrain_compare.handoff import evaluate_command, export_run
    from benchmarks.pretrain_compare.presets import CompareError
    from benchmarks.pretrain_compare.specs import RunSpec

    cmd = evaluate_command(dirs / "cmp", [("dense_s1", dirs / "m1"), ("blockbert_n2_s1", dirs / "m2")])
    argv = shlex.split(cmd)
    assert argv[:3] == ["python", "-m", "tools.evaluate"]
    argv = [str(dirs / "data") if a == "GLUE_DIR" else a for a in argv[3:]]
    assert entry.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"[evaluate] {2 * 8 * 12 * 3} runs" in out  # 2 models x 8 GLUE tasks x 6 lr x 2 wd x 3 seeds
    assert str(dirs / "cmp" / "evaluate" / "blockbert_n2_s1" / "rte") in out
    spec = RunSpec("dense_s1", "dense", 1, [], {})
    with pytest.raises(CompareError, match="--keep-checkpoints"):
        export_run(dirs / "cmp", spec, dirs / "cmp" / "runs" / "dense_s1")


def test_docs_cost_table_is_generated_from_the_registry():
    from pathlib import Path

    from tools.evaluate.protocols import cost_markdown

    doc = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text()
    block = doc.split("tests/test_eval_cli.py checks it is current -->\n", 1)[1].split("<!-- end cost table -->")[0]
    assert block.splitlines() == cost_markdown(), "docs/evaluation.md's cost table is stale: paste cost_markdown()"
