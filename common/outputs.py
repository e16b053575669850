"""The one guard of every command that writes (preprocess, train_tokenizer, merge_shards, convert_checkpoint, the
trainer's saves): bad input never destroys data.

1. An output is never an input, nor a directory that contains an input (:func:`check_not_input`): replacing it would
   delete the input (``convert_checkpoint --load X --to-hf X --overwrite`` deleted every checkpoint of X).
2. Existing outputs are kept unless ``--overwrite`` is given (:func:`check_fresh`).
3. Writes go to a temporary name beside the output and are renamed into place when complete
   (:func:`atomic_file`, :func:`atomic_dir`), so a failed or killed write leaves the old output, or nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from common.errors import UserError, os_error_message


class OutputError(UserError):
    """An output would destroy an input or an existing output; the message names the flag and what to do."""


def _resolved(p: str | os.PathLike) -> Path:
    return Path(os.path.abspath(os.path.expanduser(str(p)))).resolve()


def check_not_input(output: str | os.PathLike, out_flag: str, inputs: Iterable[tuple[str, str | os.PathLike]]) -> None:
    """Refuse ``output`` when it is one of ``inputs`` ((flag, path) pairs) or a directory above one."""
    out = _resolved(output)
    for in_flag, path in inputs:
        if path is None:
            continue
        src = _resolved(path)
        if src == out:
            raise OutputError(
                f"{out_flag} {output} is the input {in_flag} {path}: writing it would destroy the input; "
                f"choose another {out_flag}"
            )
        if out in src.parents:
            raise OutputError(
                f"{out_flag} {output} contains the input {in_flag} {path}: replacing it would destroy the input; "
                f"give {out_flag} a path outside it"
            )


def existing(paths: Iterable[str | os.PathLike]) -> list[str]:
    """The paths that exist (files, or directories that are not empty)."""
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            if any(p.iterdir()):
                out.append(str(p))
        elif p.exists() or p.is_symlink():
            out.append(str(p))
    return out


def check_fresh(paths: Iterable[str | os.PathLike], flag: str, overwrite: bool) -> None:
    """Refuse to replace existing outputs unless ``overwrite``; the message lists them (up to three)."""
    found = existing(paths)
    if found and not overwrite:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise OutputError(f"{flag}: {shown} already exist(s); choose another {flag}, or pass --overwrite to replace")


def check_dir_writable(path: str | os.PathLike, flag: str, create: bool = True, shown: str | None = None) -> None:
    """Write a probe file in directory ``path`` (created with its parents when ``create``; else its nearest
    existing parent is probed), so a read-only destination is refused before any work (one line naming ``flag``),
    not after hours of it. ``shown``: the flag's value to name in the message (default ``path``)."""
    shown = str(path) if shown is None else shown
    try:
        if Path(path).exists() and not Path(path).is_dir():
            raise OutputError(
                f"{flag} {shown}: {path} is a file; give a directory path"
                if shown != str(path)
                else f"{flag} {path} is a file; give a directory path"
            )
        probe_dir = Path(path)
        if create:
            os.makedirs(path, exist_ok=True)
        else:
            while not probe_dir.exists():
                probe_dir = probe_dir.parent
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=probe_dir)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        e.filename = None  # the probe's name would only confuse
        raise OutputError(os_error_message(e, f"{flag} {shown}: cannot write there")) from e


def check_file_writable(path: str | os.PathLike, flag: str) -> None:
    """Refuse an output file path that is a directory (a library would write beside it, or fail after the work)
    and probe its directory (created with its parents), so a read-only destination is one line before any work."""
    if Path(path).is_dir():
        raise OutputError(f"{flag} {path} is a directory; give a file path")
    check_dir_writable(Path(path).parent, flag, shown=str(path))


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; write it; on success it replaces ``path`` in one rename (on failure
    it is removed and ``path`` is untouched)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new empty directory beside ``path``; fill it; on success it takes ``path``'s place (an old ``path``
    is moved aside first and removed only after the rename). On failure the new directory is removed and ``path``
    is untouched. Callers check :func:`check_not_input` and :func:`check_fresh` before."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        old = None
        if path.exists() or path.is_symlink():
            old = path.with_name(f".{path.name}.old{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
