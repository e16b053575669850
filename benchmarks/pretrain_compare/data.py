"""Preparing the shards and vocabulary a comparison trains on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Sequence

from benchmarks.pretrain_compare.presets import REPO


def prepare_data(
    out: Path,
    train_inputs: Sequence[str],
    valid_inputs: Sequence[str],
    vocab_file: str,
    tokenizer_type: str,
    workers: int,
) -> tuple[list[str], list[str]]:
    """Preprocess raw train and held-out inputs (files, dirs, globs) with data_pipeline.preprocess into
    ``out/data``; a shard that already exists is reused. Held-out documents never enter the training shard."""
    data = out / "data"
    prefixes = []
    for name, inputs in (("train", train_inputs), ("valid", valid_inputs)):
        prefix = data / name
        shard = Path(f"{prefix}_text_sentence")
        if not Path(f"{shard}.idx").exists():
            cmd = [
                sys.executable,
                "-m",
                "data_pipeline.preprocess",
                "--input",
                *inputs,
                "--output-prefix",
                str(prefix),
                "--tokenizer-type",
                tokenizer_type,
                "--vocab-file",
                vocab_file,
                "--split-sentences",
                "--workers",
                str(workers),
            ]
            print(f"[compare] preprocess {name}: {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, cwd=REPO, check=True)
        prefixes.append(str(shard))
    return [prefixes[0]], [prefixes[1]]
