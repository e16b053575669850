"""The one user-error rule of our entry points: a problem the user can fix (a bad flag, a missing, corrupt or
mismatched file, a full disk, a read-only destination) is one line on stderr, ``PROG: error: WHAT (WHICH FILE OR
SETTING); WHAT TO DO``, exit code 2, printed by rank 0 only. The full traceback is printed with ``--debug`` on the
command line or ``SPARSE_BERT_DEBUG=1`` in the environment. Anything else is a bug and keeps its traceback.

This module is the rule's vocabulary, standard library only: :class:`UserError` (each package's error classes,
ArgsError, CheckpointError, IndexedDatasetError, ..., derive from it, so an entry point catches one type), the line,
the exit code, the debug switch, and :func:`os_error_message` / :func:`write_errors`, which turn the operating
system's errors (ENOSPC, EROFS, EACCES, ENOENT, ...) into the same kind of line. :mod:`common.error_exit` applies it
at the top of an entry point (``run_entry``); it asks :mod:`common.launch` which rank prints, and common/launch.py
raises user errors itself, so the two halves are two modules."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from typing import Iterator, Sequence

USER_ERROR_EXIT = 2
"""Exit code of every user error (argparse uses 2 for bad flags too)."""
DEBUG_ENV = "SPARSE_BERT_DEBUG"
DEBUG_FLAG = "--debug"


class UserError(Exception):
    """A problem the user can fix; the message says what is wrong, which file or setting, and what to do."""


def error_line(prog: str, message: str) -> str:
    """The one line a user error prints: ``PROG: error: MESSAGE``."""
    return f"{prog}: error: {message}"


def debug_enabled() -> bool:
    """Whether full tracebacks were asked for (``--debug`` was seen by :func:`take_debug_flag`, or the env var)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def take_debug_flag(argv: Sequence[str] | None) -> list[str]:
    """``argv`` (default ``sys.argv[1:]``) without ``--debug``; seeing it sets ``SPARSE_BERT_DEBUG=1`` (inherited
    by the ranks and workers this process starts)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if DEBUG_FLAG in args:
        args = [a for a in args if a != DEBUG_FLAG]
        os.environ[DEBUG_ENV] = "1"
    return args


_OS_HINTS = {
    errno.ENOSPC: ("no space left on the device", "free space there or choose another destination"),
    errno.EDQUOT: ("disk quota exceeded", "free space there or choose another destination"),
    errno.EROFS: ("read-only file system", "choose a writable destination"),
    errno.EACCES: ("permission denied", "choose a location you may write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "choose a location you may write to, or fix its permissions"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.ENOTDIR: ("a path component is a file, not a directory", "choose a directory path"),
    errno.EISDIR: ("is a directory, a file was expected", "give a file path"),
    errno.EEXIST: ("already exists", "choose another path or remove it"),
}


def os_error_message(e: OSError, what: str = "") -> str:
    """One line for an OSError: ``WHAT: REASON (PATH); WHAT TO DO``. ``what`` names the step or setting (``--save
    runs/x: writing the checkpoint``)."""
    reason, todo = _OS_HINTS.get(e.errno or -1, (e.strerror or str(e), "check the path and the disk"))
    path = e.filename if e.filename is not None else ""
    where = f" ({path})" if path and str(path) not in what else ""
    head = f"{what}: " if what else ""
    return f"{head}{reason}{where}; {todo}"


#: How libraries that wrap a failed write say so: safetensors ("os error 28"), torch's zip writer ("unexpected pos
#: 582912 vs 582804" when the disk filled mid-file, "PytorchStreamWriter failed writing file").
_WRITE_FAILURES = ("No space left", "os error 28", "unexpected pos", "PytorchStreamWriter failed", "Disk quota")


def _free_space(path: str | os.PathLike | None) -> str:
    while path and not os.path.exists(path):
        path = os.path.dirname(os.path.abspath(path))
    try:
        return f" ({shutil.disk_usage(path).free / 2**20:,.1f} MiB free there)" if path else ""
    except OSError:
        return ""


@contextlib.contextmanager
def write_errors(what: str, path: str | os.PathLike | None = None) -> Iterator[None]:
    """Turn a failed write into one :class:`UserError` line starting with ``what`` (``--save runs/x``): an
    OSError by its errno (disk full, read-only, permission), a library's wrapped failure by its message, with the
    free space left at ``path``."""
    try:
        yield
    except UserError:
        raise
    except OSError as e:
        raise UserError(os_error_message(e, what) + _free_space(path if e.errno == errno.ENOSPC else None)) from e
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a failed write
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not any(m in str(e) for m in _WRITE_FAILURES):
            raise
        raise UserError(
            f"{what}: writing failed ({first[:200]}): the disk is full{_free_space(path)}; free space there or "
            "choose another destination"
        ) from e
