"""Helpers of the preprocessing tests that run `python -m data_pipeline.preprocess` as a user would: the command,
shard comparison and a SIGKILL once some inputs are done (shared by the per-file and the per-stream resume tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def preprocess_cmd(inputs: Path, prefix: Path, vocab: Path, *extra: str) -> list[str]:
    """Sentence-split BERT WordPiece preprocessing of `inputs` into `prefix`, without a progress bar."""
    return [
        sys.executable,
        "-m",
        "data_pipeline.preprocess",
        "--input",
        str(inputs),
        "--output-prefix",
        str(prefix),
        "--tokenizer-type",
        "BertWordPieceLowerCase",
        "--vocab-file",
        str(vocab),
        "--split-sentences",
        "--no-progress",
        *extra,
    ]


def same_shards(a: Path, b: Path) -> bool:
    """Whether the two runs wrote byte-identical sentence shards (.bin and .idx)."""
    return all(
        Path(f"{a}_text_sentence{e}").read_bytes() == Path(f"{b}_text_sentence{e}").read_bytes()
        for e in (".bin", ".idx")
    )


def kill_when_done(cmd: list[str], prefix: Path, done: int, timeout: float) -> int:
    """Start `cmd`, SIGKILL it once `done` inputs have finished (their *.done.json markers), return how many had."""
    parts = Path(f"{prefix}.parts")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if parts.is_dir() and len(list(parts.glob("*.done.json"))) >= done:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished (or the wait timed out) before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return len(list(parts.glob("*.done.json")))
