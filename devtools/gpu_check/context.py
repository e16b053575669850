"""What the step builders know about a run: where things go, the device, its precisions."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

LOGS = "logs"
"""The report directory's subfolder of long outputs (every step's log, the set-up's, the profile's chrome trace):
kept next to report.md and report.json, never committed (.gitignore: docs/gpu_reports/**/logs/)."""


@dataclass
class Ctx:
    """What the step builders need to know about this run."""

    out: Path
    """Report directory: report.md and report.json, the long outputs under logs/."""
    work: Path
    """Scratch directory (shards, checkpoints, JUnit files)."""
    quick: bool = False
    device: str = "cuda"
    """'cuda', or 'cpu' for --rehearse-on-cpu (the same commands at CPU sizes, to test the plumbing)."""
    gpus: int = 1
    bf16: bool = True
    """bf16 hardware (sm80+ on CUDA)."""
    fp16: bool = True
    """fp16 training possible (always on CUDA; on CPU only where DeepSpeed accepts it)."""
    python: str = sys.executable

    @property
    def logs(self) -> Path:
        """Where the steps' full outputs go (the report keeps the end of a failed one)."""
        return self.out / LOGS

    @property
    def data(self) -> Path:
        """The sample corpus's vocab and shards, built once by the ``data`` step for the smoke and the benchmarks."""
        return self.work / "data"

    @property
    def shards(self) -> list[str]:
        """The benchmarks' flags that read the shards (the trainer's own batches)."""
        return ["--data-path", str(self.data / "sample_text_sentence"), "--vocab-file", str(self.data / "vocab.txt")]

    @property
    def precisions(self) -> list[str]:
        """Training precisions: fp16 with loss scaling everywhere it runs, bf16 where the hardware has it."""
        return [p for p, ok in (("fp16", self.fp16), ("bf16", self.bf16)) if ok]

    @property
    def low_precision(self) -> str:
        """The one precision of the benchmarks: bf16 where available, else fp16 (CPU rehearsal: bf16)."""
        return "bf16" if self.bf16 else "fp16"
