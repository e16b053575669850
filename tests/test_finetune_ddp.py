"""``torchrun --nproc_per_node 2 -m tools.finetune``: data-parallel fine-tuning through HF's Trainer (DDP, gloo on
CPU). Rank 0 alone writes metrics.json and predictions.jsonl and prints the summary; the predictions cover every dev
example in order (a learnable task scores far above chance only if the gathered logits line up with their
examples); the compute counts both ranks."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_finetune import _export, _single_token_words, _tokenizer, _write_jsonl

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.extended, pytest.mark.timeout(600)]


def _launch(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return subprocess.run(
        [*cmd, "-m", "tools.finetune", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=480,
    )


def test_two_ranks_train_once_and_rank_zero_writes_complete_predictions(tmp_path):
    tok = _tokenizer(tmp_path / "tok")
    words = _single_token_words(tok, 22)
    rng = random.Random(0)

    def rows(n):
        out = []
        for i in range(n):
            label = "yes" if i % 2 == 0 else "no"
            ws = rng.sample(words[2:], 5)
            ws.insert(rng.randrange(6), words[0] if label == "yes" else words[1])
            out.append({"id": f"r{i}", "sentence1": " ".join(ws), "label": label})
        return out

    train, dev = _write_jsonl(tmp_path / "train.jsonl", rows(64)), _write_jsonl(tmp_path / "dev.jsonl", rows(33))
    model = _export(tmp_path / "dense", tok)
    out = tmp_path / "out"
    flags = ["--model", str(model), "--task", "classification", "--train", str(train), "--dev", str(dev)]
    p = _launch([*flags, "--output-dir", str(out), "--epochs", "15", "--batch-size", "8", "--lr", "3e-3"], REPO)
    assert p.returncode == 0, p.stdout[-4000:]
    summaries = [line for line in p.stdout.splitlines() if line.startswith('{"task"')]
    assert len(summaries) == 1, p.stdout[-3000:]  # rank 0 alone prints
    m = json.loads((out / "metrics.json").read_text())
    assert m["world_size"] == 2
    # 64 examples / (8 per rank x 2 ranks) = 4 steps an epoch, 15 epochs; both ranks' rows counted
    assert m["steps"] == 60 and m["train_examples"] == 64 * 15
    assert m["train_tokens"] == 64 * 15 * 8  # every sentence is [CLS] + 6 words + [SEP]
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in preds] == [f"r{i}" for i in range(33)]  # complete, in order, no duplicate of padding
    assert m["accuracy"] >= 100 * 30 / 33, m  # percent
    assert not list(out.glob("*.tmp"))
