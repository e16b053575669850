"""Resuming on another number of data-parallel ranks (a lost node, a bigger allocation).

ZeRO 1-3 checkpoints hold the optimizer state partitioned over the ranks that saved them, and DeepSpeed refuses to
load them on another world size. DeepSpeed's own universal checkpoint re-partitions them: rank 0 converts the
resumed tag once with ``deepspeed.checkpoint.ds_to_universal`` into ``TAG_universal`` next to it (written under a
temporary name and renamed when complete, so a killed conversion is redone, never half-read), and every rank loads
that with ``"checkpoint": {"load_universal": true}``. The global batch stays what the flags say (gradient
accumulation absorbs the change) and the data position is the stored sample count, so the sample stream continues
exactly; the per-rank RNG cannot be mapped onto other ranks and is not restored (dropout masks then differ from a
straight run; with dropout 0 the losses equal it up to the order of floating-point reductions).

DeepSpeed 0.19.8's ZeRO-3 universal load (``DeepSpeedZeroOptimizer_Stage3.load_hp_checkpoint_state_from_checkpoint_
dir_stage3``) copies the hyperparameters of the checkpoint's *first* param group onto *every* group: our no-decay
group (biases, LayerNorm) then decays with the first group's weight decay. ZeRO 1/2 keep each group's own.
:func:`restore_param_group_settings` puts each group's saved settings back after every universal load.

The same function hands every ZeRO-3 sub-group *one* ``step`` tensor object (``optimizer_sd['state'][0]['step']``,
assigned to each flat fp32 partition's state). torch's Adam/AdamW increment ``state['step']`` in place, so with two
or more sub-groups (our two param groups are at least two) each optimizer step advances the shared counter once per
sub-group: the first group's update uses step n+1, the second's n+2, and every later step's bias correction is off
by more (6.9e-7 relative at the 2nd step after a 2 -> 1 resume, 9.2e-5 at the 5th). The loaded state compares equal
to the checkpoint's (the value is right, only the object is shared), the first forward/backward after the resume is
exact, and its update is not. ZeRO 1/2 load each group's step from its own file and are unaffected.
:func:`unshare_step_counters` gives every state its own copy after every universal load. Both fixes live here and
run through :func:`repair_universal_load`; the reproduction for upstream is docs/upstream/zero3_universal_step_repro.py
(docs/training.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from pretrain.checkpoint import UNIVERSAL_SUFFIX, CheckpointError
from pretrain.ds_config import ResolvedDSConfig

DONE = "universal.done"
"""Written into the universal folder once it is complete."""


def needs_universal(client: dict[str, Any], world_size: int) -> bool:
    """True when the checkpoint was saved by another number of ranks with ZeRO-partitioned optimizer state."""
    saved = int(client.get("world_size") or world_size)
    return saved != world_size and int(client.get("zero_stage") or 0) >= 1


def convert_to_universal(load_dir: str, tag: str) -> str:
    """Rank 0: ``load_dir/tag`` -> ``load_dir/tag_universal`` with DeepSpeed's converter (reused when complete).
    Returns the universal tag; raises CheckpointError with the converter's output on failure."""
    out_tag = tag + UNIVERSAL_SUFFIX
    out = Path(load_dir, out_tag)
    if (out / DONE).is_file():
        return out_tag
    tmp = Path(load_dir, out_tag + ".partial")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(Path(load_dir, tag))]
    cmd += ["--output_folder", str(tmp), "--num_extract_workers", "1", "--num_merge_workers", "1"]
    cmd += ["--inject_missing_state"]  # checkpoints of a plain data-parallel model carry no TP/PP layout info
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        raise CheckpointError(
            f"converting {load_dir}/{tag} to a universal checkpoint failed ({' '.join(cmd)}):\n{res.stdout[-3000:]}"
        )
    (tmp / DONE).write_text(tag + "\n")
    tmp.rename(out)
    return out_tag


def prepare(ds: ResolvedDSConfig, load_dir: str, tag: str, client: dict[str, Any], world_size: int) -> str | None:
    """Every rank: the tag to load when the world size changed under ZeRO 1-3 (converted by rank 0, told to all),
    with the ds_config switched to DeepSpeed's universal loading; None when the checkpoint loads as it is."""
    from pretrain.distributed import rank0_result

    if not needs_universal(client, world_size):
        return None
    block = ds.config.setdefault("checkpoint", {})
    if not isinstance(block, dict):
        raise CheckpointError(f"{ds.path}: 'checkpoint' must be an object")
    block["load_universal"] = True
    return rank0_result(lambda: convert_to_universal(load_dir, tag))


def restore_param_group_settings(optimizer, load_dir: str, universal_tag: str) -> list[str]:
    """After a universal load: give each param group the hyperparameters (weight decay, betas, eps, ...) the
    checkpoint saved for that group, not the first group's. Returns one line per setting that changed."""
    import torch

    f = Path(load_dir, universal_tag, "zero", "optimizer_state.pt")
    try:
        saved = torch.load(f, map_location="cpu", weights_only=False)["param_groups"]
    except Exception as e:  # a damaged or foreign file: name it
        raise CheckpointError(f"{f}: cannot read the saved param groups ({type(e).__name__}: {e})") from e
    groups = optimizer.param_groups
    if len(saved) != len(groups):
        raise CheckpointError(
            f"{f}: {len(saved)} saved param group(s), the optimizer has {len(groups)}; the model's parameter "
            "grouping changed since the save"
        )
    changed = []
    for i, (group, want) in enumerate(zip(groups, saved)):
        for k, v in want.items():
            if k != "params" and k in group and group[k] != v:
                changed.append(f"param group {i} {k}: {group[k]!r} -> {v!r}")
                group[k] = v
    return changed


def unshare_step_counters(optimizer) -> int:
    """After a universal load: give every optimizer state its own ``step`` tensor (DeepSpeed's ZeRO-3 load shares
    one object between all sub-groups, and Adam increments it in place once per sub-group). Returns how many states
    shared another's counter."""
    import torch

    base = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed's ZeRO wrapper holds the torch optimizer
    seen: set[int] = set()
    shared = 0
    for state in base.state.values():
        step = state.get("step")
        if not torch.is_tensor(step):
            continue
        if id(step) in seen:
            shared += 1
        seen.add(id(step))
        state["step"] = step.clone()
    return shared


def repair_universal_load(optimizer, load_dir: str, universal_tag: str) -> list[str]:
    """Every rank, right after DeepSpeed loaded ``load_dir/universal_tag``: undo what DeepSpeed 0.19.8's universal
    load restores wrongly (per-group hyperparameters, shared ZeRO-3 step counters). Returns one line per repair."""
    notes = restore_param_group_settings(optimizer, load_dir, universal_tag)
    shared = unshare_step_counters(optimizer)
    if shared:
        notes.append(f"{shared} optimizer state(s) shared another's step counter: each has its own now")
    return notes
