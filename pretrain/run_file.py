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

import argparse
import dataclasses
import difflib
import os
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from common.cli import cli_fields, override_fields
from common.errors import UserError

CONFIG_NAME = "config.toml"
"""The resolved configuration's file name in the run directory (and in each checkpoint)."""
NOT_IN_FILE = {"local_rank"}
"""Fields a launcher sets per rank: never written, refused in a file."""
SOURCES = ("file", "flag", "default")
"""Where a setting's value came from, as the start-up lines say."""


class RunFileError(UserError, ValueError):
    """A run file that cannot be read; the message names the file, the table and the key."""


def tables() -> dict[str, tuple[str, type]]:
    """Table name -> (RunConfig attribute, config dataclass), in the order of ``--help``."""
    from pretrain.args import GROUPS, RunConfig

    attrs = {f.type if isinstance(f.type, str) else f.type.__name__: f.name for f in dataclasses.fields(RunConfig)}
    return {title: (attrs[cls.__name__], cls) for title, cls in GROUPS}


def table_keys(cls: type) -> list[str]:
    """The keys a table takes: the flag fields of ``cls`` (for ``[model]`` also ModelConfig's override fields)."""
    from pretrain.args import ModelArgs

    keys = [f.name for f in cli_fields(cls) if f.name not in NOT_IN_FILE]
    if cls is ModelArgs:
        from model.config import ModelConfig

        keys += [f.name for f in override_fields(ModelConfig)]
    return keys


def _nearest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}?" if close else f"the keys are: {', '.join(options)}"


def load(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The file's tables, every table and key checked against RunConfig's fields (values are checked by
    :func:`apply`, as the flags')."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise RunFileError(f"--config {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise RunFileError(f"--config {path}: not valid TOML: {e}") from None
    known = tables()
    for name, body in data.items():
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
            hint = f"did you mean [{close[0]}]?" if close else f"the tables are {', '.join(known)}"
            where = f"table [{name}]" if isinstance(body, dict) else f"top-level key {name!r} (keys go in tables)"
            raise RunFileError(f"{path}: unknown {where}: {hint} (docs/configuration.md)")
        if not isinstance(body, dict):
            raise RunFileError(f"{path}: {name!r} must be a table ([{name}]), got {type(body).__name__}")
        keys = table_keys(known[name][1])
        for key in body:
            if key not in keys:
                elsewhere = [t for t, (_, cls) in known.items() if key in table_keys(cls)]
                hint = f"{key!r} belongs in [{elsewhere[0]}]" if elsewhere else _nearest(key, keys)
                raise RunFileError(f"{path}: [{name}] has no key {key!r}: {hint} (docs/configuration.md)")
    return data


def _actions(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    out: dict[str, list[argparse.Action]] = {}
    for a in parser._actions:
        out.setdefault(a.dest, []).append(a)
    return out


def _convert(value: Any, actions: list[argparse.Action], where: str) -> Any:
    """A TOML value as the flag of ``actions`` would have parsed it, or a RunFileError naming ``where``."""
    a = actions[0]
    if a.nargs == 0:  # a switch (store_true/false/const): a boolean
        if not isinstance(value, bool):
            raise RunFileError(f"{where} must be true or false, got {value!r}")
        return value
    if a.nargs == "+":
        if not isinstance(value, list):
            raise RunFileError(f"{where} must be a list, e.g. [{value!r}]")
        return [_scalar(v, a, where) for v in value]
    return _scalar(value, a, where)


def _scalar(value: Any, a: argparse.Action, where: str) -> Any:
    if isinstance(value, (bool, dict, list)) or (isinstance(value, str) and a.type in (int, float)):
        what = {int: "an integer", float: "a number"}.get(a.type, "a " + getattr(a.type, "__name__", "value"))
        raise RunFileError(f"{where}: {value!r} is not {what}")
    try:
        out = a.type(value if isinstance(value, str) else repr(value)) if a.type else value
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise RunFileError(f"{where}: {value!r} is not valid ({e})") from None
    if a.choices is not None and out not in a.choices:
        raise RunFileError(f"{where} must be one of {', '.join(map(str, a.choices))}, got {out!r}")
    return out


def apply(
    parser: argparse.ArgumentParser,
    ns: argparse.Namespace,
    data: dict[str, dict[str, Any]],
    given: frozenset[str],
    path: str,
) -> tuple[dict[str, str], frozenset[str]]:
    """Put the file's values into ``ns`` where no flag was ``given``. Returns (setting -> 'file' | 'flag' | 'default'
    for every setting, the file's settings that differ from their default): those count as given against a ds_config
    block, as a flag would (a written-out default does not, so a resolved file restarts a run whose block set it)."""
    actions = _actions(parser)
    sources = {}
    for _, cls in tables().values():
        for key in table_keys(cls):
            sources[key] = "flag" if key in given else "default"
    differing = set()
    for table, body in data.items():
        for key, value in body.items():
            v = _convert(value, actions[key], f"{path}: [{table}] {key}")  # checked even where a flag wins
            if key in given:
                continue
            if v != parser.get_default(key):
                differing.add(key)
            setattr(ns, key, v)
            sources[key] = "file"
    return sources, frozenset(differing)


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
