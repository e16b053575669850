"""A training run as one TOML file: ``python -m pretrain.train --config run.toml [flags]``.

The file's tables are the ``--help`` groups of pretrain/args.py, one per RunConfig concern: ``[model]`` (ModelArgs,
plus the ModelConfig overrides such as ``num_layers``), ``[data]`` (DataArgs), ``[optimization]`` (RunConfig.optim,
OptimConfig), ``[loop]`` (LoopConfig), ``[checkpoints]`` (RunConfig.checkpoint, CheckpointConfig), ``[logging]``
(LoggingConfig) and ``[system]`` (SystemConfig, where ``deepspeed_config`` names the DeepSpeed JSON). Keys are the
dataclass field names (the flag without its dashes, ``-`` as ``_``); values are checked as the flags' are. A flag given
on the command line wins over the file. An unknown table or key is refused naming the file, the table and the nearest
name. Paths in the file are read from the working directory, as the flags' are.

Every run writes its resolved configuration (:func:`dumps`) as ``config.toml`` in its run directory
(:func:`run_dir`); ``--config`` of that file starts the same run.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import tomli_w

from common.cli import FileError as RunFileError
from common.cli import load_tables
from pretrain.args import NOT_IN_FILE, table_keys, tables

__all__ = [
    "CONFIG_NAME",
    "NOT_IN_FILE",
    "RunFileError",
    "describe_sources",
    "dumps",
    "load",
    "run_dir",
    "table_keys",
    "tables",
    "write",
]

CONFIG_NAME = "config.toml"
"""The resolved configuration's file name in the run directory (and in each checkpoint)."""
SOURCES = ("file", "flag", "default")
"""Where a setting's value came from, as the start-up lines say."""


def load(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """A run file's tables, every table and key checked against RunConfig's fields (the values are checked as the
    flags' when ``--config`` applies them)."""
    return load_tables(path, {title: table_keys(cls) for title, (_, cls) in tables().items()})


def describe_sources(sources: dict[str, str], path: str | None, explicit: frozenset[str] = frozenset()) -> list[str]:
    """The start-up lines saying which settings came from where (a file's settings equal to their default are
    counted, not named)."""
    by = {s: sorted(k for k, v in sources.items() if v == s) for s in SOURCES}
    lines = []
    if path:
        named = [k for k in by["file"] if k in explicit]
        same = len(by["file"]) - len(named)
        lines.append(
            f"settings from {path}: {', '.join(named) or 'none'}" + (f" (and {same} at their defaults)" if same else "")
        )
    lines.append(f"settings from flags: {', '.join(k for k in by['flag'] if k != 'config') or 'none'}")
    lines.append(f"settings left at their defaults: {len(by['default'])} (the full list: {CONFIG_NAME})")
    return lines


def _toml_value(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_toml_value(x) for x in v]
    if isinstance(v, list):
        return [_toml_value(x) for x in v]
    return v


def dumps(cfg: Any) -> str:
    """The RunConfig as a run file: every set field of every table (unset ones, None, named in a comment), readable
    and loadable by :func:`load`. Pure: the same config gives the same text."""
    out = [
        "# A pretraining run (pretrain/run_file.py): python -m pretrain.train --config THIS_FILE [flags]",
        "# Flags given with --config win over this file. Keys: docs/configuration.md.",
    ]
    for table, (attr, cls) in tables().items():
        group = getattr(cfg, attr)
        values, unset = {}, []
        for key in table_keys(cls):
            fields = {f.name for f in dataclasses.fields(cls)}
            v = getattr(group, key) if key in fields else group.overrides.get(key)  # [model]'s ModelConfig keys
            if v is None:
                unset.append(key)
            else:
                values[key] = _toml_value(v)
        out.append("")
        out.append(tomli_w.dumps({table: values}).rstrip("\n"))
        if unset:
            out.append(f"# unset: {', '.join(unset)}")
    return "\n".join(out) + "\n"


def run_dir(cfg: Any) -> Path | None:
    """The run's directory: --save, else --tensorboard-dir, else --log-json's directory (None: the run writes
    nothing)."""
    if cfg.checkpoint.save:
        return Path(cfg.checkpoint.save)
    if cfg.logging.tensorboard_dir:
        return Path(cfg.logging.tensorboard_dir)
    if cfg.logging.log_json:
        return Path(cfg.logging.log_json).resolve().parent
    return None


def write(text: str, path: Path) -> Path:
    """``text`` to ``path`` atomically (a temporary file renamed over it): a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
