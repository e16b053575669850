"""Run by tests/test_host_syncs.py as one rank (`python tests/host_sync_entry.py OUT.json TRAINER_FLAGS...`): builds
the real Trainer, takes two warm-up steps, then counts the host syncs the next steps would make on a GPU
(benchmarks/support/host_syncs.py: what CUDA's sync debug mode flags, with where each tensor would live), and writes
where in our code, DeepSpeed's or torch's each one was made.

Host-batch work is not counted and lives on the host (the DataLoader's batches, `Trainer.count_tokens`); the batch
that `Trainer.to_device` returns lives on the device (on CUDA it is staged through pinned memory, non-blocking).
Counting starts after two warm-up steps (plans and caches are built on the first; DeepSpeed's throughput timer starts
timing at its third step).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pretrain.trainer as trainer_module  # noqa: E402
from benchmarks.support.host_syncs import HostSyncCounter  # noqa: E402
from common.process import exit_process  # noqa: E402
from pretrain.args import parse_args  # noqa: E402


def main(out: str, argv: list[str]) -> int:
    steps = 3
    trainer = trainer_module.Trainer(parse_args(argv))
    try:
        trainer.engine.train()
        for _ in range(2):  # warm-up: plans and caches are built on the first step
            trainer.train_step()
        counter = HostSyncCounter(skip=(Path(__file__),))
        trainer.count_tokens = counter.host(trainer.count_tokens)
        trainer.to_device = counter.to_device(trainer.to_device)
        batches = trainer.train_iter

        class HostBatches:  # the DataLoader's collation runs on host tensors (in worker processes when num_workers>0)
            def __next__(self):
                return next_batch()

        next_batch = counter.host(lambda: next(batches))

        trainer.train_iter = HostBatches()
        with counter:
            for _ in range(steps):
                trainer.train_step()
        Path(out).write_text(json.dumps({"steps": steps, "gas": trainer.batch.gas, "sites": dict(counter.sites)}))
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1], sys.argv[2:]))
