"""Run by tests/test_compile.py as one rank (`python tests/recompile_entry.py OUT.json TRAINER_FLAGS...`): the real
Trainer with --compile takes training steps over padded and unpadded batches in turn, then evaluates; writes how many
graphs Dynamo compiled for training and in all, and its graph breaks.

DeepSpeed's ``engine.compile()`` gets the ``eager`` backend here: the graphs, guards and recompiles are Dynamo's,
decided before any backend sees a graph, and ``eager`` spares inductor's C++ code generation on CPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch._dynamo.utils  # noqa: E402

import pretrain.trainer as trainer_module  # noqa: E402
from common.process import exit_process  # noqa: E402
from pretrain.args import parse_args  # noqa: E402

STEPS = 3


def padded_and_unpadded(batches):
    """Each host batch twice: with padding at the end of its first row, and with none (an all-ones mask)."""
    for batch in batches:
        padded = {k: v.clone() for k, v in batch.items()}
        padded["attention_mask"][0, -8:] = 0
        yield padded
        unpadded = {k: v.clone() for k, v in batch.items()}
        unpadded["attention_mask"].fill_(1)
        yield unpadded


def main(out: str, argv: list[str]) -> int:
    from deepspeed.runtime.engine import DeepSpeedEngine

    real_compile = DeepSpeedEngine.compile

    def compile_eager(self, *a, **k):
        k.pop("backend", None)
        return real_compile(self, *a, backend="eager", **k)

    DeepSpeedEngine.compile = compile_eager
    trainer = trainer_module.Trainer(parse_args([*argv, "--compile"]))
    try:
        trainer.train_iter = padded_and_unpadded(trainer.train_iter)
        torch._dynamo.utils.counters.clear()
        for _ in range(STEPS):
            trainer.train_step()
        train_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        evaluation = trainer.evaluate()
        counters = torch._dynamo.utils.counters
        Path(out).write_text(
            json.dumps(
                {
                    "train_graphs": train_graphs,
                    "graphs": counters["stats"]["unique_graphs"],
                    "graph_breaks": dict(counters["graph_break"]),
                    "micro_batches": STEPS * trainer.gas,
                    "evaluation": evaluation,
                }
            )
        )
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1], sys.argv[2:]))
