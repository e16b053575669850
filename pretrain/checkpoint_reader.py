"""Reading a committed checkpoint without building a model: the files a tag holds, their commit marker, the client
state (model config, layouts, run args) and the fp32 weights of any ZeRO stage.

Everything here works from the files alone (torch.load, DeepSpeed's ``zero_to_fp32``), so the Hugging Face export
(tools/hf_export) and evaluation tools read checkpoints without pretrain.parallelize, an engine or a model; the
trainer uses the same functions (pretrain/checkpoint.py re-exports them). Writing checkpoints stays in
pretrain/checkpoint.py.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from pretrain.ds_config import precision_of, precision_summary

COMMIT_MARKER = "commit.json"
LATEST = "latest"
_TAG_RE = re.compile(r"^iter_(\d{7,})$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint cannot be used; the message names the directory and what differs."""


_CHUNK = 8 << 20


def file_record(path: str | os.PathLike) -> dict[str, Any]:
    """``{"size", "crc32"}`` of one file (CRC-32 as 8 hex digits), read in 8 MiB chunks."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return {"size": size, "crc32": f"{crc:08x}"}


def tag_files(tag_dir: str | os.PathLike) -> list[str]:
    """The files of a checkpoint tag the commit marker covers: every regular file below it (relative POSIX paths,
    sorted) except the marker itself and hidden temporary files."""
    root = Path(tag_dir)
    return sorted(
        f.relative_to(root).as_posix()
        for f in root.rglob("*")
        if f.is_file() and f.name != COMMIT_MARKER and not f.name.startswith(".")
    )


def file_records(tag_dir: str | os.PathLike, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{name: file_record}`` for ``names`` (default: all of :func:`tag_files`)."""
    names = tag_files(tag_dir) if names is None else names
    return {n: file_record(Path(tag_dir, n)) for n in names}


def verify_tag(load_dir: str | os.PathLike, tag: str) -> tuple[list[str], bool]:
    """(problems, checked): one line per file of ``load_dir/tag`` that is missing, unreadable or differs in size or
    CRC-32 from its commit marker. ``checked`` is False for markers without file records (older checkpoints)."""
    tag_dir = Path(load_dir, tag)
    marker_path = tag_dir / COMMIT_MARKER
    try:
        marker = json.loads(marker_path.read_text())
    except (OSError, ValueError) as e:
        return [f"{marker_path}: unreadable commit marker ({e})"], False
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, dict):
        return [], False
    problems = []
    for name, want in sorted(files.items()):
        f = tag_dir / name
        try:
            have = file_record(f)
        except FileNotFoundError:
            problems.append(f"{f}: missing")
            continue
        except OSError as e:
            problems.append(f"{f}: unreadable ({e})")
            continue
        if have["size"] != want.get("size"):
            problems.append(f"{f}: {have['size']} bytes, the commit marker recorded {want.get('size')} (truncated?)")
        elif have["crc32"] != want.get("crc32"):
            problems.append(
                f"{f}: CRC-32 {have['crc32']}, the commit marker recorded {want.get('crc32')} (changed after the save)"
            )
    return problems, True


def check_integrity(load_dir: str | os.PathLike, tag: str) -> bool:
    """Raise CheckpointError naming every bad file of ``load_dir/tag``; False when the marker records no files
    (an older checkpoint: unverified), True when every file verified."""
    problems, checked = verify_tag(load_dir, tag)
    if problems:
        raise CheckpointError(
            f"{Path(load_dir, tag)} does not verify against its commit marker: " + "; ".join(problems)
        )
    return checked


def tag_for(iteration: int) -> str:
    return f"iter_{iteration:07d}"


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


# DeepSpeed names rank 0's module file differently under ZeRO-3 (and with a bf16_ prefix in bf16 ZeRO runs).
_MODEL_STATE_FILES = (
    "mp_rank_00_model_states.pt",
    "zero_pp_rank_0_mp_rank_00_model_states.pt",
    "bf16_zero_pp_rank_0_mp_rank_00_model_states.pt",
)
_CLIENT_KEYS = (
    "iteration",
    "consumed_train_samples",
    "model_config",
    "args",
    "layout_state",
    "world_size",
    "lr_scheduler",
)


def model_state_file(load_dir: str | os.PathLike, tag: str) -> Path:
    for name in _MODEL_STATE_FILES:
        f = Path(load_dir, tag, name)
        if f.is_file():
            return f
    raise CheckpointError(
        f"{Path(load_dir, tag)} has none of {list(_MODEL_STATE_FILES)}: not a DeepSpeed "
        "checkpoint tag, or rank 0's files are missing"
    )


