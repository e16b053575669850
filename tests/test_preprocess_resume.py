"""Resume: a run killed with SIGKILL mid-way and rerun with --resume ends byte-identical, skipping done inputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.preprocess_utils import REPO, kill_when_done, preprocess_cmd, same_shards

SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"


@pytest.fixture(scope="module")
def many_inputs(tmp_path_factory) -> Path:
    """40 input files (copies of the sample books and articles, each slightly different)."""
    d = tmp_path_factory.mktemp("inputs")
    srcs = sorted((SAMPLE / "books").glob("*.txt")) + [SAMPLE / "jsonl" / "articles.jsonl"]
    for i in range(40):
        src = srcs[i % len(srcs)]
        text = src.read_text(encoding="utf-8")
        if src.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines()]
            text = "".join(json.dumps({"text": f"Copy {i}. " + r["text"]}) + "\n" for r in rows)
        else:
            text = text.replace("CHAPTER 1.", f"CHAPTER 1. Copy {i}.")
        (d / f"in{i:02d}{src.suffix}").write_text(text, encoding="utf-8")
    return d


def _cmd(inputs: Path, prefix: Path, vocab: Path, *extra: str) -> list[str]:
    return preprocess_cmd(inputs, prefix, vocab, "--workers", "1", "--chunk-chars", "20000", *extra)


@pytest.mark.timeout(300)
def test_sigkill_then_resume_is_byte_identical(many_inputs, bert_uncased_vocab, tmp_path):
    ref = tmp_path / "ref"
    subprocess.run(_cmd(many_inputs, ref, bert_uncased_vocab), cwd=REPO, check=True, capture_output=True)

    out = tmp_path / "run"
    parts = Path(f"{out}.parts")
    done = kill_when_done(_cmd(many_inputs, out, bert_uncased_vocab), out, 3, timeout=120)
    assert 3 <= done < 40
    assert not Path(f"{out}_text_sentence.bin").exists()  # nothing final after a kill

    # without --resume the leftover progress file is an error that says what to do
    r = subprocess.run(_cmd(many_inputs, out, bert_uncased_vocab), cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "--resume" in r.stderr and "progress.json" in r.stderr

    # an input that changed since its part was finished (new mtime) is redone; the others are skipped
    first = sorted(many_inputs.iterdir())[0]
    st = first.stat()
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    try:
        r = subprocess.run(
            _cmd(many_inputs, out, bert_uncased_vocab, "--resume"), cwd=REPO, capture_output=True, text=True
        )
    finally:
        os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert r.returncode == 0, r.stderr
    assert f"{done - 1} of 40 input file(s) already done, skipped" in r.stderr
    assert same_shards(out, ref)
    assert not parts.exists() and not Path(f"{out}.progress.json").exists()


@pytest.mark.timeout(120)
def test_resume_refuses_a_run_with_other_settings(many_inputs, bert_uncased_vocab, tmp_path):
    from data_pipeline import resume as rs
    from data_pipeline.preprocess import config_from_args, main

    small = tmp_path / "small"
    small.mkdir()
    for f in sorted(many_inputs.iterdir())[:2]:
        shutil.copy(f, small / f.name)
    out = tmp_path / "o"
    base = _cmd(small, out, bert_uncased_vocab)[3:]
    cfg = config_from_args(base)
    files = sorted(str(p) for p in small.iterdir())
    layout = rs.RunLayout(str(out))
    rs.prepare(layout, rs.settings_hash(cfg.output_settings()), files, resume=False)  # as left by a killed run
    with pytest.raises(rs.ResumeError, match="different settings"):
        rs.prepare(layout, rs.settings_hash(config_from_args(base + ["--append-eod"]).output_settings()), files, True)
    with pytest.raises(rs.ResumeError, match="different input list"):
        rs.prepare(layout, rs.settings_hash(cfg.output_settings()), files[:1], True)
    assert main(base + ["--resume", "--append-eod"]) == 2
    assert main(base + ["--resume", "--workers", "2"]) == 0  # workers do not change the output: allowed
    assert Path(f"{out}_text_sentence.bin").exists() and not Path(layout.manifest).exists()
