"""Run by tests/test_compile.py as one rank (`python tests/recompile_entry.py OUT.json TRAINER_FLAGS...`): the real
Trainer with --compile takes training steps over padded and unpadded batches in turn (two rounds), then evaluates;
writes how many graphs Dynamo compiled after each round and in all, its graph breaks and recompiles, and for each
training graph whether its attention calls (SDPA) received a mask.

DeepSpeed's ``engine.compile()`` gets a recording backend that runs the traced graph as it is (the ``eager``
backend's work): the graphs, guards and recompiles are Dynamo's, decided before any backend sees a graph, and
running the graph uncompiled spares inductor's C++ code generation on CPU.
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


def sdpa_masks(gm: torch.fx.GraphModule) -> list[bool]:
    """For each SDPA call of a traced graph: whether it was given an ``attn_mask``."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target):
            mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
            out.append(mask is not None)
    return out


def main(out: str, argv: list[str]) -> int:
    from deepspeed.runtime.engine import DeepSpeedEngine

    graphs: list[list[bool]] = []

    def recording_backend(gm, example_inputs):
        graphs.append(sdpa_masks(gm))
        return gm.forward

    real_compile = DeepSpeedEngine.compile

    def compile_recorded(self, *a, **k):
        k.pop("backend", None)
        return real_compile(self, *a, backend=recording_backend, **k)

    DeepSpeedEngine.compile = compile_recorded
    trainer = trainer_module.Trainer(parse_args([*argv, "--compile"]))
    try:
        trainer.train_iter = padded_and_unpadded(trainer.train_iter)
        torch._dynamo.utils.counters.clear()
        train_graphs = []
        for _ in range(2):  # the second round sees both kinds again: no graph may be added
            for _ in range(STEPS):
                trainer.train_step()
            train_graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        training = list(graphs)
        evaluation = trainer.evaluate()
        counters = torch._dynamo.utils.counters
        Path(out).write_text(
            json.dumps(
                {
                    "train_graphs": train_graphs,
                    "graphs": counters["stats"]["unique_graphs"],
                    "graph_breaks": dict(counters["graph_break"]),
                    "recompiles": dict(counters["recompiles"]),
                    "training_sdpa_masked": training,
                    "micro_batches": 2 * STEPS * trainer.batch.gas,
                    "evaluation": evaluation,
                }
            )
        )
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1], sys.argv[2:]))
