"""A real one-rank gloo process group in the test process, for the trainer's parts (their collectives run as on
rank 0 of a one-rank job): ``with one_rank_group(tmp_path): ...``."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import torch
import torch.distributed as dist


@contextlib.contextmanager
def one_rank_group(tmp: Path) -> Iterator[SimpleNamespace]:
    """The group (a file store under ``tmp``) and this rank's DistInfo-like record; destroyed on the way out."""
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'group-store'}", rank=0, world_size=1)
    try:
        yield SimpleNamespace(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    finally:
        dist.destroy_process_group()
