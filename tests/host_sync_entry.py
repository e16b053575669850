"""Run by tests/test_host_syncs.py as one rank (`python tests/host_sync_entry.py OUT.json TRAINER_FLAGS...`): builds
the real Trainer, takes one warm-up step, then counts the operations that make the host wait for the device during
the next steps, and writes where in our code each one was made.

Counted (a TorchDispatchMode sees every aten call): reading a value (`_local_scalar_dense`: `.item()`, `bool()`,
`int()`, `float()`), `nonzero`, `masked_select`, and indexing with a boolean mask (a data-dependent shape). Host-batch
work is not counted (the DataLoader's batches, `Trainer._tokens`, `Trainer._to_device`: on CUDA it runs on host
tensors before the copy). Sites are ``path:function`` of our code, ``(deepspeed) ...`` for DeepSpeed's own (with
its caller when that is DeepSpeed's too), ``(torch.optim) ...`` for torch's optimizers. DeepSpeed's accelerator
``synchronize()`` is counted as well (``... (synchronize)``): on CPU it returns at once, on a GPU it waits for the
device. Counting starts after two warm-up steps (DeepSpeed's throughput timer starts timing at its third step).
"""

from __future__ import annotations

import json
import sys
import traceback
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import pretrain.trainer as trainer_module  # noqa: E402
from common.process import exit_process  # noqa: E402
from pretrain.args import parse_args  # noqa: E402

_SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal"}
DEBUG = bool(__import__("os").environ.get("SYNC_DEBUG"))


def _site() -> str:
    """Who made the call: the innermost frame outside torch and this file, as ``path:function`` for our code or
    ``(deepspeed) path:function`` for DeepSpeed's."""
    stack = list(reversed(traceback.extract_stack()))
    for i, frame in enumerate(stack):
        path = Path(frame.filename).resolve()
        where = f":{frame.name}" + (f"@{frame.lineno}" if DEBUG else "")
        if path.parts[-3:-1] == ("torch", "optim"):
            return f"(torch.optim) {path.name}{where}"
        if path == Path(__file__).resolve() or "torch" in path.parts:
            continue
        if "deepspeed" in path.parts:
            inside = Path(*path.parts[path.parts.index("deepspeed") :])
            caller = stack[i + 1] if i + 1 < len(stack) else None
            if caller is not None and "deepspeed" in Path(caller.filename).parts:
                where += f" <- {Path(caller.filename).name}:{caller.name}"
            return f"(deepspeed) {inside}{where}"
        if path.is_relative_to(REPO):
            return f"{path.relative_to(REPO)}{where}"
        return f"(other) {path}{where}"
    return "(unknown)"


class CountSyncs(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[str] = Counter()
        self.paused = 0
        self.counting = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        boolean_index = name == "index" and any(
            isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
            for t in (args[1] if len(args) > 1 else [])
            if t is not None
        )
        if not self.paused and (name in _SYNCING or boolean_index):
            self.sites[f"{_site()} ({name})"] += 1
        return func(*args, **(kwargs or {}))


def count_synchronize(mode: CountSyncs) -> None:
    """Count DeepSpeed's accelerator ``synchronize()`` calls into ``mode.sites`` (its callers all ask the one
    accelerator object, so wrapping the method sees them all)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    real = accelerator.synchronize

    def synchronize(*a, **k):
        if mode.counting and not mode.paused:
            mode.sites[f"{_site()} (synchronize)"] += 1
        return real(*a, **k)

    accelerator.synchronize = synchronize


def main(out: str, argv: list[str]) -> int:
    steps = 3
    trainer = trainer_module.Trainer(parse_args(argv))
    try:
        trainer.engine.train()
        mode = CountSyncs()
        count_synchronize(mode)
        for _ in range(2):  # warm-up: plans and caches are built on the first step
            trainer.train_step()
        for name in ("_tokens", "_to_device"):
            real = getattr(trainer, name)

            def paused(*a, _real=real, **k):
                mode.paused += 1
                try:
                    return _real(*a, **k)
                finally:
                    mode.paused -= 1

            setattr(trainer, name, paused)
        batches = trainer.train_iter

        class HostBatches:  # the DataLoader's collation runs on host tensors (in worker processes when num_workers>0)
            def __next__(self):
                mode.paused += 1
                try:
                    return next(batches)
                finally:
                    mode.paused -= 1

        trainer.train_iter = HostBatches()
        with mode:
            mode.counting = True
            for _ in range(steps):
                trainer.train_step()
        Path(out).write_text(json.dumps({"steps": steps, "gas": trainer.gas, "sites": dict(mode.sites)}))
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1], sys.argv[2:]))
