"""Run by tests/test_deepspeed_patch.py (`python tests/deepspeed_patch_entry.py MODE OUT.pt`) as one gloo rank: a
small two-group model under DeepSpeed ZeRO-1 bf16 with gradient clipping, three optimizer steps (clipped, then one
whose gradients are inf, then clipped again), with and without ``bf16.check_grad_overflow``. Writes the parameters
after every step, the skipped-step count, and the host syncs each ``engine.step()`` would make on a GPU
(benchmarks/support/host_syncs.py).

MODE: ``original`` (the installed DeepSpeed as it is), ``runtime`` (pretrain/deepspeed_patch.py applied), or
``upstream`` (the installed DeepSpeed as found on PYTHONPATH: the test puts a copy with
docs/upstream/deepspeed-zero-norm-syncs.patch applied there).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.support.host_syncs import HostSyncCounter  # noqa: E402


def run(check_grad_overflow: bool) -> dict:
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-2, foreach=False)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**6,
        "bf16": {"enabled": True, "check_grad_overflow": check_grad_overflow},
        "timers": {"throughput": {"enabled": False}},
        "zero_optimization": {"stage": 1},
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    params, syncs = [], []
    for step in range(3):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step)).to(torch.bfloat16) * 100.0
        if step == 1:
            x[0, 0] = float("inf")
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        counter = HostSyncCounter(skip=(Path(__file__),))
        with counter:
            engine.step()
        syncs.append(dict(counter.sites))
        params.append([p.detach().float().clone() for p in engine.module.parameters()])
    return {"params": params, "skipped": engine.skipped_steps, "syncs": syncs}


def main(mode: str, out: str) -> None:
    import deepspeed

    if mode == "runtime":
        from pretrain import deepspeed_patch

        deepspeed_patch.apply()
    elif mode == "upstream":
        assert not Path(deepspeed.__file__).is_relative_to(Path(torch.__file__).parents[1]), deepspeed.__file__
    # one rank needs no shared-memory collectives: not building DeepSpeed's op keeps the copy and the installed
    # package from rebuilding it in turn in the one extensions folder
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    torch.save({"deepspeed": deepspeed.__file__, "off": run(False), "on": run(True)}, out)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], sys.argv[2])
