"""mpirun: K ranks split the inputs, rank 0 merges; the output does not depend on K."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_mpirun_two_ranks_equals_single_process(bert_uncased_vocab, tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed (run_scripts/setup_env.sh installs openmpi)")
    args = [
        "-m",
        "data_pipeline.preprocess",
        "--input",
        str(SAMPLE),
        "--tokenizer-type",
        "BertWordPieceLowerCase",
        "--vocab-file",
        str(bert_uncased_vocab),
        "--split-sentences",
        "--workers",
        "1",
        "--no-progress",
    ]
    subprocess.run(
        [sys.executable, *args, "--output-prefix", str(tmp_path / "one")], cwd=REPO, check=True, capture_output=True
    )
    r = subprocess.run(
        [
            mpirun,
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            sys.executable,
            *args,
            "--output-prefix",
            str(tmp_path / "two"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 1/2" in r.stderr  # both ranks really worked
    for ext in (".bin", ".idx"):
        one, two = tmp_path / f"one_text_sentence{ext}", tmp_path / f"two_text_sentence{ext}"
        assert one.read_bytes() == two.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("two")) == [
        "two_text_sentence.bin",
        "two_text_sentence.idx",
    ]
    assert (tmp_path / "reports" / "two.report.json").is_file()
