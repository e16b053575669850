"""mpirun: K ranks split the inputs, rank 0 merges; the output does not depend on K."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.preprocess_utils import REPO, preprocess_cmd

SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_mpirun_two_ranks_equals_single_process(bert_uncased_vocab, tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed (run_scripts/setup_env.sh installs openmpi)")
    subprocess.run(
        preprocess_cmd(SAMPLE, tmp_path / "one", bert_uncased_vocab, "--workers", "1"),
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    r = subprocess.run(
        [
            mpirun,
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            *preprocess_cmd(SAMPLE, tmp_path / "two", bert_uncased_vocab, "--workers", "1"),
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
