"""Command-line flags generated from config dataclasses, so a flag's name, type, default and help text live in one
place: the dataclass field and its docstring.

A field ``lr_warmup_iters: int = 0`` with a docstring becomes ``--lr-warmup-iters`` (type int, default 0, the
docstring as help); a field without a default is a required flag. ``X | None`` fields take X; ``bool`` fields are
switches (``--name`` when the default is False, ``--no-name`` when it is True, both when it is None: None then means
neither was given); ``list[str]`` fields take one or more values. A field's ``metadata["cli"]``
(:func:`cli`) gives another flag name (Megatron's), aliases, choices, or keeps the field off the command line.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib
import inspect
import os
import tomllib
import types
import typing
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

from common.errors import UserError

CLI = "cli"


def cli(
    *,
    flag: str | None = None,
    aliases: Sequence[str] = (),
    choices: Callable[[], Iterable[str]] | None = None,
    skip: bool = False,
    parse: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """``metadata`` for a dataclass field: ``field(default=..., metadata=cli(flag="--kv-channels"))``.

    ``choices`` is a function (evaluated when the parser is built, e.g. the registered kernel names); ``parse`` reads
    the flag's text where the annotation is no single type (``int | str``: a number or ``auto``)."""
    return {CLI: {"flag": flag, "aliases": tuple(aliases), "choices": choices, "skip": skip, "parse": parse}}


@lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass and its bases: {field: text on one line} (read from the source with
    ``ast``, since Python drops them at run time)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(inspect.getsource(importlib.import_module(klass.__module__)))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == klass.__name__:
                body = node.body
                for a, b in zip(body, body[1:]):
                    if (
                        isinstance(a, ast.AnnAssign)
                        and isinstance(a.target, ast.Name)
                        and isinstance(b, ast.Expr)
                        and isinstance(b.value, ast.Constant)
                        and isinstance(b.value.value, str)
                    ):
                        docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _base_type(tp: Any) -> Any:
    """``int | None`` -> int; other annotations unchanged."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def flag_name(f: dataclasses.Field) -> str:
    meta = f.metadata.get(CLI, {})
    if meta.get("flag"):
        return meta["flag"]
    prefix = "--no-" if f.type in (bool, "bool") and f.default is True else "--"
    return prefix + f.name.replace("_", "-")


def cli_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of ``cls`` that are flags."""
    skip = set(getattr(cls, "CLI_SKIP", ()))  # inherited fields a subclass keeps off the command line
    return [f for f in dataclasses.fields(cls) if not f.metadata.get(CLI, {}).get("skip") and f.name not in skip]


def add_flags(group: argparse._ActionsContainer, cls: type, *, help_prefix: str = "") -> None:
    """One flag per field of ``cls`` (see the module docstring)."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in cli_fields(cls):
        meta = f.metadata.get(CLI, {})
        names = [flag_name(f), *meta.get("aliases", ())]
        text = help_prefix + docs.get(f.name, "")
        if not text.strip():
            raise TypeError(f"{cls.__name__}.{f.name} has no docstring: it would be an undocumented flag")
        tp = _base_type(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None if required else f.default
        kw: dict[str, Any] = {"dest": f.name, "help": text.replace("%", "%%")}  # argparse %-formats help
        if tp is bool and default is None and not required:  # bool | None: --name / --no-name, None when neither
            group.add_argument(*names, action="store_const", const=True, default=None, **kw)
            group.add_argument(
                "--no-" + f.name.replace("_", "-"),
                dest=f.name,
                action="store_const",
                const=False,
                help=f"{f.name} = False (see {names[0]})",
            )
            continue
        if tp is bool:
            kw.update(action="store_false" if default is True else "store_true", default=bool(default))
        elif typing.get_origin(tp) is list:
            kw.update(nargs="+", default=default, type=typing.get_args(tp)[0] if typing.get_args(tp) else str)
        else:
            kw.update(type=meta.get("parse") or tp, default=default)
        if required:
            kw.update(required=True)
            kw.pop("default", None)
        if meta.get("choices") is not None:
            kw["choices"] = list(meta["choices"]())
        group.add_argument(*names, **kw)


def override_fields(cls: type) -> list[dataclasses.Field]:
    """Fields of ``cls`` whose ``metadata["cli"]`` names a flag: optional command-line overrides of a config built
    elsewhere (a preset or a JSON file)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get(CLI, {}).get("flag")]


