"""The hand-off to downstream evaluation: each finished run's final checkpoint exported to a Hugging Face directory
(``--to-hf``), and the ``python -m tools.evaluate`` command that fine-tunes them side by side (docs/evaluation.md)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from benchmarks.pretrain_compare.presets import CompareError
from benchmarks.pretrain_compare.specs import RunSpec


def hf_dir(out: Path, spec: RunSpec) -> Path:
    """Where ``--to-hf`` puts a run's export: ``OUT/hf/<run name>``."""
    return Path(out) / "hf" / spec.name


def export_run(out: Path, spec: RunSpec, run_dir: Path) -> Path:
    """Export the run's newest checkpoint (once: an existing export is kept)."""
    from tools.hf_export.export import ds_to_hf

    dest = hf_dir(out, spec)
    if (dest / "config.json").exists():
        return dest
    if not (run_dir / "ckpt" / "latest").exists():
        raise CompareError(
            f"--to-hf: {spec.name} has no checkpoint left in {run_dir / 'ckpt'} (finished runs' checkpoints are "
            "deleted unless --keep-checkpoints); give --to-hf from the first sitting, or retrain that run"
        )
    ds_to_hf(str(run_dir / "ckpt"), str(dest))
    return dest


def evaluate_command(out: Path, exports: Sequence[tuple[str, Path]]) -> str:
    """The evaluation of the exports (tag = run name), with the data directory left to fill in."""
    models = " ".join(f"--model {shlex.quote(f'{tag}={path}')}" for tag, path in exports)
    return (
        f"python -m tools.evaluate --protocol sparsebert --suite glue --data-dir GLUE_DIR "
        f"--output-dir {shlex.quote(str(Path(out) / 'evaluate'))} {models}"
    )
