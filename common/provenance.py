"""Which commit a measurement ran: every benchmark report and the GPU check name it, so a figure can be traced."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commit_info() -> tuple[str | None, str]:
    """(commit, where it came from): $GPU_CHECK_COMMIT when set (a copied tree may carry a stale .git: the first GPU
    run's did), else git, else a COMMIT file in the repository root (a copy of the tree without .git), else
    unknown."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"].strip(), "GPU_CHECK_COMMIT"
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
            return r.stdout.strip() + ("-dirty" if dirty else ""), "git"
    except (OSError, subprocess.SubprocessError):
        pass
    f = REPO / "COMMIT"
    if f.is_file() and f.read_text().strip():
        return f.read_text().split()[0], "COMMIT file"
    return None, "unknown (no git, no GPU_CHECK_COMMIT, no COMMIT file)"
