"""DeepSpeed checkpoints made crash-safe: commit marker, atomic `latest`, keep-last-k, per-rank RNG.

DeepSpeed 0.19.8's save_checkpoint lets rank 0 write `latest` as soon as rank 0's own files are written, before the
final barrier, so a job killed mid-save can leave `latest` pointing at a partial checkpoint. We save with
save_latest=False; after a barrier (every rank finished writing) rank 0 writes `<tag>/commit.json` and then
replaces `latest` atomically. Loading only ever uses tags that have the marker.

Layout of a save directory:
    latest                      tag of the newest complete checkpoint (atomic replace)
    iter_0000100/               DeepSpeed's files (mp_rank_00_model_states.pt, zero shards, ...)
        rng_rank{r}.pt          python/numpy/torch/cuda RNG of rank r
        config.toml             the run's resolved settings, when the caller gives them (pretrain/checkpointer.py)
        commit.json             written last: {"iteration", "world_size", "tag", "files": {name: {size, crc32}}}

Integrity: the marker records every file's size and CRC-32 (zlib's, about 2 GB/s on one core; the ranks checksum
disjoint shares of the files at save). Resume (rank 0, before any rank loads) and the Hugging Face export check them;
a checkpoint that does not verify is named with its bad files, and resume falls back to the newest committed one
that verifies (``--strict-load``: an error instead). Markers written before this existed hold no ``files``: such a
checkpoint loads unverified, and the log says so.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pretrain.checkpoint_reader import (  # noqa: F401  (the reading half, re-exported: one checkpoint API)
    _TAG_RE,
    COMMIT_MARKER,
    LATEST,
    CheckpointError,
    check_integrity,
    committed_tags,
    file_record,
    file_records,
    find_resume_tag,
    load_fp32_weights,
    model_state_file,
    read_client_state,
    strip_wrapper_prefixes,
    tag_files,
    tag_for,
    verify_tag,
)
from pretrain.faults import Faults


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


UNIVERSAL_SUFFIX = "_universal"
"""``TAG`` + this: the universal-checkpoint conversion of ``TAG`` (pretrain/resize.py), kept next to it."""


def clear_tag(save_dir: str | os.PathLike, tag: str) -> list[str]:
    """Empty the place a save of ``tag`` writes: what an interrupted save left there (another world size's ZeRO
    shard files) or an older run's checkpoint of the same iteration would otherwise be swept into the new commit
    marker and into a later universal conversion, which merges every shard file it finds (a 2 -> 1 -> 2 resize failed
    with "shape '[64]' is invalid for input of size 128"); so would a stale conversion of the tag, reused as is."""
    removed = []
    for d in [Path(save_dir, tag), *Path(save_dir).glob(glob.escape(tag + UNIVERSAL_SUFFIX) + "*")]:
        if d.is_dir():
            shutil.rmtree(d)
            removed.append(d.name)
    return removed


def save(
    engine,
    save_dir: str,
    iteration: int,
    client_state: dict[str, Any],
    keep_last: int | None,
    rng: dict[str, Any],
    faults: Faults | None = None,
    text_files: dict[str, str] | None = None,
) -> str:
    """Save on every rank; returns the tag. Commit marker and `latest` are written after all ranks finished.

    `rng` is this rank's RNG captured before anything of the save ran (building the client state or DeepSpeed's
    save may draw random numbers); the caller restores it afterwards so saving never changes the run. ``faults`` is
    the run's fault hook (its ``in_save`` runs between the files and the marker); ``text_files`` ({name: text}) are
    written by rank 0 into the tag beside DeepSpeed's files, so the marker checksums them too.
    """
    tag = tag_for(iteration)
    rank = dist.get_rank()
    from pretrain.distributed import all_gather_objects, rank0_result

    if rank == 0 and Path(save_dir).is_dir():
        clear_tag(save_dir, tag)
    dist.barrier()  # no rank writes before the tag's place is empty
    engine.save_checkpoint(save_dir, tag=tag, client_state=client_state, save_latest=False)
    torch.save(rng, Path(save_dir, tag, f"rng_rank{rank}.pt"))
    if rank == 0:
        for name, text in (text_files or {}).items():
            _atomic_write(Path(save_dir, tag, name), text)
    dist.barrier()  # every rank's files (DeepSpeed's and RNG) are on disk past this point
    # sizes and checksums: rank 0 lists the files, each rank reads a disjoint share (a large checkpoint is read in
    # parallel), rank 0 writes them all into the marker
    names = rank0_result(lambda: tag_files(Path(save_dir, tag)))
    world = dist.get_world_size()
    shares = all_gather_objects(file_records(Path(save_dir, tag), names[rank::world]))
    (faults or Faults()).in_save(iteration, rank)
    if rank == 0:
        files = {n: rec for share in shares for n, rec in share.items()}
        marker = {"iteration": iteration, "world_size": world, "tag": tag, "files": dict(sorted(files.items()))}
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


# Settings that may differ between a checkpoint and the run loading it (they change no weight shape or function;
# residual_norm is a kernel choice; pad_vocab_multiple pads the decoder inside the forward only, and checkpoints from
# before it had none).
_FREE_MODEL_KEYS = {"hidden_dropout", "attention_dropout", "residual_norm", "pad_vocab_multiple"}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "sparsity":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def architecture_differences(
    saved: dict[str, Any], current: dict[str, Any], allow: set[str] = frozenset()
) -> list[str]:
    """Human-readable 'key: saved -> current' lines for model settings that differ (minus the free ones)."""
    a, b = _flatten(saved), _flatten(current)
    diffs = []
    for k in sorted(set(a) | set(b)):
        if k in _FREE_MODEL_KEYS or k in allow:
            continue
        if a.get(k, "<absent>") != b.get(k, "<absent>"):
            diffs.append(f"{k}: checkpoint {a.get(k, '<absent>')!r} vs now {b.get(k, '<absent>')!r}")
    return diffs


def check_architecture(where: str, client: dict[str, Any], model_config: dict[str, Any]) -> None:
    """Refuse to --load a checkpoint of another model (before DeepSpeed touches any weight)."""
    diffs = architecture_differences(client.get("model_config", {}), model_config)
    if diffs:
        raise CheckpointError(
            f"{where} was trained with a different model; refusing to --load it. "
            "Differing settings:\n  "
            + "\n  ".join(diffs)
            + "\n(use --finetune to start a new run from its weights, e.g. a longer sequence)"
        )


def resume_candidates(load_dir: str | os.PathLike) -> list[str]:
    """Committed tags in the order resume tries them: :func:`find_resume_tag`'s choice, then the others newest
    first."""
    first = find_resume_tag(load_dir)
    rest = [t for _, t in reversed(committed_tags(load_dir)) if t != first]
    return ([first] if first else []) + rest


def select_resume_tag(
    load_dir: str | os.PathLike, strict: bool = False, read_client: bool = True
) -> tuple[str | None, dict[str, Any] | None, list[str]]:
    """(tag, client state, notes): the newest committed checkpoint whose files verify and whose client state reads.

    One that does not is skipped with a note naming its bad files (``strict``: CheckpointError instead); when none
    is left, CheckpointError lists them all. A checkpoint whose marker records no files is used with a note."""
    notes: list[str] = []
    bad: list[str] = []
    for tag in resume_candidates(load_dir):
        where = Path(load_dir, tag)
        problems, checked = verify_tag(load_dir, tag)
        client = None
        if not problems and read_client:
            try:
                client = read_client_state(load_dir, tag)
            except CheckpointError as e:
                problems = [str(e)]
        if problems:
            msg = f"{where} does not verify: " + "; ".join(problems)
            if strict:
                raise CheckpointError(
                    msg + ". --strict-load: not falling back to an older checkpoint (drop the flag to resume from "
                    "the newest one that verifies, or restore the files)"
                )
            bad.append(msg)
            notes.append(msg)
            continue
        if not checked:
            notes.append(
                f"{where}: its commit marker records no file sizes or checksums (saved before checkpoints were "
                "verified); loading it unverified"
            )
        if bad:
            notes.append(f"falling back to {where}, the newest committed checkpoint that verifies")
        return tag, client, notes
    if bad:
        raise CheckpointError(f"no committed checkpoint in {load_dir} verifies:\n  " + "\n  ".join(bad))
    return None, None, notes


def load(engine, load_dir: str, tag: str, client: dict[str, Any], restore_rng: bool) -> Any:
    """Resume model, optimizer, scheduler, loss scaler (DeepSpeed; every rank reads its own shards) and this rank's
    RNG; returns the RNG state to set once the data iterator exists (None without restore_rng).

    ``client`` is the client state rank 0 read and broadcast (agree_on_resume): every rank checks the same values.
    """
    try:
        path, _ = engine.load_checkpoint(load_dir, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
    except (OSError, RuntimeError, EOFError, KeyError, ValueError) as e:
        raise CheckpointError(f"DeepSpeed could not load {load_dir}/{tag}: {type(e).__name__}: {e}") from e
    if path is None:
        raise CheckpointError(f"DeepSpeed could not load {load_dir}/{tag}")
    if not restore_rng:
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    saved_world = client.get("world_size")
    rng_file = Path(load_dir, tag, f"rng_rank{rank}.pt")
    if saved_world != world or not rng_file.is_file():
        raise CheckpointError(
            f"{load_dir}/{tag}: no RNG state for rank {rank} of {world} (saved by {saved_world} rank(s)); "
            "pass --no-load-rng to resume without it"
        )
    try:
        return torch.load(rng_file, weights_only=False)
    except Exception as e:  # a torch.load of a damaged file raises anything from RuntimeError to UnpicklingError
        raise CheckpointError(f"{rng_file}: unreadable ({type(e).__name__}: {e})") from e


def agree_on_resume(
    load_dir: str, read_client: bool = True, strict: bool = False
) -> tuple[str | None, dict[str, Any] | None]:
    """(tag, client state) of the checkpoint to resume, decided by rank 0 alone and the same on every rank.

    Ranks that each looked for `latest` themselves could disagree (stale network-filesystem caches, node-local save
    directories) and then hang in collectives until the timeout. Rank 0 picks the tag (the newest committed one
    whose files verify: :func:`select_resume_tag`, saying so when it falls back) and reads the client state once;
    every rank then confirms it sees that checkpoint, and if one does not, all stop with its rank, host and the path.
    """
    from pretrain.distributed import all_gather_objects, rank0_result

    def decide() -> tuple[str | None, dict[str, Any] | None]:
        tag, client, notes = select_resume_tag(load_dir, strict=strict, read_client=read_client)
        for note in notes:
            print(f"[checkpoint] {note}", flush=True)
        return tag, client

    tag, client = rank0_result(decide)
    if tag is None:
        return None, None
    marker = Path(load_dir, tag, COMMIT_MARKER)
    seen = all_gather_objects((marker.is_file(), socket.gethostname(), str(marker)))
    blind = [f"rank {r} on {host} cannot see {path}" for r, (ok, host, path) in enumerate(seen) if not ok]
    if blind:
        raise CheckpointError(
            f"rank 0 resumes from {seen[0][2]}, but " + "; ".join(blind) + ": --load must be a "
            "directory every node sees with the same contents (a shared file system, not "
            "node-local disks); check the mount on those hosts"
        )
    return tag, client


def check_save_dir_shared(save_dir: str) -> None:
    """Stop at start, on every rank, when some rank cannot see what rank 0 writes into ``--save``.

    A node-local save directory is otherwise found only at the first resume (or never: each node keeps its own
    shards and no checkpoint is whole). Rank 0 writes a probe file with a fresh name, every rank looks for it, rank
    0 removes it.
    """
    import secrets

    from pretrain.distributed import all_gather_objects, rank0_result

    def write_probe() -> str:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        probe = Path(save_dir, f".shared-check-{secrets.token_hex(8)}")
        probe.write_text(socket.gethostname())
        return str(probe)

    probe = rank0_result(write_probe)
    seen = all_gather_objects((Path(probe).is_file(), socket.gethostname()))
    if dist.get_rank() == 0:
        Path(probe).unlink(missing_ok=True)
    blind = [f"rank {r} on {host}" for r, (ok, host) in enumerate(seen) if not ok]
    if blind:
        raise CheckpointError(
            f"--save {save_dir}: rank 0 on {seen[0][1]} wrote {probe} there, but " + ", ".join(blind) + " cannot "
            "see it: --save must be a directory every node sees with the same contents (a shared file system, not "
            "node-local disks); check the mount on those hosts"
        )


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
            raise CheckpointError(
                f"{name}: checkpoint has {have} positions, the new model only {want}; "
                "shrinking position embeddings is not supported"
            )
        if want > have:
            reps = -(-want // have)
            weights[name] = w.repeat(reps, 1)[:want].clone()
            done.append(f"{name}: {have} -> {want}")
    return done