def read_client_state(load_dir: str | os.PathLike, tag: str) -> dict[str, Any]:
    """The client state stored with rank 0's module states (read without building an engine), plus a summary of
    DeepSpeed's set-up: ``zero_stage``, ``precision``, ``dp_world_size``, ``global_batch``, ``ds_summary``.
    ``lr_scheduler`` is the state DeepSpeed saved for our LR scheduler (its settings and step count)."""
    f = model_state_file(load_dir, tag)
    try:
        state = torch.load(f, map_location="cpu", weights_only=False)
    except Exception as e:  # a damaged file raises anything from RuntimeError to UnpicklingError
        raise CheckpointError(f"{f}: unreadable ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or "model_config" not in state:
        raise CheckpointError(
            f"{f}: no 'model_config' client state; the checkpoint was not written by pretrain/train.py"
        )
    client = {k: state.get(k) for k in _CLIENT_KEYS}
    ds = state.get("ds_config") or {}
    stage = int((ds.get("zero_optimization") or {}).get("stage", 0))
    prec = precision_of(ds)
    world = int(state.get("dp_world_size") or client.get("world_size") or 1)
    client.update(
        zero_stage=stage,
        precision=prec,
        dp_world_size=world,
        global_batch=ds.get("train_batch_size"),
        ds_summary=(
            f"ZeRO stage {stage}, {precision_summary(ds)}, {world} rank(s), deepspeed {state.get('ds_version', '?')}"
        ),
    )
    return client


def strip_wrapper_prefixes(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop prefixes that torch.compile / activation-checkpoint / DDP-style wrappers add to parameter names."""
    out = {}
    for k, v in sd.items():
        for p in ("_orig_mod.", "module."):
            while k.startswith(p):
                k = k[len(p) :]
        out[k.replace("._orig_mod.", ".").replace("._checkpoint_wrapped_module.", ".")] = v
    return out


def _zero0_fp32_masters(module_sd: dict[str, torch.Tensor], fp32_groups: list) -> dict[str, torch.Tensor] | None:
    """ZeRO-0 with fp16/bf16 keeps fp32 masters in the optimizer state, one list per param group; the trainer's groups
    (decayed, not decayed) each hold parameters in named_parameters order, which is the order of the saved module
    state dict. Name the masters without building the model: the one split of the parameters into the groups'
    subsequences where every master has its parameter's shape and rounds exactly to its half-precision weight.
    None when no split fits, or more than one does (then the masters cannot be named for certain)."""
    names = list(module_sd)
    groups = [list(g) for g in fp32_groups]
    if not names or sum(map(len, groups)) != len(names):
        return None

    @functools.cache
    def fits(k: int, g: int, j: int) -> bool:
        half, t = module_sd[names[k]], groups[g][j]
        return tuple(t.shape) == tuple(half.shape) and torch.equal(t.to(half.dtype), half)

    # forward over the parameters: state = slots filled per group, with the number of ways to reach it (capped at 2)
    level: dict[tuple[int, ...], int] = {(0,) * len(groups): 1}
    parent: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}
    for k in range(len(names)):
        nxt: dict[tuple[int, ...], int] = {}
        for pos, ways in level.items():
            for g, j in enumerate(pos):
                if j < len(groups[g]) and fits(k, g, j):
                    new = pos[:g] + (j + 1,) + pos[g + 1 :]
                    parent.setdefault(new, (pos, g))
                    nxt[new] = min(2, nxt.get(new, 0) + ways)
        level = nxt
    end = tuple(len(g) for g in groups)
    if level.get(end) != 1:
        return None
    out, pos = {}, end
    for name in reversed(names):
        pos, g = parent[pos]
        out[name] = groups[g][pos[g]].float()
    return {n: out[n] for n in names}


def load_fp32_weights(load_dir: str | os.PathLike, tag: str) -> dict[str, torch.Tensor]:
    """Full fp32 module weights of any ZeRO stage, precision and rank count.

    ZeRO 1/2/3 (fp32, fp16 or ``bf16_`` shards): DeepSpeed's own zero_to_fp32. ZeRO-0: the module weights, replaced
    by the optimizer's fp32 masters when training ran in fp16/bf16 (never the half weights cast up, when masters exist).
    """
    tag_dir = Path(load_dir, tag)
    if any(tag_dir.glob("*zero_pp_rank_*_optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        sd = get_fp32_state_dict_from_zero_checkpoint(str(load_dir), tag=tag)
    else:
        state = torch.load(model_state_file(load_dir, tag), map_location="cpu", weights_only=False)
        sd = strip_wrapper_prefixes(state["module"])
        if any(v.dtype in (torch.float16, torch.bfloat16) for v in sd.values()):
            opt = state.get("optimizer")
            masters = None
            if isinstance(opt, dict) and isinstance(opt.get("fp32_groups"), list):
                masters = _zero0_fp32_masters(sd, opt["fp32_groups"])
            if masters is None:
                print(
                    f"[checkpoint] warning: {tag_dir} holds half-precision module weights and no fp32 masters "
                    "that match them; using the half weights cast to fp32",
                    file=sys.stderr,
                )
            else:
                sd = masters
    return {k: v.detach().float().contiguous() for k, v in strip_wrapper_prefixes(sd).items()}