def add_override_flags(group: argparse._ActionsContainer, cls: type, *, source: str) -> None:
    """One flag per :func:`override_fields` field, default None (= keep ``source``'s value); help = the docstring. A
    bool field is a switch setting True, plus its ``negative`` flag setting False when given."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in override_fields(cls):
        meta = f.metadata[CLI]
        text = f"{cls.__name__}.{f.name} (default: {source}): {docs.get(f.name, '')}".replace("%", "%%")
        tp = _base_type(hints[f.name])
        if tp is bool:
            group.add_argument(meta["flag"], dest=f.name, action="store_const", const=True, default=None, help=text)
            if meta.get("negative"):
                group.add_argument(
                    meta["negative"],
                    dest=f.name,
                    action="store_const",
                    const=False,
                    default=None,
                    help=f"{cls.__name__}.{f.name} = False (see {meta['flag']})",
                )
        else:
            group.add_argument(meta["flag"], dest=f.name, type=tp, default=None, help=text)


def overrides(cls: type, ns: argparse.Namespace) -> dict[str, Any]:
    """The :func:`override_fields` values given on the command line."""
    return {f.name: getattr(ns, f.name) for f in override_fields(cls) if getattr(ns, f.name) is not None}


def build(cls: type, ns: argparse.Namespace, **extra: Any) -> Any:
    """``cls`` from the parsed flags of its fields (plus ``extra`` for fields that are not flags)."""
    return cls(**{f.name: getattr(ns, f.name) for f in cli_fields(cls)}, **extra)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each help text; the description keeps its line breaks."""


# -- the same flags from a TOML file (pretrain/run_file.py) --------------------------------------------------
class FileError(UserError, ValueError):
    """A settings file that cannot be read; the message names the file, the table and the key."""


def _nearest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}?" if close else f"the keys are: {', '.join(options)}"


def load_tables(path: str | os.PathLike, known: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """A TOML file of flag values: its tables and keys checked against ``known`` (table -> keys; a key is a flag's
    ``dest``), an unknown one refused naming the file, the table and the nearest name. The values are checked by
    :func:`apply_tables`, as the flags'."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise FileError(f"--config {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise FileError(f"--config {path}: not valid TOML: {e}") from None
    for name, body in data.items():
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
            hint = f"did you mean [{close[0]}]?" if close else f"the tables are {', '.join(known)}"
            where = f"table [{name}]" if isinstance(body, dict) else f"top-level key {name!r} (keys go in tables)"
            raise FileError(f"{path}: unknown {where}: {hint} (docs/configuration.md, 'Run files')")
        if not isinstance(body, dict):
            raise FileError(f"{path}: {name!r} must be a table ([{name}]), got {type(body).__name__}")
        keys = known[name]
        for key in body:
            if key not in keys:
                elsewhere = [t for t, ks in known.items() if key in ks]
                hint = f"{key!r} belongs in [{elsewhere[0]}]" if elsewhere else _nearest(key, keys)
                raise FileError(f"{path}: [{name}] has no key {key!r}: {hint} (docs/configuration.md, 'Run files')")
    return data


def _actions(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    out: dict[str, list[argparse.Action]] = {}
    for a in parser._actions:
        out.setdefault(a.dest, []).append(a)
    return out


def _convert(value: Any, actions: list[argparse.Action], where: str) -> Any:
    """A TOML value as the flag of ``actions`` would have parsed it, or a FileError naming ``where``."""
    a = actions[0]
    if a.nargs == 0:  # a switch (store_true/false/const): a boolean
        if not isinstance(value, bool):
            raise FileError(f"{where} must be true or false, got {value!r}")
        return value
    if a.nargs == "+":
        if not isinstance(value, list):
            raise FileError(f"{where} must be a list, e.g. [{value!r}]")
        return [_scalar(v, a, where) for v in value]
    return _scalar(value, a, where)


def _scalar(value: Any, a: argparse.Action, where: str) -> Any:
    if isinstance(value, (bool, dict, list)) or (isinstance(value, str) and a.type in (int, float)):
        what = {int: "an integer", float: "a number"}.get(a.type, "a " + getattr(a.type, "__name__", "value"))
        raise FileError(f"{where}: {value!r} is not {what}")
    try:
        out = a.type(value if isinstance(value, str) else repr(value)) if a.type else value
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise FileError(f"{where}: {value!r} is not valid ({e})") from None
    if a.choices is not None and out not in a.choices:
        raise FileError(f"{where} must be one of {', '.join(map(str, a.choices))}, got {out!r}")
    return out


def apply_tables(
    parser: argparse.ArgumentParser,
    ns: argparse.Namespace,
    data: dict[str, dict[str, Any]],
    given: frozenset[str],
    path: str | None,
    known: dict[str, list[str]],
) -> tuple[dict[str, str], frozenset[str]]:
    """Put the file's values into ``ns`` where no flag was ``given``. Returns (setting -> 'file' | 'flag' | 'default'
    for every setting, the file's settings that differ from their default): those count as given against a ds_config
    block, as a flag would (a written-out default does not, so a resolved file restarts a run whose block set it)."""
    actions = _actions(parser)
    sources = {}
    for keys in known.values():
        for key in keys:
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
