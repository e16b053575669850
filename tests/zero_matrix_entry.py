"""Run by tests/test_zero_matrix.py under `deepspeed --num_gpus 2`: for every case of a spec file, three real
Trainer runs in one process group (straight; stop at --exit-interval after saving; --load and finish), so one launch
covers every model family under one ZeRO stage. The group is created once and destroyed at the end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pretrain.trainer as trainer_module  # noqa: E402
from common.process import exit_process  # noqa: E402
from pretrain.args import parse_args  # noqa: E402
from pretrain.distributed import destroy_distributed  # noqa: E402


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    trainer_module.destroy_distributed = lambda: None  # keep the group between runs; destroyed once below
    try:
        for case in spec["cases"]:
            for run_args in case["runs"]:
                trainer = trainer_module.Trainer(parse_args(run_args))
                try:
                    trainer.train()
                finally:
                    trainer.close()
            print(f"[zero_matrix] case {case['name']} done", flush=True)
    finally:
        destroy_distributed()
    return 0


if __name__ == "__main__":
    exit_process(main(next(a for a in sys.argv[1:] if not a.startswith("--local_rank"))))
