"""Reading the trainer's JSON log of a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_log(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training records, validation records) of a run's --log-json, one per iteration: a resumed run repeats the
    iterations after its checkpoint, and the later (resumed) record wins."""
    train: dict[int, dict[str, Any]] = {}
    valid: dict[int, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            (valid if "valid" in rec else train)[int(rec["iteration"])] = rec
    return [train[k] for k in sorted(train)], [valid[k] for k in sorted(valid)]
