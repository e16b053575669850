"""DeepSpeed checkpoints made crash-safe: commit marker, atomic `latest`, keep-last-k, per-rank RNG.

DeepSpeed 0.19.8's save_checkpoint lets rank 0 write `latest` as soon as rank 0's own files are written, before the
final barrier, so a job killed mid-save can leave `latest` pointing at a partial checkpoint. We save with
save_latest=False; after a barrier (every rank finished writing) rank 0 writes `<tag>/commit.json` and then
replaces `latest` atomically. Loading only ever uses tags that have the marker.

Layout of a save directory:
    latest                      tag of the newest complete checkpoint (atomic replace)
    iter_0000100/               DeepSpeed's files (mp_rank_00_model_states.pt, zero shards, ...)
        rng_rank{r}.pt          python/numpy/torch/cuda RNG of rank r
        commit.json             written last: {"iteration", "world_size", "tag"}
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pretrain import faults

COMMIT_MARKER = "commit.json"
LATEST = "latest"
_TAG_RE = re.compile(r"^iter_(\d{7,})$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the directory and what differs."""


def tag_for(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def committed_tags(save_dir: str | os.PathLike) -> list[tuple[int, str]]:
    """(iteration, tag) of every complete checkpoint, oldest first."""
    root = Path(save_dir)
    out = []
    if root.is_dir():
        for d in root.iterdir():
            m = _TAG_RE.match(d.name)
            if m and (d / COMMIT_MARKER).is_file():
                out.append((int(m.group(1)), d.name))
    return sorted(out)


def find_resume_tag(load_dir: str | os.PathLike) -> str | None:
    """The tag in `latest` if it is complete, else the newest complete tag, else None."""
    root = Path(load_dir)
    latest = root / LATEST
    if latest.is_file():
        tag = latest.read_text().strip()
        if (root / tag / COMMIT_MARKER).is_file():
            return tag
    tags = committed_tags(root)
    return tags[-1][1] if tags else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(engine, save_dir: str, iteration: int, client_state: dict[str, Any], keep_last: int | None,
         rng: dict[str, Any]) -> str:
    """Save on every rank; returns the tag. Commit marker and `latest` are written after all ranks finished.

    `rng` is this rank's RNG captured before anything of the save ran (building the client state or DeepSpeed's
    save may draw random numbers); the caller restores it afterwards so saving never changes the run.
    """
    tag = tag_for(iteration)
    rank = dist.get_rank()
    engine.save_checkpoint(save_dir, tag=tag, client_state=client_state, save_latest=False)
    torch.save(rng, Path(save_dir, tag, f"rng_rank{rank}.pt"))
    dist.barrier()  # every rank's files (DeepSpeed's and RNG) are on disk past this point
    faults.maybe_kill_in_save(iteration, rank)
    if rank == 0:
        marker = {"iteration": iteration, "world_size": dist.get_world_size(), "tag": tag}
        _atomic_write(Path(save_dir, tag, COMMIT_MARKER), json.dumps(marker))
        _atomic_write(Path(save_dir, LATEST), tag)
        if keep_last is not None:
            prune(save_dir, keep_last)
    dist.barrier()
    return tag


def prune(save_dir: str | os.PathLike, keep_last: int) -> list[str]:
    """Delete all but the newest `keep_last` complete checkpoints, and incomplete ones older than those."""
    tags = committed_tags(save_dir)
    if not tags:
        return []
    keep = {t for _, t in tags[-keep_last:]}
    newest = tags[-1][0]
    removed = []
    for d in Path(save_dir).iterdir():
        m = _TAG_RE.match(d.name)
        if not m or d.name in keep:
            continue
        committed = (d / COMMIT_MARKER).is_file()
        if committed or int(m.group(1)) < newest:  # incomplete leftovers of killed saves go too
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
    return removed


# Settings that may differ between a checkpoint and the run loading it (they change no weight shape or function).
_FREE_MODEL_KEYS = {"hidden_dropout", "attention_dropout"}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "sparsity":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def architecture_differences(saved: dict[str, Any], current: dict[str, Any], allow: set[str] = frozenset()) -> list[str]:
    """Human-readable 'key: saved -> current' lines for model settings that differ (minus the free ones)."""
    a, b = _flatten(saved), _flatten(current)
    diffs = []
    for k in sorted(set(a) | set(b)):
        if k in _FREE_MODEL_KEYS or k in allow:
            continue
        if a.get(k, "<absent>") != b.get(k, "<absent>"):
            diffs.append(f"{k}: checkpoint {a.get(k, '<absent>')!r} vs now {b.get(k, '<absent>')!r}")
    return diffs


def load(engine, load_dir: str, tag: str, model_config: dict[str, Any], restore_rng: bool) -> dict[str, Any]:
    """Resume model, optimizer, scheduler, loss scaler (DeepSpeed) and this rank's RNG; returns the client state.

    A changed architecture is refused before DeepSpeed touches the weights.
    """
    client = read_client_state(load_dir, tag)
    diffs = architecture_differences(client.get("model_config", {}), model_config)
    if diffs:
        raise CheckpointError(f"{load_dir}/{tag} was trained with a different model; refusing to --load it. "
                              "Differing settings:\n  " + "\n  ".join(diffs) +
                              "\n(use --finetune to start a new run from its weights, e.g. a longer sequence)")
    path, loaded = engine.load_checkpoint(load_dir, tag=tag, load_optimizer_states=True,
                                          load_lr_scheduler_states=True)
    if path is None:
        raise CheckpointError(f"DeepSpeed could not load {load_dir}/{tag}")
    if restore_rng:
        rank, world = dist.get_rank(), dist.get_world_size()
        saved_world = client.get("world_size")
        rng_file = Path(load_dir, tag, f"rng_rank{rank}.pt")
        if saved_world != world or not rng_file.is_file():
            raise CheckpointError(f"{load_dir}/{tag} was saved by {saved_world} ranks, this run has {world}: the "
                                  "per-rank RNG cannot be restored exactly; pass --no-load-rng to resume anyway")
        loaded["_rng"] = torch.load(rng_file, weights_only=False)
    return loaded


# DeepSpeed names rank 0's module file differently under ZeRO-3.
_MODEL_STATE_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")


def model_state_file(load_dir: str, tag: str) -> Path:
    for name in _MODEL_STATE_FILES:
        f = Path(load_dir, tag, name)
        if f.is_file():
            return f
    raise CheckpointError(f"{Path(load_dir, tag)} has none of {list(_MODEL_STATE_FILES)}: not a DeepSpeed checkpoint")


def read_client_state(load_dir: str, tag: str) -> dict[str, Any]:
    """The client state DeepSpeed stored with rank 0's module states (read without building an engine)."""
    f = model_state_file(load_dir, tag)
    state = torch.load(f, map_location="cpu", weights_only=False)
    return {k: v for k, v in state.items() if k in ("iteration", "consumed_train_samples", "model_config", "args",
                                                   "layout_state", "world_size", "dam_masks")}


def load_fp32_weights(load_dir: str, tag: str) -> dict[str, torch.Tensor]:
    """Full fp32 module weights of any ZeRO stage (DeepSpeed's zero_to_fp32 for stages 1-3)."""
    root = Path(load_dir, tag)
    if any(root.glob("zero_pp_rank_*optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(load_dir, tag=tag)
    state = torch.load(model_state_file(load_dir, tag), map_location="cpu", weights_only=False)
    return {k: v.float() for k, v in state["module"].items()}


def extend_position_embeddings(weights: dict[str, torch.Tensor], module: torch.nn.Module) -> list[str]:
    """Grow learned position tables to the module's size by repeating the trained rows (Longformer's init).

    Returns the names extended. Shrinking is refused: positions would be lost silently.
    """
    target = module.state_dict()
    done = []
    for name, w in weights.items():
        if not name.endswith("position_embeddings.weight") or name not in target:
            continue
        want = target[name].shape[0]
        have = w.shape[0]
        if want < have:
            raise CheckpointError(f"{name}: checkpoint has {have} positions, the new model only {want}; "
                                  "shrinking position embeddings is not supported")
        if want > have:
            reps = -(-want // have)
            weights[name] = w.repeat(reps, 1)[:want].clone()
            done.append(f"{name}: {have} -> {want}")
    return done
