"""Minimal reproduction, for a DeepSpeed bug report, of the two things DeepSpeed 0.19.8's ZeRO-3 universal-checkpoint
load restores wrongly (``DeepSpeedZeroOptimizer_Stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3``):

1. every ZeRO-3 sub-group's optimizer state gets the *same* ``step`` tensor object (``state[0]['step']`` of the
   universal ``optimizer_state.pt``); torch's Adam/AdamW increment it in place once per sub-group, so after one
   step the groups' counters read n+1, n+2, ... and the bias correction of every group but the first is wrong;
2. every param group gets the hyperparameters of the checkpoint's first group (here: weight decay 0.1 on the
   no-decay group).

No model of ours, no launcher, one CPU process (gloo), no change of world size needed: a plain two-group model under
ZeRO-3 fp32 with torch's AdamW, 2 steps, save, ``python -m deepspeed.checkpoint.ds_to_universal``, then load once as
it is and once with ``"checkpoint": {"load_universal": true}`` and take the same third step on both. On 0.19.8 it
prints ``shared step tensor: True``, the no-decay group's ``weight_decay 0.1``, the step counters ``[4.0, 4.0]``
after the step (one object, incremented once per sub-group; the plain load: ``[3.0, 3.0]``) and an fp32 master
difference of 1.9e-3 although the masters were equal after the loads; with the defects fixed: False, 0.0,
``[3.0, 3.0]`` and 0 (exit code 0, else 1).
``--repair`` applies pretrain/resize.py's repair (what the trainer does after every universal load) and shows it
makes the two loads agree bitwise.

    .venv/bin/python docs/upstream/zero3_universal_step_repro.py [--repair]   # ~1.5 min on the loaded 2-core CPU box
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def engine(model_seed: int, universal: bool):
    import deepspeed
    import torch

    torch.manual_seed(model_seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "checkpoint": {"load_universal": universal},
    }
    eng, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    return eng


def step(eng, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
    loss = torch.nn.functional.mse_loss(eng(x), y)
    eng.backward(loss)
    eng.step()


def masters(eng) -> list:
    from deepspeed.utils import safe_get_full_fp32_param

    return [safe_get_full_fp32_param(p).clone() for p in eng.module.parameters()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repair", action="store_true", help="apply pretrain/resize.py's repair after the universal load")
    args = ap.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29613")
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    import deepspeed
    import torch
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )

    deepspeed.init_distributed(dist_backend="gloo")
    with tempfile.TemporaryDirectory() as tmp:
        eng = engine(0, universal=False)
        for i in range(2):
            step(eng, i)
        info = {UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}}
        eng.save_checkpoint(tmp, tag="t", client_state=info)
        cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", f"{tmp}/t"]
        cmd += ["--output_folder", f"{tmp}/t_universal", "--inject_missing_state"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        Path(tmp, "latest_universal").write_text("t_universal")

        plain = engine(1, universal=False)  # another init: everything must come from the checkpoint
        plain.load_checkpoint(tmp, tag="t")
        uni = engine(1, universal=True)
        uni.load_checkpoint(tmp, tag="t_universal")
        if args.repair:
            sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's root
            from pretrain.resize import repair_universal_load

            for note in repair_universal_load(uni.optimizer, tmp, "t_universal"):
                print("repaired:", note)
        states = list(uni.optimizer.optimizer.state.values())
        print(f"DeepSpeed {deepspeed.__version__}, torch {torch.__version__}")
        print("shared step tensor:", len(states) > 1 and states[0]["step"] is states[1]["step"])
        for i, (p, u) in enumerate(zip(plain.optimizer.param_groups, uni.optimizer.param_groups)):
            print(f"param group {i} weight_decay: plain load {p['weight_decay']}, universal load {u['weight_decay']}")
        same_before = all(torch.equal(a, b) for a, b in zip(masters(plain), masters(uni)))
        print("fp32 masters equal after the loads:", same_before)
        step(plain, 2)
        step(uni, 2)
        for name, e in (("plain", plain), ("universal", uni)):
            print(f"{name} load, step counters after one more step:",
                  [float(s["step"]) for s in e.optimizer.optimizer.state.values()])  # fmt: skip
        diff = max((a - b).abs().max().item() for a, b in zip(masters(plain), masters(uni)))
        print(f"largest fp32 master difference after that step (plain vs universal load): {diff:.3g}")
    return 0 if diff == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())
